"""fgd and fgd-lookahead on the batch path: ``score_columns`` gives exactly ``score_node``'s scores.

The fast path (``batch.evaluate`` with columns) scores with ``fragcolumns``; the exact path
(``cols=None``) calls ``score_node`` node by node. Both use ``fragscore``'s integer arithmetic, so the
scores must be equal, not close, for any node state and any target workload.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.framework import registry
from gpuslice.model import nodes, requests
from gpuslice.policy import api, batch, columns, fragcolumns, fragmentation, fragscore, vectorfit
from tests.unit.builders import node, pod
from tests.unit.policy import strategies

pytestmark = pytest.mark.unit

POLICIES = ("fgd", "fgd-lookahead")
UNIT = fragscore.UNIT

cpus = st.sampled_from((0, 1000, 4000, 8000)) | st.integers(0, 20000)
types = st.sampled_from(((), ("A100",), ("V100",), ("a100", "V100"), ("H100",)))
shapes = st.one_of(
    st.builds(api.Shape, cpu_milli=cpus, share_milli=st.just(0), count=st.just(0)),
    st.builds(
        api.Shape,
        cpu_milli=cpus,
        share_milli=st.sampled_from((0, 100, 250, 300, 500, 999)) | st.integers(1, 999),
        count=st.integers(1, 8),
        types=types,
    ),
    st.builds(api.Shape, cpu_milli=cpus, share_milli=st.just(1000), count=st.integers(1, 8), types=types),
)


@st.composite
def workloads(draw: st.DrawFn) -> api.Workload | None:
    """None (the pod's own shape) or a histogram of 1-12 shapes with random weights."""
    if draw(st.integers(0, 5)) == 0:
        return None
    chosen = draw(st.lists(shapes, min_size=1, max_size=12, unique=True))
    weights = draw(st.lists(st.integers(1, 50), min_size=len(chosen), max_size=len(chosen)))
    return api.Workload(tuple(chosen), tuple(w / sum(weights) for w in weights))


@st.composite
def fast_pods(draw: st.DrawFn) -> requests.PodRequest:
    """``strategies.simple_pods`` with up to 8 cards and host CPU from the shapes' range."""
    req = draw(strategies.container_requests(max_count=8))
    return requests.PodRequest(
        name="p",
        containers=(req,),
        cpu_milli=draw(st.sampled_from((0, 1000, 4000, 6000))),
        memory_mib=draw(st.sampled_from((0, 1000))),
        selectors=draw(st.sampled_from(strategies.FAST_SELECTORS)),
    )


MODEL_NAMES = (
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA-Tesla V100-PCIE-32GB",
    "NVIDIA H100 80GB HBM3",
    "A100",
    "V100",
)


@st.composite
def capacities(draw: st.DrawFn, states: tuple[nodes.NodeState, ...]) -> tuple[tuple[str, int], ...]:
    """``Context.capacity``: unknown, the states' own cards, or any counts over their models and others."""
    mode = draw(st.sampled_from(("none", "cluster", "drawn")))
    if mode == "none":
        return ()
    models = [d.type for s in states for d in s.inventory.devices]
    if mode == "cluster":
        return api.model_capacity(models)
    names = sorted({*models, *MODEL_NAMES} - {""})
    counts = draw(st.lists(st.integers(0, 64), min_size=len(names), max_size=len(names)))
    return tuple((n, c) for n, c in zip(names, counts, strict=True) if c > 0)


cluster = st.integers(1, 7).flatmap(
    lambda n: st.tuples(*[strategies.node_states(name=f"n{i}", max_cards=8) for i in range(n)])
)


@pytest.mark.parametrize("policy_name", POLICIES)
@settings(max_examples=300, deadline=None)
@given(
    states=cluster,
    req=fast_pods(),
    workload=workloads(),
    card_value=st.sampled_from(("binpack", "mutex")),
    data=st.data(),
)
def test_fast_path_matches_exact_path(
    policy_name: str,
    states: tuple[nodes.NodeState, ...],
    req: requests.PodRequest,
    workload: api.Workload | None,
    card_value: str,
    data: st.DataObject,
) -> None:
    policy = registry.get(policy_name)
    card = registry.card_policy(card_value)
    ctx = api.Context(workload=workload, capacity=data.draw(capacities(states)))
    by_name = {s.name: s for s in states}
    cols = columns.build(list(states))
    names = [s.name for s in states] + ["ghost"]
    assert vectorfit.request_of(req, None) is not None
    fast = batch.evaluate(by_name, cols, names, req, policy, card, ctx)
    exact = batch.evaluate(by_name, None, names, req, policy, card, ctx)
    assert fast.feasible.tolist() == exact.feasible.tolist()
    assert fast.scores.tolist() == exact.scores.tolist()
    assert fast.failures == exact.failures
    for i, name in enumerate(names[:-1]):
        if fast.feasible[i]:
            assert fast.scores[i] == policy.score_node(by_name[name], req, ctx).score


@pytest.mark.parametrize("policy_name", POLICIES)
@settings(max_examples=300, deadline=None)
@given(
    states=st.integers(1, 6).flatmap(
        lambda n: st.tuples(*[strategies.node_states(name=f"n{i}", max_cards=16) for i in range(n)])
    ),
    req=fast_pods(),
    workload=workloads(),
    data=st.data(),
)
def test_score_columns_equals_score_node_on_every_row(
    policy_name: str,
    states: tuple[nodes.NodeState, ...],
    req: requests.PodRequest,
    workload: api.Workload | None,
    data: st.DataObject,
) -> None:
    # every row, feasible or not, nodes of up to 16 cards and without cards: the kernel is total
    policy = registry.get(policy_name)
    ctx = api.Context(workload=workload, capacity=data.draw(capacities(states)))
    cols = columns.build(list(states))
    got = policy.policy.score_columns(cols, cols.rows([s.name for s in states]), req, ctx)  # type: ignore[attr-defined]
    assert got.tolist() == [policy.score_node(s, req, ctx).score for s in states]


def test_a_workload_change_rebuilds_the_tables() -> None:
    # one policy object, two workloads: the second call must not reuse the first one's plan
    fgd = fragmentation.FGD()
    states = [node("a").gpus(2).used(0, memory=60000, cores=70).state(), node("b").gpus(2).state()]
    cols = columns.build(states)
    rows = cols.rows(["a", "b"])
    req = pod().gpu(1, memory=20000).obj()
    for share in (300, 700, 300):
        ctx = api.Context(workload=api.Workload((api.Shape(0, share, 1),), (1.0,)))
        assert fgd.score_columns(cols, rows, req, ctx).tolist() == [
            fgd.score_node(s, req, ctx).score for s in states
        ]


def test_more_than_a_whole_card_free_takes_the_exact_path() -> None:
    # usage below zero (never written by the cache) shows 1500 milli free: score_rows declines and
    # score_columns scores row by row with Python integers
    inv = node("n").gpus(2, memory=1000).state().inventory
    state = nodes.NodeState(
        inventory=inv, usage=(nodes.CardUsage(slots=1, memory_mib=-500), nodes.EMPTY_CARD)
    )
    cols = columns.build([state])
    req = pod().gpu(1, memory=300).obj()
    ctx = api.Context(workload=api.Workload((api.Shape(0, 400, 1),), (1.0,)))
    assert fragcolumns.read(cols, cols.rows(["n"])).free[:, :2].tolist() == [[1000, 1000]]  # cores cap it
    for name in POLICIES:
        policy = registry.get(name)
        assert policy.policy.score_columns(cols, cols.rows(["n"]), req, ctx).tolist() == [  # type: ignore[attr-defined]
            policy.score_node(state, req, ctx).score
        ]
    big = nodes.NodeState(
        inventory=inv, usage=(nodes.CardUsage(slots=1, memory_mib=-500, cores=-50), nodes.EMPTY_CARD)
    )
    cols = columns.build([big])
    assert fragcolumns.read(cols, cols.rows(["n"])).free[:, :2].tolist() == [[1500, 1000]]
    assert fragcolumns.score_rows(cols, cols.rows(["n"]), req, lambda d: pytest.fail("no plan")) is None
    for name in POLICIES:
        policy = registry.get(name)
        assert policy.policy.score_columns(cols, cols.rows(["n"]), req, ctx).tolist() == [  # type: ignore[attr-defined]
            policy.score_node(big, req, ctx).score
        ]


@pytest.mark.parametrize(
    ("weights", "units"),
    [
        ((0.5, 0.25, 0.25), (2**39, 2**38, 2**38)),  # powers of two are exact
        ((1 / 3, 2 / 3), (366503875925, 733007751851)),  # 2**40 / 3 = 366503875925.33; 2/3 -> ...850.67
        ((0.1,), (109951162778,)),  # 0.1 * 2**40 = 109951162777.6
        ((1.0,), (2**40,)),
    ],
)
def test_integer_weights(weights: tuple[float, ...], units: tuple[int, ...]) -> None:
    assert UNIT == 2**40
    assert fragscore.quantize(weights) == units


def test_measure_is_an_exact_integer() -> None:
    # M = 1/3 of a 500-share shape + 2/3 of a whole card; one card of 1000 and one of 300 free:
    # share 500: fits (1000 >= 500) -> slivers 300; whole: fits -> slivers 300: F = 300 * (w1 + w2)
    m = api.Workload((api.Shape(0, 500, 1), api.Shape(0, 1000, 1)), (1 / 3, 2 / 3))
    frag = fragmentation.Fragmentation(m)
    assert frag.of("G", 0, (1000, 300)) == 300 * (366503875925 + 733007751851)
    assert isinstance(frag.of("G", 0, (1000, 300)), int)


def test_threshold_table_at_its_boundaries() -> None:
    t = fragscore.SCORE_THRESHOLDS
    assert len(t) == 100 and list(t) == sorted(t)
    # delta 0: sigmoid(0) = 1/2 -> exactly 50; below zero the float formula gives 49 at once
    # (49.99999999...), but a decrease within TIE = 2**24 units (2**-16 milli-GPU) is a tie: 50
    assert fragscore.score(0) == 50
    assert t[49] == -fragscore.TIE + 1 == -(2**24) + 1
    assert fragscore.score(-1) == 50 and fragscore.score(-(2**24) + 1) == 50
    assert fragscore.score(-(2**24)) == 49
    # score >= 51 from z = ln(51/49) = 0.0400053: 40.0053 milli * 2**40 = 43986330580831.97 -> ...832
    assert t[50] == 43986330580832 == math.ceil(1000 * math.log(51 / 49) * UNIT)
    assert fragscore.score(t[50] - 1) == 50 and fragscore.score(t[50]) == 51
    # 49 from ln(49/51), the mirror image
    assert t[48] == -43986330580832
    # score >= 1 from z = ln(1/99) = -4.59512 -> -4595.12 milli; below it 0
    assert round(t[0] / UNIT, 2) == -4595.12
    assert fragscore.score(t[0]) == 1 and fragscore.score(t[0] - 1) == 0
    # 100 only where the float formula rounds 100 / (1 + e^-z) to 100.0: z >= 36.7368 (36.7 GPUs)
    assert round(t[99] / UNIT) == 36737
    assert fragscore.score(t[99]) == 100 and fragscore.score(t[99] - 1) == 99
    assert fragscore.score(-(2**62)) == 0 and fragscore.score(2**62) == 100


@settings(max_examples=500, deadline=None)
@given(st.integers(-(10**17), 5 * 10**16) | st.integers(-(2**30), 2**30))
def test_table_reads_the_float_formula(delta: int) -> None:
    # every integer decrease scores as the reference float formula does at delta / UNIT milli-GPU,
    # except the ties within TIE below zero
    want = 50 if -fragscore.TIE < delta < 0 else fragscore.sigmoid_score(delta / UNIT)
    assert fragscore.score(delta) == want
    assert fragscore.scores(np.array([delta])).tolist() == [want]


def test_a_zero_decrease_scores_fifty_on_both_paths() -> None:
    # M = one sharing shape (4000 CPU, 500 milli). Node: two idle cards, 8000 CPU. A pod of 4000 CPU
    # and 500 milli on card 0 leaves (500, 1000) and 4000 CPU: S fits before and after and no card is
    # below 500, so F = 0 both times (FGD): a decrease of exactly 0 -> 50, on both paths.
    # fgd-lookahead: before, 2 tasks (CPU 8000 / 4000) use both cards: F = 0; after, 1 task uses the
    # 1000 card and 500 is left: F = 500 * UNIT -> decrease -500 milli -> int(100 * sigmoid(-0.5)) = 37.
    m = api.Workload((api.Shape(4000, 500, 1),), (1.0,))
    ctx = api.Context(workload=m)
    state = node("n").gpus(2).host(8000, 0).state()
    req = requests.PodRequest(
        name="p", containers=(requests.ContainerRequest(count=1, memory_percentage=50),), cpu_milli=4000
    )
    cols = columns.build([state])
    card = registry.get("binpack")
    for name, want in (("fgd", 50), ("fgd-lookahead", 37)):
        policy = registry.get(name)
        assert policy.score_node(state, req, ctx).score == want
        for use in (cols, None):
            assert batch.evaluate({"n": state}, use, ["n"], req, policy, card, ctx).scores.tolist() == [want]
    assert fragscore.score(-500 * UNIT) == 37 == int(100 / (1 + math.exp(0.5)))


def test_a_rational_tie_broken_by_rounding_still_scores_fifty() -> None:
    # M: 1/2 of share 200, 1/3 of a whole card, 1/6 of share 300. Cards (700, 300) -> (700, 200):
    #   before: R = 1000; 200 and 300 fit without slivers; whole: no card -> R:  F = 1/3 * 1000
    #   after:  R = 900; 200 fits, 300 leaves the 200 card; whole -> R:  F = 1/3 * 900 + 1/6 * 200
    # equal as rationals (1000/3); in units 1000 * 366503875925 = 366503875925000 against
    # 900 * 366503875925 + 200 * 183251937963 = 366503875925100: a decrease of -100 units, which
    # the float formula would call 49 (0.5 - 2e-17); within TIE it is a tie, 50.
    m = api.Workload(
        (api.Shape(0, 200, 1), api.Shape(0, 1000, 1), api.Shape(0, 300, 1)),
        (1 / 2, 1 / 3, 1 / 6),
    )
    assert fragscore.quantize(m.weights) == (2**39, 366503875925, 183251937963)
    frag = fragmentation.Fragmentation(m)
    before, after = frag.of("G", 0, (700, 300)), frag.of("G", 0, (700, 200))
    assert (before, after) == (366503875925000, 366503875925100)
    assert fragscore.sigmoid_score((before - after) / UNIT) == 49
    assert fragscore.score(before - after) == 50
    state = node("n").gpus(2, memory=1000).used(0, memory=300, cores=30).used(1, memory=700, cores=70).state()
    req = pod().gpu(1, memory=100).obj()  # 100 milli of a 1000 MiB card: card 1 (300) -> 200
    fgd = fragmentation.FGD()
    # card 1 gives the tie (50); card 0 (700 -> 600) leaves F = 1/3 * 900 = 300, a decrease of
    # 33.3 milli -> int(100 * sigmoid(0.0333)) = 50 as well
    assert fgd.score_node(state, req, api.Context(workload=m)).score == 50


@pytest.mark.parametrize("policy_name", POLICIES)
@pytest.mark.parametrize(
    "request_",
    [
        requests.ContainerRequest(count=1, memory_mib=8000, cores=30),
        requests.ContainerRequest(count=2, memory_mib=20000),
        requests.ContainerRequest(count=1, memory_percentage=100, cores=100),
        requests.ContainerRequest(count=2, memory_percentage=100, cores=100),
    ],
    ids=["share", "two-cards-share", "whole", "two-whole"],
)
def test_mixed_models_and_card_memories(policy_name: str, request_: requests.ContainerRequest) -> None:
    # rows of two card memories (two demands) and two models against a typed workload
    a100, v100 = "NVIDIA A100-SXM4-80GB", "NVIDIA-Tesla V100-PCIE-32GB"
    states = [
        node("a").gpus(4, model=a100).used(1, memory=40000, cores=50).host(32000, 0, cpu_used=8000).state(),
        node("b").gpus(4, model=v100, memory=32768).used(0, memory=30000).host(32000, 0).state(),
        node("c").gpus(8, model=a100).host(64000, 0, cpu_used=60000).state(),
        node("d").gpus(2, model=v100, memory=32768).used(0, memory=8000, cores=10).host(16000, 0).state(),
    ]
    m = api.Workload(
        (
            api.Shape(4000, 500, 1),
            api.Shape(8000, 1000, 1, ("A100",)),
            api.Shape(2000, 250, 2, ("V100",)),
            api.Shape(1000, 0, 0),
        ),
        (0.4, 0.3, 0.2, 0.1),
    )
    # the A100 shape is scarce here: half the GPU demand (300 of 600 milli) can use only a third of the cards
    ctx = api.Context(workload=m, capacity=((a100, 4), (v100, 8)))
    policy = registry.get(policy_name)
    req = requests.PodRequest(name="p", containers=(request_,), cpu_milli=2000)
    cols = columns.build(states)
    got = policy.policy.score_columns(cols, cols.rows([s.name for s in states]), req, ctx)  # type: ignore[attr-defined]
    assert got.tolist() == [policy.score_node(s, req, ctx).score for s in states]
