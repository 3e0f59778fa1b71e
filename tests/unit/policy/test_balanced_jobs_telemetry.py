"""balanced: task affinity by job (owner or label) and telemetry older than the limit counting as absent.

Both the node-by-node score (``score_node``) and the vectorised one (``score_columns``) are
checked, and they must agree to the last bit.
"""

from __future__ import annotations

import dataclasses

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.cache import snapshot
from gpuslice.framework import registry
from gpuslice.model import nodes, topology
from gpuslice.policy import api, balanced, columns, fit, thermal
from tests.unit.builders import bridged, node, pod, uuid

pytestmark = pytest.mark.unit

POLICY = registry.get("balanced")
JOB = "owner:u-train"


def with_jobs(state: nodes.NodeState, *js: nodes.JobOnNode) -> nodes.NodeState:
    return msgspec.structs.replace(state, jobs=js)


def ctx_for(states: dict[str, nodes.NodeState], job: str = JOB) -> api.Context:
    index = snapshot.job_index(states)
    return dataclasses.replace(api.EMPTY_CONTEXT, job=job, job_nodes=index.get(job, api.NO_JOB_NODES))


def both(states: dict[str, nodes.NodeState], p: object, ctx: api.Context) -> dict[str, int]:
    """score_node of every node, after checking score_columns agrees."""
    slow = {n: POLICY.score_node(s, p, ctx).score for n, s in states.items()}  # type: ignore[arg-type]
    cols = columns.build(list(states.values()))
    names = list(states)
    fast = POLICY.policy.score_columns(cols, cols.rows(names), p, ctx)  # type: ignore[attr-defined]
    assert dict(zip(names, fast.tolist(), strict=True)) == slow
    return slow


def nvlink_pairs(name: str, n: int, pairs: list[tuple[int, int]]) -> topology.Topology:
    """2-link NVLink pairs, the rest across the system, peer-to-peer only over NVLink, no bandwidths."""
    return bridged(
        name, n, pairs, links=2, pcie_gbps=None, level=topology.PcieLevel.SYSTEM, p2p_nvlink_only=True
    )


def test_a_job_gathers_on_its_node_and_its_nvlink_neighbour() -> None:
    a = node("a").gpus(4).used(0, memory=1000).topo(nvlink_pairs("a", 4, [(0, 1)])).state()
    a = with_jobs(a, nodes.JobOnNode(JOB, 1, (0,)))
    b = node("b").gpus(4).state()
    states = {"a": a, "b": b}
    p = pod().gpu(1, memory=1000).obj()
    ctx = ctx_for(states)
    placed = fit.place(a, p, POLICY, ctx)
    assert placed.allocation is not None
    assert placed.allocation.containers[0][0].uuid == uuid("a", 1)  # the emptiest, cool tie: 1
    _, aff_a, *_ = balanced.components(a, p, placed.allocation, ctx)
    assert aff_a == 100.0  # card 1 shares an NVLink with the job's card 0
    placed_b = fit.place(b, p, POLICY, ctx)
    assert placed_b.allocation is not None
    assert balanced.components(b, p, placed_b.allocation, ctx)[1] == 0.0
    scores = both(states, p, ctx)
    assert scores["a"] > scores["b"]


def test_a_card_without_nvlink_to_the_job_is_half_close() -> None:
    # the job holds card 0, only card 2 is free and it has no NVLink to 0
    a = node("a").gpus(3).used(0, memory=81920, cores=100).used(1, memory=81920, cores=100)
    state = with_jobs(a.topo(nvlink_pairs("a", 3, [(0, 1)])).state(), nodes.JobOnNode(JOB, 1, (0,)))
    p = pod().gpu(1, memory=1000).obj()
    ctx = ctx_for({"a": state})
    placed = fit.place(state, p, POLICY, ctx)
    assert placed.allocation is not None
    assert balanced.components(state, p, placed.allocation, ctx)[1] == 50.0
    both({"a": state}, p, ctx)


def test_without_topology_the_same_node_counts_as_close() -> None:
    state = with_jobs(node("a").gpus(2).state(), nodes.JobOnNode(JOB, 2, (1,)))
    p = pod().gpu(1, memory=1000).obj()
    ctx = ctx_for({"a": state})
    placed = fit.place(state, p, POLICY, ctx)
    assert placed.allocation is not None
    assert balanced.components(state, p, placed.allocation, ctx)[1] == 100.0


def test_no_job_or_a_first_pod_keeps_like_joins_like() -> None:
    a = node("a").gpus(2, memory=10000).used(0, memory=4000).state()
    p = pod().gpu(1, memory=3000).obj()
    plain = POLICY.score_node(a, p, api.EMPTY_CONTEXT).score
    first = ctx_for({"a": a})  # the job has no placed pod
    assert not first.job_nodes
    assert POLICY.score_node(a, p, first).score == plain == 57  # test_balanced's joins-emptier-card
    other = ctx_for({"a": with_jobs(a, nodes.JobOnNode("owner:else", 1, (0,)))})
    assert POLICY.score_node(a, p, other).score == plain


def test_job_nodes_index() -> None:
    a = with_jobs(
        node("a").gpus(2).state(), nodes.JobOnNode(JOB, 2, (0, 1)), nodes.JobOnNode("label:x", 1, (1,))
    )
    b = with_jobs(node("b").gpus(2).state(), nodes.JobOnNode(JOB, 1, (1,)))
    snap = snapshot.from_states([a, b, node("c").gpus(1).state()])
    assert dict(snap.job_nodes(JOB)) == {"a": a.jobs[0], "b": b.jobs[0]}
    assert dict(snap.job_nodes("label:x")) == {"a": a.jobs[1]}
    assert not snap.job_nodes("") and not snap.job_nodes("owner:none")


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=3, max_size=3),
    st.lists(st.sets(st.integers(0, 3), max_size=3), min_size=3, max_size=3),
    st.integers(1, 3),
    st.data(),
)
def test_columns_agree_with_score_node_under_job_affinity(
    used: list[int], held: list[set[int]], count: int, data: st.DataObject
) -> None:
    states = {}
    for k, name in enumerate(("a", "b", "c")):
        b = node(name).gpus(4, memory=10000)
        for i in range(used[k]):
            b = b.used(i, memory=2000 + 500 * i)
        pairs = data.draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=4))
        b = b.topo(nvlink_pairs(name, 4, [(x, y) for x, y in pairs if x != y]))
        s = b.state()
        if held[k]:
            s = with_jobs(s, nodes.JobOnNode(JOB, len(held[k]), tuple(sorted(held[k]))))
        states[name] = s
    both(states, pod().gpu(count, memory=1500).obj(), ctx_for(states))


# ----------------------------------------------------------------------------- telemetry age


def hot_and_cool(at: float) -> dict[str, nodes.NodeState]:
    hot = node("hot").gpus(1).telemetry(0, temperature_c=85.0).state()
    cool = node("cool").gpus(1).telemetry(0, temperature_c=35.0).state()

    def stamp(s: nodes.NodeState) -> nodes.NodeState:
        return msgspec.structs.replace(s, inventory=msgspec.structs.replace(s.inventory, telemetry_at=at))

    return {"hot": stamp(hot), "cool": stamp(cool)}


NOW = 1_800_000_000.0


def test_fresh_telemetry_counts() -> None:
    states = hot_and_cool(NOW - 60)
    ctx = dataclasses.replace(api.EMPTY_CONTEXT, now=NOW, telemetry_max_age_s=120.0)
    scores = both(states, pod().gpu(1, memory=1000).obj(), ctx)
    assert scores["cool"] > scores["hot"]


def test_stale_telemetry_counts_as_absent() -> None:
    states = hot_and_cool(NOW - 121)
    ctx = dataclasses.replace(api.EMPTY_CONTEXT, now=NOW, telemetry_max_age_s=120.0)
    p = pod().gpu(1, memory=1000).obj()
    scores = both(states, p, ctx)
    assert scores["cool"] == scores["hot"]
    bare = {
        n: msgspec.structs.replace(s, inventory=msgspec.structs.replace(s.inventory, telemetry=()))
        for n, s in states.items()
    }
    assert scores == both(bare, p, api.EMPTY_CONTEXT)  # exactly as without readings
    placed = fit.place(states["hot"], p, POLICY, ctx)
    assert placed.allocation is not None
    assert balanced.components(states["hot"], p, placed.allocation, ctx)[2] == balanced.NEUTRAL


def test_no_clock_or_no_timestamp_never_stale() -> None:
    inv = hot_and_cool(0.0)["hot"].inventory
    assert thermal.fresh(inv, None, 120.0) and thermal.fresh(inv, NOW, None)
    assert not thermal.fresh(inv, NOW, 120.0)
    assert thermal.fresh(msgspec.structs.replace(inv, telemetry_at=None), NOW, 120.0)
    assert thermal.fresh(
        msgspec.structs.replace(inv, telemetry_at=NOW - 120.0), NOW, 120.0
    )  # at the limit: fresh
    assert thermal.fresh(msgspec.structs.replace(inv, telemetry_at=NOW + 30.0), NOW, 120.0)  # clock skew


def test_stale_rows() -> None:
    at = np.array([NOW - 10, np.nan, NOW - 500, NOW - 200])
    rows = np.array([0, 1, 2, 3])
    got = thermal.stale_rows(at, rows, NOW, 300.0)
    assert got is not None and got.tolist() == [False, False, True, False]
    assert thermal.stale_rows(at, rows, None, 300.0) is None
    assert thermal.stale_rows(at, np.array([0, 1]), NOW, 300.0) is None


def stamped(name: str, temp: float, at: float | None) -> nodes.NodeState:
    b = node(name).gpus(2).used(0, memory=1000).telemetry(0, temperature_c=temp)
    s = b.telemetry(1, temperature_c=temp + 5).state()  # the pod goes to card 1, the emptier
    return msgspec.structs.replace(s, inventory=msgspec.structs.replace(s.inventory, telemetry_at=at))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.floats(0.0, 400.0)), min_size=3, max_size=3),
    st.lists(st.floats(30.0, 90.0), min_size=3, max_size=3),
    st.one_of(st.none(), st.floats(1.0, 300.0)),
)
def test_columns_agree_with_score_node_under_telemetry_age(
    ages: list[float | None], temps: list[float], max_age: float | None
) -> None:
    states = {
        n: stamped(n, t, None if age is None else NOW - age)
        for n, t, age in zip(("a", "b", "c"), temps, ages, strict=True)
    }
    ctx = dataclasses.replace(api.EMPTY_CONTEXT, now=NOW, telemetry_max_age_s=max_age)
    both(states, pod().gpu(1, memory=1000).obj(), ctx)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.one_of(st.none(), st.floats(0.0, 1e9))), max_size=30))
def test_the_telemetry_at_column_follows_set_and_remove(ops: list[tuple[str, float | None]]) -> None:
    b = columns.ColumnsBuilder(rows=1, cards=1)
    held: dict[str, float | None] = {}
    kept: list[tuple[columns.NodeColumns, list[float]]] = []
    for k, (name, at) in enumerate(ops):
        if at is not None and at < 1e8:  # some operations remove the node instead
            b.remove(name)
            held.pop(name, None)
        else:
            b.set(stamped(name, 50.0, at))
            held[name] = at
        cols = b.freeze()
        want = np.full(cols.nodes.shape[0], np.nan)
        for n, row in cols.row_of.items():
            want[row] = np.nan if held[n] is None else held[n]
        np.testing.assert_array_equal(cols.telemetry_at, want)
        assert not cols.telemetry_at.flags.writeable
        if k % 3 == 0:
            kept.append((cols, cols.telemetry_at.tolist()))
    for cols, then in kept:  # frozen views never change
        np.testing.assert_array_equal(cols.telemetry_at, then)
