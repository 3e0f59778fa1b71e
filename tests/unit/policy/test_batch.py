"""batch.evaluate: the vectorised fast path says exactly what fit.place and score_node say."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.framework import cycle, profile, registry
from gpuslice.model import nodes, requests, status
from gpuslice.policy import api, batch, columns, fit, quota, vectorfit
from tests.unit.builders import node, pod
from tests.unit.policy import strategies

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("policy_name", "card_value"),
    [("binpack", "binpack"), ("spread", "spread"), ("binpack", "mutex"), ("spread", "mutex,binpack,numa")],
)
@settings(max_examples=300, deadline=None)
@given(
    states=st.lists(st.integers(0, 10**6), min_size=1, max_size=6).flatmap(
        lambda ids: st.tuples(*[strategies.node_states(name=f"n{i}") for i in range(len(ids))])
    ),
    req=strategies.simple_pods(),
    qv=st.one_of(
        st.none(),
        st.builds(
            quota.QuotaView,
            count_limit=st.sampled_from((None, 0, 2, 8)),
            memory_limit=st.sampled_from((None, 16000, 100000)),
            cores_limit=st.sampled_from((None, 100, 400)),
            used_count=st.integers(0, 4),
            used_memory=st.sampled_from((0, 8000, 60000)),
            used_cores=st.sampled_from((0, 50, 300)),
        ),
    ),
)
def test_fast_path_matches_place(
    policy_name: str,
    card_value: str,
    states: tuple[nodes.NodeState, ...],
    req: requests.PodRequest,
    qv: quota.QuotaView | None,
) -> None:
    policy = registry.get(policy_name)
    card = registry.card_policy(card_value)
    by_name = {s.name: s for s in states}
    cols = columns.build(list(states))
    names = [s.name for s in states] + ["ghost"]
    if vectorfit.request_of(req, qv) is None:
        qv = None  # percentage requests with a limited quota take the exact path; test without
    assert vectorfit.request_of(req, qv) is not None
    ev = batch.evaluate(by_name, cols, names, req, policy, card, api.EMPTY_CONTEXT, qv)
    slow = batch.evaluate(by_name, None, names, req, policy, card, api.EMPTY_CONTEXT, qv)
    for i, name in enumerate(names):
        if name == "ghost":
            assert ev.failures[name][0] == status.Status(
                status.Code.UNRESOLVABLE, (status.NODE_UNREGISTERED,)
            )
            continue
        p = fit.place(by_name[name], req, card, api.EMPTY_CONTEXT, qv)
        assert bool(ev.feasible[i]) == p.status.ok
        assert bool(slow.feasible[i]) == p.status.ok
        if p.status.ok:
            assert ev.scores[i] == policy.score_node(by_name[name], req, api.EMPTY_CONTEXT).score
            assert slow.scores[i] == ev.scores[i]
        else:
            assert ev.failures[name] == (p.status, p.card_reasons)
            assert slow.failures[name] == ev.failures[name]


def test_which_pods_take_the_fast_path() -> None:
    assert vectorfit.request_of(pod().gpu(1).types("a100").obj(), None) is not None
    assert vectorfit.request_of(pod().gpu(1).obj(), quota.QuotaView(count_limit=1)) is not None
    assert vectorfit.request_of(pod().gpu(1, pct=50).obj(), quota.QuotaView(count_limit=1)) is None
    assert vectorfit.request_of(pod().gpu(1, pct=50).obj(), quota.QuotaView()) is not None
    assert vectorfit.request_of(pod().gpu(1).uuids("GPU-x").obj(), None) is None
    assert vectorfit.request_of(pod().gpu(1).numa_bind().obj(), None) is None
    assert vectorfit.request_of(pod().init_gpu(1).gpu(1).obj(), None) is None
    assert vectorfit.request_of(pod().gpu(1).gpu(1).obj(), None) is None


def test_ranked_and_choose() -> None:
    # binpack: n-full has 60000 of 81920 used -> higher score than n-empty; n-tiny cannot fit
    states = {
        "n-empty": node("n-empty").gpus(1).state(),
        "n-full": node("n-full").gpus(1).used(0, memory=60000).state(),
        "n-tiny": node("n-tiny").gpus(1, memory=1000).state(),
    }
    cols = columns.build(states)
    bp = registry.get("binpack")
    req = pod().gpu(1, memory=8000).obj()
    ev = batch.evaluate(states, cols, list(states), req, bp, bp)
    assert ev.ranked() == ["n-full", "n-empty"]
    assert ev.failures["n-tiny"][0] == status.Status(
        status.Code.UNRESOLVABLE, (status.INSUFFICIENT_GPU_MEMORY,)
    )
    got = batch.choose(states, ev, req, bp)
    assert got is not None
    assert got.allocation is not None
    assert got.allocation.node == "n-full"


def test_first_placed_takes_the_best_node_that_places() -> None:
    states = {"a": node("a").gpus(1).state(), "b": node("b").gpus(1).state(), "c": node("c").gpus(1).state()}
    req = pod().gpu(1, memory=8000).obj()
    names = ["c", "a", "b"]
    scores = np.array([50, 90, 90])
    bp = registry.get("binpack")
    won = batch.first_placed(states, names, scores, req, bp)
    assert won is not None and won[0] == 1 and won[1].node == "a"  # tie on 90: the lower name
    full = {**states, "a": node("a").gpus(1).used(0, memory=81920).state()}
    won = batch.first_placed(full, names, scores, req, bp)
    assert won is not None and won[0] == 2 and won[1].node == "b"  # "a" does not place: the next one
    won = batch.first_placed({"c": states["c"]}, names, scores, req, bp)  # no state: passed over
    assert won is not None and won[0] == 0 and won[1].node == "c"
    assert batch.first_placed({"a": full["a"]}, names, scores, req, bp) is None


def test_acting_policy_is_the_fallback_only_for_a_learning_one_while_untrusted() -> None:
    fgd, bp, spread = registry.get("fgd"), registry.get("binpack"), registry.get("spread")
    workload = api.Workload((api.Shape(cpu_milli=0, share_milli=500, count=1),), (1.0,))
    req = pod().gpu(1).obj()

    def acting(policy: api.Plugin, fallback: api.Plugin | None, w: api.Workload | None) -> api.Plugin:
        prof = profile.Profile.of_plugins(policy, fallback)
        return cycle.Cycle.detached(prof, req, api.Context(workload=w), {}).node

    assert acting(fgd, bp, None) is bp
    assert acting(fgd, bp, workload) is fgd
    assert acting(fgd, None, None) is fgd  # workload_fallback: pod
    assert acting(spread, bp, None) is spread


def test_columns_builder_reuses_rows_and_grows() -> None:
    b = columns.ColumnsBuilder(rows=1, cards=1)
    b.set(node("a").gpus(1).state())
    b.set(node("b").gpus(3).state())
    frozen = b.freeze()
    assert frozen.node("ncards")[frozen.row_of["b"]] == 3
    b.remove("a")
    b.set(node("c").gpus(2).state())
    after = b.freeze()
    assert after.row_of["c"] == frozen.row_of["a"]
    assert list(after.card("card_state")[after.row_of["c"]]) == [
        columns.CARD_OK,
        columns.CARD_OK,
        columns.CARD_ABSENT,
    ]
    assert frozen.node("ncards")[frozen.row_of["a"]] == 1  # the old view is unchanged
    with pytest.raises(ValueError):
        after.card("used_mem")[0, 0] = 1


@pytest.mark.parametrize("cards", [16, 40], ids=["16-cards", "40-cards-exact-path"])
def test_wide_nodes(cards: int) -> None:
    # a wide node next to a small one; 40 cards exceed vectorfit.MAX_CARDS and take the exact path
    big = node("big").gpus(cards, memory=1000)
    for i in range(cards - 1):
        big.used(i, memory=900)
    states = {"big": big.state(), "small": node("small").gpus(2, memory=1000).used(0, memory=1000).state()}
    cols = columns.build(states)
    bp = registry.get("binpack")
    req = pod().gpu(2, memory=500).obj()
    ev = batch.evaluate(states, cols, ["big", "small"], req, bp, bp)
    for i, name in enumerate(ev.names):
        p = fit.place(states[name], req, bp)
        assert bool(ev.feasible[i]) == p.status.ok
        if not p.status.ok:
            assert ev.failures[name] == (p.status, p.card_reasons)
    # big: cards - 1 cards have 100 free < 500 -> only one eligible card of the 2 asked
    assert ev.failures["big"][1] == ((status.INSUFFICIENT_GPU_MEMORY, cards - 1),)
