"""batch.evaluate: balanced and the FGD paper's baselines score the fast path exactly as score_node."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.framework import registry
from gpuslice.model import nodes, requests
from gpuslice.policy import api, balanced, batch, columns, fit, shares, thermal, vectorfit
from tests.unit.builders import node, pod
from tests.unit.policy import strategies
from tests.unit.sim_builders import sim_state

pytestmark = pytest.mark.unit

POLICIES = ("balanced", "bestfit", "clustering", "dotprod", "packing", "random")


@st.composite
def varied_states(draw: st.DrawFn, name: str) -> nodes.NodeState:
    """``strategies.node_states`` plus what those never vary: telemetry, cards of different sizes,
    cards registering no memory or no cores, and a recorded tag multiset (``TaggedNodeState``)."""
    s = draw(strategies.node_states(name=name))
    devs = list(s.inventory.devices)
    usage = list(s.usage)
    if draw(st.integers(0, 3)) == 0:  # an idle node: every card ties on usage, headroom decides
        usage = [nodes.EMPTY_CARD] * len(usage)
    for i, d in enumerate(devs):
        kind = draw(st.integers(0, 9))
        if kind == 0:  # a card of another size (the first card's size sets the paper policies' share)
            devs[i] = msgspec.structs.replace(d, memory_mib=draw(st.sampled_from(strategies.MEMS)))
        elif kind == 1:  # no memory or no cores registered
            devs[i] = msgspec.structs.replace(d, **{draw(st.sampled_from(("memory_mib", "cores"))): 0})
            usage[i] = nodes.CardUsage(usage[i].slots, 0, 0) if draw(st.booleans()) else usage[i]
    telemetry = []
    for d in devs:
        if draw(st.integers(0, 2)) == 0:
            continue
        telemetry.append(
            nodes.CardTelemetry(
                uuid=d.uuid,
                temperature_c=draw(st.none() | st.sampled_from((20.0, 45.5, 60.0, 85.0, 95.0))),
                power_draw_w=draw(st.none() | st.sampled_from((0.0, 100.0, 150.0, 333.3))),
                power_limit_w=draw(st.none() | st.sampled_from((0.0, 300.0, 400.0))),
            )
        )
    inv = msgspec.structs.replace(s.inventory, devices=tuple(devs), telemetry=tuple(telemetry))
    out = nodes.NodeState(
        inventory=inv, usage=tuple(usage), cpu_used_milli=s.cpu_used_milli, memory_used_mib=s.memory_used_mib
    )
    if draw(st.integers(0, 4)) == 0:
        tags = draw(st.lists(st.sampled_from((shares.SHARE_TAG, "1-gpu", "2-gpu", "4-gpu")), max_size=3))
        counts: tuple[tuple[str, int], ...] = ()
        for t in tags:
            counts = shares.add_tag(counts, t, 1)
        return shares.tagged(out, counts)
    return out


def _states(max_nodes: int = 6) -> st.SearchStrategy[tuple[nodes.NodeState, ...]]:
    return st.integers(1, max_nodes).flatmap(
        lambda n: st.tuples(*[varied_states(name=f"n{i}") for i in range(n)])
    )


@pytest.mark.parametrize("policy_name", POLICIES)
@pytest.mark.parametrize("card_value", ["self", "mutex"])
@settings(max_examples=100, deadline=None)
@given(states=_states(), req=strategies.simple_pods(), seed=st.integers(0, 3))
def test_fast_path_matches_exact_path(
    policy_name: str,
    card_value: str,
    states: tuple[nodes.NodeState, ...],
    req: requests.PodRequest,
    seed: int,
) -> None:
    policy = registry.get(policy_name)
    card = policy if card_value == "self" else registry.card_policy(card_value)
    assert policy.batch is not None
    by_name = {s.name: s for s in states}
    cols = columns.build(list(states))
    names = [s.name for s in states] + ["ghost"]
    assert vectorfit.request_of(req, None) is not None
    ctx = api.Context(rng=np.random.default_rng(seed))
    ev = batch.evaluate(by_name, cols, names, req, policy, card, ctx)
    slow = batch.evaluate(
        by_name, None, names, req, policy, card, api.Context(rng=np.random.default_rng(seed))
    )
    assert ev.feasible.tolist() == slow.feasible.tolist()
    assert ev.scores.tolist() == slow.scores.tolist()
    assert ev.failures == slow.failures
    for i, name in enumerate(names[:-1]):
        p = fit.place(by_name[name], req, card, api.Context(rng=np.random.default_rng(seed)))
        assert bool(ev.feasible[i]) == p.status.ok
        if p.status.ok:
            assert ev.scores[i] == policy.score_node(by_name[name], req, api.EMPTY_CONTEXT).score


@pytest.mark.parametrize("policy_name", POLICIES)
@settings(max_examples=100, deadline=None)
@given(states=_states(8), req=strategies.simple_pods())
def test_score_columns_on_every_row(
    policy_name: str, states: tuple[nodes.NodeState, ...], req: requests.PodRequest
) -> None:
    # all rows at once, feasible or not, in a shuffled order: each row is scored on its own
    policy = registry.get(policy_name)
    cols = columns.build(list(states))
    order = list(reversed(states))
    rows = cols.rows([s.name for s in order])
    got = policy.policy.score_columns(cols, rows, req, api.EMPTY_CONTEXT)  # type: ignore[attr-defined]
    for s, score in zip(order, got.tolist(), strict=True):
        placed = fit.place(s, req, policy)
        if placed.status.ok or policy_name != "balanced":
            assert score == policy.score_node(s, req, api.EMPTY_CONTEXT).score


@settings(max_examples=100, deadline=None)
@given(states=_states(8))
def test_columns_hold_the_paper_view_and_headrooms(states: tuple[nodes.NodeState, ...]) -> None:
    cols = columns.build(list(states))
    for s in states:
        r = cols.row_of[s.name]
        n = len(s.inventory.devices)
        free = shares.free_milli(s)
        assert cols.card("free_milli")[r, :n].tolist() == list(free)
        assert cols.node("sum_free_milli")[r] == sum(free)
        assert cols.tag_sets[cols.node("tags_id")[r]] == shares.node_tags(s)
        assert cols.node("nocap_cards")[r] == sum(
            1 for d in s.inventory.devices if d.memory_mib <= 0 or d.cores <= 0
        )
        heads = [np.nan if h is None else h for h in thermal.headrooms(s)]
        assert np.array_equal(cols.heads[r, :n], np.array(heads, np.float64), equal_nan=True)
        assert np.isnan(cols.heads[r, n:]).all()


def test_headrooms_follow_the_node_and_frozen_views_stay() -> None:
    b = columns.ColumnsBuilder(rows=1, cards=2)
    hot = node("a").gpus(2).telemetry(0, temperature_c=60.0).state()
    b.set(hot)
    first = b.freeze()
    assert first.heads[0, 0] == 50.0 and np.isnan(first.heads[0, 1])
    b.set(node("a").gpus(2).used(1, memory=100).telemetry(0, temperature_c=60.0).state())
    assert b.freeze().heads is first.heads  # readings unchanged: the frozen copy is shared
    b.set(node("a").gpus(2).telemetry(1, temperature_c=30.0).state())
    second = b.freeze()
    assert np.isnan(second.heads[0, 0]) and second.heads[0, 1] == 100.0
    assert first.heads[0, 0] == 50.0  # the old view is unchanged
    b.remove("a")
    b.set(node("b").gpus(2).state())  # reuses the row: no readings left over
    assert np.isnan(b.freeze().heads[0]).all()


def test_clustering_reads_recorded_tags_from_columns() -> None:
    # the same usage, tagged as a 2-gpu pod's or estimated from usage: different scores
    tagged = sim_state((0, 0, 1000, 1000), tags=("2-gpu",), name="t")
    untagged = nodes.NodeState(
        inventory=msgspec.structs.replace(tagged.inventory, name="u"), usage=tagged.usage
    )
    cols = columns.build([tagged, untagged])
    two = pod().gpu(2, cores=100).obj()
    policy = registry.get("clustering")
    got = policy.policy.score_columns(cols, cols.rows(["t", "u"]), two, api.EMPTY_CONTEXT)  # type: ignore[attr-defined]
    assert got.tolist() == [policy.score_node(s, two, api.EMPTY_CONTEXT).score for s in (tagged, untagged)]
    # b = 25 * (8000 - 2000) // 8000 = 18; recorded {2-gpu}: + 75; estimated {1-gpu}: + 0
    assert got.tolist() == [93, 18]


def test_random_scores_without_drawing() -> None:
    rng = np.random.default_rng(5)
    before = rng.bit_generator.state
    cols = columns.build([node("a").gpus(2).state(), node("b").gpus(1).state()])
    got = registry.get("random").policy.score_columns(  # type: ignore[attr-defined]
        cols, cols.rows(["a", "b"]), pod().gpu(1, memory=100).obj(), api.Context(rng=rng)
    )
    assert got.tolist() == [0, 0]
    assert rng.bit_generator.state == before


def test_balanced_fast_path_breaks_ties_by_headroom_then_index() -> None:
    # four idle cards: equal keys; card 2 is the coolest, cards 1 and 3 tie after it
    state = (
        node("a")
        .gpus(4)
        .telemetry(0, temperature_c=80.0)
        .telemetry(1, temperature_c=50.0)
        .telemetry(2, temperature_c=40.0)
        .telemetry(3, temperature_c=50.0)
        .state()
    )
    cols = columns.build([state])
    policy = registry.get("balanced")
    for count, cards in ((1, (2,)), (2, (1, 2)), (4, (0, 1, 2, 3))):
        req = pod().gpu(count, memory=1000).obj()
        placed = fit.place(state, req, policy)
        assert placed.allocation is not None
        assert tuple(sorted(int(g.uuid.rsplit("-", 1)[1]) for g in placed.allocation.containers[0])) == cards
        got = policy.policy.score_columns(cols, cols.rows(["a"]), req, api.EMPTY_CONTEXT)  # type: ignore[attr-defined]
        assert got.tolist() == [balanced.components(state, req, placed.allocation)[-1]]
