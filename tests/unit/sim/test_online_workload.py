"""The simulator's online target workload: fallback while untrusted, snapshots, column scoring, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice import cli
from gpuslice.cache import shapes
from gpuslice.framework import registry
from gpuslice.model import config as model_config
from gpuslice.policy import api, shares
from gpuslice.sim import cluster, engine, experiment, fidelity, trace, workload

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def small() -> fidelity.Slice:
    return fidelity.make_slice(8, 7)


Placed = list[tuple[int, object] | None]


def places(sl: fidelity.Slice, policy: str, hist: shapes.ShapeHistogram | None) -> Placed:
    placer = engine.Placer(cluster.Cluster(sl.nodes), registry.get(policy), api.Context(), hist)
    out: Placed = []
    for pod in sl.pods:
        got = placer.place(pod)
        out.append(None if got is None else (got[0], got[1].containers))
    return out


def test_untrusted_learning_policy_places_as_the_fallback(small: fidelity.Slice) -> None:
    # min_count above the slice's pod count: the histogram is never trusted, so fgd places every
    # pod (node and cards) exactly as bestfit does
    never = model_config.WorkloadSettings(min_count=10_000, fallback="bestfit")
    got = places(small, "fgd", shapes.ShapeHistogram(never))
    assert got == places(small, "bestfit", None)
    assert got != places(small, "fgd", None)  # the two policies do part on this slice


def test_fallback_pod_keeps_the_policy_without_a_workload(small: fidelity.Slice) -> None:
    # "pod": fgd measures against each pod's own shape, as with no workload at all
    never = model_config.WorkloadSettings(min_count=10_000, fallback=model_config.WORKLOAD_FALLBACK_POD)
    assert places(small, "fgd", shapes.ShapeHistogram(never)) == places(small, "fgd", None)


def trusted(placer: engine.Placer) -> bool:
    return placer.ctx.workload is not None


def test_fallback_only_until_trusted(small: fidelity.Slice) -> None:
    s = model_config.WorkloadSettings(min_count=5, fallback="bestfit", drift=0.0)
    live = cluster.Cluster(small.nodes)
    placer = engine.Placer(live, registry.get("fgd-lookahead"), api.Context(), shapes.ShapeHistogram(s))
    for pod in small.pods[:4]:
        assert placer.place(pod) is not None
    # each pod is observed before it is scored: the 4th was scored with 4 < 5 requests seen
    assert placer.fallback_pods == 4 and not trusted(placer)
    assert placer.current()[0].name == "bestfit"
    placer.place(small.pods[4])  # the 5th request makes the histogram trusted before it is scored
    assert placer.fallback_pods == 4 and trusted(placer)
    assert placer.current()[0].name == "fgd-lookahead"
    # a policy that does not learn the workload is never replaced
    other = engine.Placer(live, registry.get("binpack"), api.Context(), shapes.ShapeHistogram(s))
    assert other.fallback is None and other.current()[0].name == "binpack"


def test_snapshot_keeps_the_context_workload_object(small: fidelity.Slice) -> None:
    s = model_config.WorkloadSettings(min_count=1, drift=0.5)
    hist = shapes.ShapeHistogram(s)
    placer = engine.Placer(cluster.Cluster(small.nodes), registry.get("fgd"), api.Context(), hist)
    workloads = []
    for pod in small.pods:
        placer.place(pod)
        workloads.append(placer.ctx.workload)
    # each context workload is the histogram's snapshot object of that moment, and there are as
    # many distinct ones as snapshots were taken
    assert workloads[-1] is hist.workload()
    assert len({id(w) for w in workloads}) == hist.snapshots < len(small.pods)


@pytest.fixture(scope="module")
def mixed() -> fidelity.Slice:
    """12 trace nodes and 150 trace pods, CPU-only ones included (the fidelity slices have none)."""
    nodes = tuple(trace.load_nodes(trace.data_path(trace.DEFAULT_NODES))[::100][:12])
    pods = workload.sorted_by_name(trace.load_pods(trace.data_path(trace.DEFAULT_PODS)))
    picked = tuple(pods[::50][:150])
    assert any(p.count == 0 for p in picked) and any(p.count > 1 for p in picked)
    return fidelity.Slice(nodes, tuple(n.name for n in nodes), picked, 0, 1.0)


@pytest.mark.parametrize("policy", sorted(registry.names()))
@pytest.mark.parametrize("which", ["small", "mixed"])
def test_column_scoring_places_as_node_by_node(
    policy: str, which: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scoring stale nodes in one column pass changes no placement (``VECTOR_MIN`` 1 vs never)."""
    sl: fidelity.Slice = request.getfixturevalue(which)
    s = model_config.WorkloadSettings(min_count=3, drift=0.01)
    monkeypatch.setattr(engine, "VECTOR_MIN", 10**9)
    each = places(sl, policy, shapes.ShapeHistogram(s))
    monkeypatch.setattr(engine, "VECTOR_MIN", 1)
    monkeypatch.setattr(engine, "ADAPTIVE", False)  # the column pass whatever it costs
    assert places(sl, policy, shapes.ShapeHistogram(s)) == each
    assert sum(p is not None for p in each) > len(sl.pods) // 3


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    min_count=st.integers(0, 40),
    policy=st.sampled_from(["fgd", "fgd-lookahead"]),
    fallback=st.sampled_from(["bestfit", "binpack", "random", "pod"]),
)
def test_every_choice_is_a_feasible_placement(seed: int, min_count: int, policy: str, fallback: str) -> None:
    """Whatever the settings, the chosen node is feasible and its allocation fits the node."""
    sl = fidelity.make_slice(4, seed % 50, pod_limit=60)
    hist = shapes.ShapeHistogram(model_config.WorkloadSettings(min_count=min_count, fallback=fallback))
    live = cluster.Cluster(sl.nodes)
    placer = engine.Placer(live, registry.get(policy), api.Context(rng=np.random.default_rng(seed)), hist)
    for pod in sl.pods:
        cand = live.feasible(pod).tolist()
        got = placer.place(pod)
        assert (got is None) == (not cand)
        if got is not None:
            j, alloc = got
            assert j in cand and alloc.node == live.states[j].name
            # committed: no card, CPU or memory of the node is overdrawn
            assert live.cpu_free[j] >= 0 and live.mem_free[j] >= 0
            assert all(f >= 0 for f in shares.free_milli(live.states[j]))


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


def test_simulate_takes_the_workload_flags_and_records_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "n.csv").write_text(NODES_CSV)
    (tmp_path / "p.csv").write_text(PODS_CSV)
    files = ["--nodes", str(tmp_path / "n.csv"), "--pods", str(tmp_path / "p.csv")]
    flags = ["--workload-decay", "0.9", "--workload-window", "5", "--workload-min-count", "2"]
    flags += ["--workload-fallback", "binpack", "--workload-drift", "0.1"]
    argv = ["simulate", *files, "--policy", "fgd", "--workload", "online", "--json", "--jobs", "1"]
    assert cli.main([*argv, *flags]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert record["workload_settings"] == {
        "decay": 0.9,
        "window": 5,
        "min_count": 2,
        "fallback": "binpack",
        "drift": 0.1,
    }
    assert record["fallback_pods"] >= 1 and record["workload_snapshots"] >= 1
    assert cli.main([*argv, "--workload-fallback", "nope"]) == 2
    assert "workload_fallback: unknown policy 'nope'" in capsys.readouterr().err
    assert cli.main([*argv, "--workload-window", "-1"]) == 2
    assert "workload_window" in capsys.readouterr().err


def test_oracle_record_has_no_workload_settings(tmp_path: Path) -> None:
    (tmp_path / "n.csv").write_text(NODES_CSV)
    (tmp_path / "p.csv").write_text(PODS_CSV)
    job = experiment.Job("fgd", 1, tmp_path / "n.csv", tmp_path / "p.csv", tune=0.5)
    assert "workload_settings" not in experiment.run_job(job).as_json()
    with pytest.raises(model_config.WorkloadSettingError, match="workload_fallback"):
        bad = model_config.WorkloadSettings(fallback="nope")
        experiment.run_job(experiment.Job("fgd", 1, job.nodes, job.pods, 0.5, "online", bad))
