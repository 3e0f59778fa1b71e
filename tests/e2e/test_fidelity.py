"""Placement fidelity, small: a trace slice through kube-scheduler + gpuslice serve matches the simulator.

12 trace nodes (88 GPUs) and the 106 GPU pods that bring arrived demand to their capacity (seed 42;
``sim.fidelity`` says how the slice is drawn), one pod at a time, with ``--node-choice extender`` and
the target workload handed over on every filter (``--workload-period-s 0``); the simulator replays
the same pods with the extender's online workload. ``bench/bench_fidelity.py`` runs the full size.

This tier uses its own control plane: the fake nodes must be the slice's alone (the session
cluster's nodes would be candidates the simulator does not have, and its pods could land here).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.sim import fidelity
from gpuslice_dev import fidelity as cluster_fidelity

pytestmark = pytest.mark.e2e

NODES = 12
SEED = 42
NODE_CHOICE = "extender"
WORKLOAD_PERIOD_S = 0.0
MAX_DELTA_PP = 0.3
MIN_AGREEMENT = 0.95


@pytest.fixture(scope="module")
def fidelity_slice() -> fidelity.Slice:
    return fidelity.make_slice(NODES, SEED)


@pytest.fixture(scope="module")
def fidelity_cluster(
    fidelity_slice: fidelity.Slice, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[cluster_fidelity.FidelityCluster]:
    work: Path = tmp_path_factory.mktemp("fidelity")
    with cluster_fidelity.FidelityCluster(fidelity.node_specs(fidelity_slice), workdir=work) as cl:
        yield cl


def test_slice_is_near_full_and_names_follow_rank(fidelity_slice: fidelity.Slice) -> None:
    names = [inv.name for inv in fidelity_slice.nodes]
    assert names == sorted(names)
    assert 100 <= len(fidelity_slice.pods) <= 150
    assert (
        0.97 * fidelity_slice.capacity_milli <= fidelity_slice.demand_milli <= fidelity_slice.capacity_milli
    )


@pytest.mark.parametrize("policy", ["binpack", "fgd-lookahead"])
def test_cluster_places_pods_where_the_simulator_does(
    policy: str, fidelity_slice: fidelity.Slice, fidelity_cluster: cluster_fidelity.FidelityCluster
) -> None:
    sim = fidelity.simulate(fidelity_slice, policy, "online")
    assert 0 < sim.failed < len(fidelity_slice.pods) // 5  # the slice ends full: some pods do not fit
    got = fidelity_cluster.run(
        fidelity.pod_manifests(fidelity_slice, cluster_fidelity.SCHEDULER),
        cluster_fidelity.serve_flags(policy, NODE_CHOICE, WORKLOAD_PERIOD_S),
        cluster_fidelity.render_flags(NODE_CHOICE),
    )
    assert got.timeouts == 0 and got.errors == 0, got.log.read_text()[-4000:]
    e2e = fidelity.tally(fidelity_slice, policy, fidelity.placements_from(got.placements), got.seconds)
    cmp = fidelity.compare(sim, e2e)
    summary = json.dumps(cmp.as_json())
    assert cmp.node_agreement >= MIN_AGREEMENT, summary
    assert abs(cmp.delta_pp) <= MAX_DELTA_PP, summary
