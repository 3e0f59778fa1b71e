"""Gangs in the simulator: all-or-nothing from the engine's state, refusals change nothing, seeds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpuslice import cli
from gpuslice.framework import gangs as framework_gangs
from gpuslice.framework import registry
from gpuslice.model import nodes
from gpuslice.policy import api
from gpuslice.sim import cluster, engine, gangsim, loadscale, replay, trace, workload

pytestmark = pytest.mark.unit

SHARES = (100, 250, 470, 500, 810, 1000)


def _inventories(count: int = 6) -> list[nodes.NodeInventory]:
    """Nodes in rank order, named against it (the extender's name tie-break would pick the last)."""
    models = ("G2", "T4", "P100")
    return [
        trace.node_inventory(f"n{count - j}", 32000, 131072, (2, 4, 8)[j % 3], models[j % 3])
        for j in range(count)
    ]


def _pods(count: int, seed: int) -> list[trace.TracePod]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        kind = int(rng.integers(4))
        if kind == 0:
            out.append(trace.make_pod(f"p{k:03d}", 2000, 4096, 0, 0))
        elif kind == 1:
            out.append(trace.make_pod(f"p{k:03d}", 4000, 8192, int(rng.choice((1, 2, 4))), 1000))
        else:
            out.append(trace.make_pod(f"p{k:03d}", 2000, 4096, 1, int(rng.choice(SHARES))))
    return out


def _ctx(pods: list[trace.TracePod], inventories: list[nodes.NodeInventory]) -> api.Context:
    return api.Context(
        workload=workload.histogram(pods),
        capacity=api.model_capacity(d.type for inv in inventories for d in inv.devices),
    )


def _run(policy: str, seed: int, planner: str, sizes: tuple[int, int] = (2, 5)) -> gangsim.GangOutcome:
    inventories = _inventories()
    pods = _pods(80, seed)
    seq = np.random.default_rng(seed).permutation(len(pods))
    gangs = gangsim.generated(pods, seq, sizes, seed)
    return gangsim.run(
        inventories, pods, seq, gangs, registry.get(policy), _ctx(pods, inventories), None, planner
    )


def _rebuilt(out: gangsim.GangOutcome) -> cluster.Cluster:
    """A fresh cluster with every recorded placement committed."""
    fresh = cluster.Cluster(gangsim.rank_named(_inventories()))
    for j, alloc in out.placements.values():
        fresh.commit(j, alloc, "")
    return fresh


@pytest.mark.parametrize("planner", gangsim.PLANNERS)
@pytest.mark.parametrize("policy", ["binpack", "fgd"])
def test_no_gang_is_partly_placed(policy: str, planner: str) -> None:
    out = _run(policy, 3, planner)
    assert out.stats.placed > 0 and out.stats.rejected > 0  # the scenario tests both sides
    failed = set(out.outcome.failed)
    for gang in out.gangs:
        placed = [k in out.placements for k in gang]
        assert all(placed) or not any(placed), gang
        assert all(k in failed for k in gang) == (not any(placed))
    # The engine's cluster holds exactly the recorded placements: nothing of a refused gang is left.
    seq = np.random.default_rng(3).permutation(80)
    pods = _pods(80, 3)
    demand = sum(pods[int(seq[k])].gpu_milli for k in out.placements)
    assert out.live.used_milli() == demand == int(out.outcome.used[-1])
    fresh = _rebuilt(out)
    assert np.array_equal(fresh.free, out.live.free)
    assert np.array_equal(fresh.cpu_free, out.live.cpu_free)
    assert (
        out.stats.members_placed + sum(len(g) for g in out.gangs if g[0] in failed)
        == out.stats.members_offered
    )


@pytest.mark.parametrize("planner", gangsim.PLANNERS)
def test_a_gang_that_does_not_fit_changes_nothing(planner: str) -> None:
    inventories = [trace.node_inventory(f"n{j}", 32000, 131072, 2, "G2") for j in range(2)]
    live = cluster.Cluster(inventories)
    placer = engine.Placer(live, registry.get("binpack"), api.EMPTY_CONTEXT)
    assert placer.place(trace.make_pod("x", 1000, 1024, 1, 470)) is not None
    before = (list(live.states), live.free.copy(), live.cpu_free.copy(), live.mem_free.copy())
    gang = [trace.make_pod(f"g{k}", 1000, 1024, 1, 1000) for k in range(3)] + [
        trace.make_pod("big", 1000, 1024, 2, 1000)
    ]
    got = gangsim.GangPlacer(placer, planner).place(gang)
    assert isinstance(got, framework_gangs.Short)
    assert got.wanted == 4
    assert live.states == before[0]
    assert np.array_equal(live.free, before[1])
    assert np.array_equal(live.cpu_free, before[2]) and np.array_equal(live.mem_free, before[3])
    # Three of the four fit: a gang of three is placed whole.
    placed = gangsim.GangPlacer(placer, planner).place(gang[:3])
    assert not isinstance(placed, framework_gangs.Short) and len(placed) == 3
    assert live.used_milli() == 470 + 3000


@pytest.mark.parametrize("policy", ["binpack", "fgd", "bestfit"])
def test_the_planners_place_alike(policy: str) -> None:
    a = _run(policy, 5, "place_all")
    b = _run(policy, 5, "trial")
    assert a.placements == b.placements
    assert a.stats == b.stats


def test_same_seed_same_result() -> None:
    a, b = _run("fgd", 7, "place_all"), _run("fgd", 7, "place_all")
    assert a.gangs == b.gangs and a.placements == b.placements and a.stats == b.stats
    assert np.array_equal(a.outcome.used, b.outcome.used)
    assert _run("fgd", 8, "place_all").gangs != a.gangs


def test_generated_gangs() -> None:
    pods = _pods(200, 1)
    seq = np.random.default_rng(1).permutation(len(pods))
    gangs = gangsim.generated(pods, seq, (2, 6), 1)
    flat = [k for g in gangs for k in g]
    gpu = [k for k, i in enumerate(seq.tolist()) if pods[i].count > 0]
    assert flat == gpu  # every GPU arrival once, consecutive, in order; CPU-only pods alone
    assert all(2 <= len(g) <= 6 for g in gangs[:-1]) and 1 <= len(gangs[-1]) <= 6
    assert {len(g) for g in gangs} >= {2, 6}


def test_trace_gangs_by_job_and_copy() -> None:
    pods = [
        trace.make_pod("a0", 1000, 0, 1, 1000, job="a"),
        trace.make_pod("a1", 1000, 0, 1, 1000, job="a"),
        trace.make_pod("s", 1000, 0, 1, 1000),
        trace.make_pod("b0", 1000, 0, 1, 500, job="b"),
    ]
    seq = np.array([0, 2, 3, 1, 0, 1, 0])
    assert gangsim.by_job(pods, seq) == [[0, 3], [2], [4, 5], [6]]
    with pytest.raises(gangsim.GangError):
        gangsim.groups(gangsim.GangSpec("trace"), pods[2:3], seq[:1], 1)


def test_parse_sizes() -> None:
    assert gangsim.parse_sizes("2-16") == (2, 16)
    assert gangsim.parse_sizes("8") == (8, 8)
    for bad in ("0-4", "5-3", "x", "2-"):
        with pytest.raises(gangsim.GangError):
            gangsim.parse_sizes(bad)


NODES = """sn,cpu_milli,memory_mib,gpu,model
n0,32000,131072,2,T4
n1,64000,262144,4,G2
n2,64000,262144,8,G2
"""

PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,job
p0,4000,8192,1,1000,j1
p1,2000,4096,1,470,j1
p2,2000,4096,1,470,
p3,16000,16384,0,0,
p4,8000,8192,2,1000,j2
p5,3000,4096,1,810,j2
p6,12000,8192,1,1000,j2
"""


@pytest.mark.parametrize("mode", ["trace", "generated"])
def test_cli_gangs(tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    argv = ["simulate", "--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv")]
    argv += ["--policy", "binpack", "--seeds", "1", "--json", "--jobs", "1"]
    assert cli.main(argv) == 0
    off = json.loads(capsys.readouterr().out)
    assert "gangs" not in off[0]
    assert cli.main([*argv, "--gangs", mode, "--gang-sizes", "2-3"]) == 0
    on = json.loads(capsys.readouterr().out)[0]
    g = on["gangs"]
    assert g["mode"] == mode and g["offered"] == g["placed"] + g["rejected"] > 0
    assert on["gpu_demand_placed"] >= g["gpu_demand_placed"]
    assert on["unallocated_gpu_pct"].keys() == off[0]["unallocated_gpu_pct"].keys()


def test_cli_trace_gangs_need_jobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,0,1,1000\n")
    argv = ["simulate", "--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv")]
    assert cli.main([*argv, "--gangs", "trace", "--json"]) == 2
    assert "no job column" in capsys.readouterr().err
    assert cli.main([*argv, "--gangs", "trace", "--replay"]) == 2


@pytest.mark.parametrize("planner", gangsim.PLANNERS)
def test_replay_gang_waits_whole_and_every_member_leaves(planner: str) -> None:
    pods = [trace.make_pod("a", 1000, 0, 1, 1000), trace.make_pod("b", 1000, 0, 1, 1000)]
    sched = loadscale.Schedule(
        pod=np.array([0, 1, 1], np.int64),
        arrival=np.array([0.0, 1.0, 2.0]),
        duration=np.array([10.0, 5.0, 7.0]),
        window=(0.0, 30.0),
    )
    inv = [trace.node_inventory("n0", 16000, 65536, 2, "T4")]
    ctx = _ctx(pods, inv)
    out = replay.run(inv, pods, sched, registry.get("binpack"), ctx, gangs=[[1, 2]], planner=planner)
    # One card is free from t=2 to t=10: the gang of two waits for both, then runs 5 and 7 s.
    assert out.gang_stats == gangsim.GangStats(
        offered=1, placed=1, rejected=0, members_offered=2, members_placed=2,
        demand_offered_milli=2000, demand_placed_milli=2000, singles=1,
    )  # fmt: skip
    assert out.waits.tolist() == [0.0, 9.0, 8.0]
    area = 1000 * 10 + 2000 * 5 + 1000 * 2  # a alone, then both members, then the longer one
    assert out.unallocated_pct == pytest.approx(100 * (1 - area / (2000 * 30)))
    assert out.sample_alloc[-1] == 0.0  # every member left
    assert out.queued_time_pct == pytest.approx(100 * 8 / 30)  # the gang waited from t=2 to t=10


def test_replay_cli_gangs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    rows = [f"p{k},2000,4096,{1 + k % 2},{1000 if k % 3 else 500},{k * 10},{k * 10 + 200}" for k in range(30)]
    (tmp_path / "pods.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n" + "\n".join(rows) + "\n"
    )
    argv = ["simulate", "--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv")]
    argv += ["--replay", "--policy", "binpack", "--seeds", "1", "--load", "0.9", "--json", "--jobs", "1"]
    assert cli.main(argv) == 0
    assert "gangs" not in json.loads(capsys.readouterr().out)[0]
    assert cli.main([*argv, "--gangs", "generated", "--gang-sizes", "2-4"]) == 0
    g = json.loads(capsys.readouterr().out)[0]["gangs"]
    assert g["mode"] == "generated" and g["offered"] > 0
    assert g["placed"] + g["rejected"] <= g["offered"]
