"""The simulator's half of the fidelity check: slice, manifests, online workload, comparison."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from gpuslice import cli
from gpuslice.cache import shapes
from gpuslice.codec import resources
from gpuslice.framework import registry
from gpuslice.model import config as model_config
from gpuslice.policy import api, shares
from gpuslice.sim import cluster, engine, experiment, fidelity, trace
from gpuslice_dev import nodesim

pytestmark = pytest.mark.unit

IMMEDIATE = model_config.WorkloadSettings(min_count=1, drift=0.0)
"""Trust the first request and snapshot after every one (the workload changes at every pod)."""


@pytest.fixture(scope="module")
def small() -> fidelity.Slice:
    return fidelity.make_slice(8, 7)


def test_slice_is_deterministic_gpu_only_and_ranked_by_name(small: fidelity.Slice) -> None:
    again = fidelity.make_slice(8, 7)
    assert [p.name for p in again.pods] == [p.name for p in small.pods]
    assert [n.name for n in again.nodes] == [n.name for n in small.nodes]
    names = [n.name for n in small.nodes]
    assert names == sorted(names) and len(set(names)) == 8
    assert all(len(n.devices) >= 4 for n in small.nodes)
    assert all(p.count > 0 for p in small.pods)
    assert small.demand_milli <= small.capacity_milli  # tune 1.0: cut to capacity
    assert [p.name for p in fidelity.make_slice(8, 8).pods] != [p.name for p in small.pods]
    assert len(fidelity.make_slice(8, 7, pod_limit=10).pods) == 10


def test_manifest_parses_to_the_simulators_request(small: fidelity.Slice) -> None:
    pods = [
        *small.pods[:20],
        trace.make_pod("typed", 3000, 0, 2, 1000, "G2|T4"),
        trace.make_pod("share", 100, 512, 1, 470, "V100M32"),
    ]
    for k, pod in enumerate(pods):
        manifest = fidelity.pod_manifest(pod, f"p{k}")
        assert manifest["spec"]["schedulerName"] == fidelity.SCHEDULER_NAME
        parsed = resources.parse_pod(manifest)
        assert parsed.containers == pod.request.containers
        assert parsed.selectors.use_types == pod.request.selectors.use_types
        assert (parsed.cpu_milli, parsed.memory_mib) == (pod.cpu_milli, pod.memory_mib)
        assert shares.demand(parsed) == shares.demand(pod.request)


def test_node_specs_register_the_simulators_cards(small: fidelity.Slice) -> None:
    specs = fidelity.node_specs(small)
    assert list(specs) == [n.name for n in small.nodes]
    for inv in small.nodes:
        spec = specs[inv.name]
        registered = nodesim.cards(
            inv.name,
            model=spec["model"],
            count=spec["count"],
            memory_mib=spec["memory_mib"],
            split_count=spec["split_count"],
            cores=spec["cores"],
        )
        strip = [(d.index, d.type, d.memory_mib, d.cores, d.split_count) for d in registered]
        assert strip == [(d.index, d.type, d.memory_mib, d.cores, d.split_count) for d in inv.devices]
        assert spec["cpu"] == f"{inv.cpu_milli}m" and spec["memory"] == f"{inv.memory_mib}Mi"


@pytest.mark.parametrize("policy", ["fgd", "fgd-lookahead", "binpack"])
def test_online_scores_are_never_stale(
    policy: str, small: fidelity.Slice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every choice of the cached scorer equals a fresh scorer's under the workload of that moment."""
    live = cluster.Cluster(small.nodes)
    placer = engine.Placer(live, registry.get(policy), api.Context(), shapes.ShapeHistogram(IMMEDIATE))
    cached_best = placer.scorer.best
    checked = []

    def best(pod: trace.TracePod, cand: np.ndarray) -> int:
        fresh = engine.Scorer(registry.get(policy), placer.scorer.ctx, live).best(pod, cand)
        got = cached_best(pod, cand)
        assert got == fresh
        checked.append(got)
        return got

    monkeypatch.setattr(placer.scorer, "best", best)
    for pod in small.pods:
        placer.place(pod)
    assert len(checked) > len(small.pods) // 2


def test_online_workload_observes_each_gpu_pod_before_scoring() -> None:
    inventories = [trace.node_inventory(f"n{i}", 8000, 65536, 2, "T4") for i in range(2)]
    live = cluster.Cluster(inventories)
    placer = engine.Placer(live, registry.get("fgd"), api.Context(), shapes.ShapeHistogram(IMMEDIATE))
    a = trace.make_pod("a", 1000, 0, 1, 470)
    assert placer.place(a) is not None
    assert placer.ctx.workload is not None
    assert list(placer.ctx.workload.shapes) == [shares.shape_of(shares.demand(a.request))]
    placer.place(trace.make_pod("huge", 64000, 0, 1, 470))  # no node has the CPU: the filter is not asked
    assert len(list(placer.ctx.workload.shapes)) == 1
    # a pod without GPUs is observed as the extender's pod feed observes it: (CPU, 0, 0)
    placer.place(trace.make_pod("cpu", 1500, 0, 0, 0))
    assert api.Shape(cpu_milli=1500, share_milli=0, count=0) in placer.ctx.workload.shapes
    assert len(list(placer.ctx.workload.shapes)) == 2
    b = trace.make_pod("b", 2000, 0, 1, 1000)
    placer.place(b)
    assert len(list(placer.ctx.workload.shapes)) == 3


def test_same_workload_keeps_cached_scores() -> None:
    inventories = [trace.node_inventory(f"n{i}", 8000, 65536, 2, "T4") for i in range(3)]
    live = cluster.Cluster(inventories)
    pod = trace.make_pod("a", 1000, 0, 1, 470)
    hist = shapes.ShapeHistogram(IMMEDIATE)
    hist.observe(shares.shape_of(shares.demand(pod.request)))
    scorer = engine.Scorer(registry.get("fgd"), api.Context(workload=hist.workload()), live)
    cand = live.feasible(pod)
    scorer.best(pod, cand)
    assert scorer.calls == 3
    scorer.set_context(api.Context(workload=hist.workload()))
    scorer.best(pod, cand)
    assert scorer.calls == 3
    hist.observe(shares.shape_of(shares.demand(trace.make_pod("b", 1000, 0, 1, 1000).request)))
    scorer.set_context(api.Context(workload=hist.workload()))
    scorer.best(pod, cand)
    assert scorer.calls == 6


def _run(policy: str, placements: list[fidelity.Placement | None], sl: fidelity.Slice) -> fidelity.Run:
    return fidelity.tally(sl, policy, placements, 0.0)


def test_compare_counts_agreement_and_first_divergence(small: fidelity.Slice) -> None:
    sim = fidelity.simulate(small, "binpack")
    assert sim.failed == sum(1 for p in sim.placements if p is None)
    placed = sum(p.gpu_milli for p, at in zip(small.pods, sim.placements, strict=True) if at)
    assert sim.unallocated_pct == pytest.approx(100 * (1 - placed / small.capacity_milli))
    same = fidelity.compare(sim, _run("binpack", list(sim.placements), small))
    assert (same.node_agreement, same.card_agreement, same.delta_pp, same.first_divergence) == (1, 1, 0, None)
    other = list(sim.placements)
    k = next(i for i, p in enumerate(other) if p is not None)
    first = other[k]
    assert first is not None
    other[k] = dataclasses.replace(first, cards=tuple(c + 1 for c in first.cards))  # same node, other cards
    other[k + 1] = fidelity.Placement("elsewhere", (0,))
    j = len(other) - 1
    other[j] = None
    cmp = fidelity.compare(sim, _run("binpack", other, small))
    moved = 1 + int(sim.placements[j] is not None)
    assert cmp.same_node == cmp.pods - moved
    assert cmp.same_cards == cmp.pods - moved - 1
    assert cmp.first_divergence is not None and cmp.first_divergence[0] == k + 1
    assert cmp.first_divergence[2] == "elsewhere"
    assert cmp.delta_pp == pytest.approx(
        100 * (small.pods[j].gpu_milli if sim.placements[j] else 0) / small.capacity_milli
    )
    assert cmp.as_json()["first_divergence"] == {
        "pod_index": k + 1,
        "sim_node": cmp.first_divergence[1],
        "e2e_node": "elsewhere",
    }


def test_experiment_online_workload_runs_and_is_labelled() -> None:
    nodes = trace.data_path(trace.DEFAULT_NODES)
    pods = trace.data_path(trace.DEFAULT_PODS)
    job = experiment.Job("binpack", 1, nodes, pods, tune=0.02, workload="online")
    result = experiment.run_job(job)
    assert result.as_json()["workload"] == "online"
    assert "workload" not in experiment.run_job(dataclasses.replace(job, workload="oracle")).as_json()
    with pytest.raises(ValueError, match="unknown workload"):
        experiment.run_job(dataclasses.replace(job, workload="psychic"))


NODES_CSV = """sn,cpu_milli,memory_mib,gpu,model
n0,32000,131072,2,T4
n1,64000,262144,4,G2
"""

PODS_CSV = """name,cpu_milli,memory_mib,num_gpu,gpu_milli
p0,4000,8192,1,1000
p1,2000,4096,1,470
p2,2000,4096,1,470
p3,3000,4096,1,810
"""


def test_simulate_cli_workload_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "n.csv").write_text(NODES_CSV)
    (tmp_path / "p.csv").write_text(PODS_CSV)
    files = ["--nodes", str(tmp_path / "n.csv"), "--pods", str(tmp_path / "p.csv")]
    code = cli.main(["simulate", *files, "--policy", "fgd", "--workload", "online", "--json", "--jobs", "1"])
    assert code == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert record["workload"] == "online" and record["pods_arrived"] > 4
    # online replay is supported; this trace has no times, which is the error
    assert cli.main(["simulate", *files, "--workload", "online", "--replay"]) == 2
    assert "no creation_time column" in capsys.readouterr().err
