"""fgd-lookahead's choice is always a feasible placement, whatever the workload and capacity it is given.

The simulator's placer takes the policy's best node and asks ``fit.place`` for the cards; a node the
policy prefers but cannot host would raise ``PlacementMismatchError``. Here random small clusters of
two models take random pod sequences under random target workloads (model-constrained shapes
included) and random ``Context.capacity``, and every placement is checked against the cluster.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.framework import registry
from gpuslice.policy import api
from gpuslice.sim import cluster, engine, trace

pytestmark = pytest.mark.unit

MODELS = ("T4", "G2")
type_sets = st.sampled_from(((), ("T4",), ("G2",), ("G2", "T4")))
pods = st.builds(
    lambda cpu, count, share, types: trace.make_pod(
        "p", cpu, 0, count, (share if count == 1 else 1000) if count else 0, "|".join(types)
    ),
    cpu=st.sampled_from((0, 1000, 4000, 12000)),
    count=st.sampled_from((0, 1, 1, 1, 2, 4)),
    share=st.sampled_from((100, 230, 470, 810, 1000)),
    types=type_sets,
)
shapes = st.builds(
    api.Shape,
    cpu_milli=st.sampled_from((0, 1000, 4000, 12000)),
    share_milli=st.sampled_from((0, 230, 470, 810, 1000)),
    count=st.sampled_from((0, 1, 2)),
    types=type_sets,
).filter(lambda s: (s.count == 0) == (s.share_milli == 0) and (s.count > 0 or not s.types))


@st.composite
def workloads(draw: st.DrawFn) -> api.Workload:
    chosen = draw(st.lists(shapes, min_size=1, max_size=8, unique=True))
    weights = draw(st.lists(st.integers(1, 20), min_size=len(chosen), max_size=len(chosen)))
    return api.Workload(tuple(chosen), tuple(w / sum(weights) for w in weights))


@settings(max_examples=150, deadline=None)
@given(
    node_specs=st.lists(
        st.tuples(st.sampled_from(MODELS), st.sampled_from((1, 2, 4, 8)), st.sampled_from((8000, 32000))),
        min_size=1,
        max_size=6,
    ),
    seq=st.lists(pods, min_size=1, max_size=40),
    workload=workloads(),
    capacity=st.one_of(
        st.just(()),
        st.tuples(st.integers(1, 64), st.integers(1, 64)).map(lambda c: (("G2", c[0]), ("T4", c[1]))),
    ),
)
def test_every_choice_is_a_feasible_placement(
    node_specs: list[tuple[str, int, int]],
    seq: list[trace.TracePod],
    workload: api.Workload,
    capacity: tuple[tuple[str, int], ...],
) -> None:
    inventories = [
        trace.node_inventory(f"n{i}", cpu, 1 << 20, gpus, model)
        for i, (model, gpus, cpu) in enumerate(node_specs)
    ]
    live = cluster.Cluster(inventories)
    ctx = api.Context(workload=workload, capacity=capacity, rng=np.random.default_rng(0))
    placer = engine.Placer(live, registry.get("fgd-lookahead"), ctx)
    for pod in seq:
        feasible = live.feasible(pod).tolist()
        before = live.free.copy()
        got = placer.place(pod)  # raises PlacementMismatchError if the chosen node cannot host it
        if not feasible:
            assert got is None
            continue
        assert got is not None
        j, alloc = got
        assert j in feasible
        # the cards taken exist on that node, have the model the pod allows and had room for it
        taken = [c for c in range(live.free.shape[1]) if live.free[j, c] != before[j, c]]
        assert len(taken) == pod.count
        for c in taken:
            assert before[j, c] - live.free[j, c] == pod.share
        if pod.types and pod.count:  # a CPU-only pod's model list constrains nothing (as in the trace)
            assert inventories[j].model in pod.types
        assert live.cpu_free[j] >= 0 and (live.free[j] >= -1).all()
        assert alloc.cpu_milli == pod.cpu_milli
