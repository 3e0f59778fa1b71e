"""fgd-lookahead: the repeated-task fragmentation measure and the per-class top-shapes cut."""

from __future__ import annotations

import math

import pytest

from gpuslice.framework import registry
from gpuslice.policy import api, fragmentation, lookahead
from tests.unit.sim_builders import sim_pod, sim_state

pytestmark = pytest.mark.unit

S = api.Shape(cpu_milli=4000, share_milli=500, count=1)  # sharing
W = api.Shape(cpu_milli=4000, share_milli=1000, count=1)  # whole card
M = api.Workload((S, W), (0.5, 0.5))


@pytest.mark.parametrize(
    ("cpu", "free", "expected"),
    [
        # R = 2200. S: 3 cards >= 500, CPU for 6000 // 4000 = 1 task -> uses the 1000 card: 2200 - 1000 = 1200
        # W (one-task test, as FGD): fits -> slivers < 1000 = 600 + 600 = 1200. F = 0.5 * 1200 + 0.5 * 1200
        (6000, (1000, 600, 600), 1200),
        # CPU for 3 tasks of S -> all 2200 usable: 0; W: 1200 -> F = 600
        (12000, (1000, 600, 600), 600),
        # no CPU for S or W -> R for both: 2200
        (3000, (1000, 600, 600), 2200),
    ],
    ids=["cpu-for-one-task", "cpu-for-all", "no-cpu"],
)
def test_repeated_measure(cpu: int, free: tuple[int, ...], expected: int) -> None:
    unit = fragmentation.UNIT  # weights 0.5 -> 2**31 units: F is exactly milli-GPU * UNIT
    assert lookahead.RepeatedFragmentation(M).of("G2", cpu, free) == expected * unit
    # FGD's one-task measure on the first case: S fits -> 0 slivers; W 1200 -> 600
    assert fragmentation.Fragmentation(M).of("G2", 6000, (1000, 600, 600)) == 600 * unit


def test_cpu_tight_node_is_penalised_where_fgd_is_not() -> None:
    m = api.Workload((S,), (1.0,))
    ctx = api.Context(workload=m)
    state = sim_state((1000, 1000), cpu=8000)
    pod = sim_pod(cpu=4000, share=500, count=1).request
    # FGD: F = 0 before (S fits, no slivers) and after (500 and 1000 both fit S) -> delta 0 -> 50
    assert fragmentation.FGD().score_node(state, pod, ctx).score == 50
    # lookahead: before 2 tasks use both cards -> 0; after CPU 4000 allows 1 task on the 1000 card,
    # 1500 - 1000 = 500 fragment -> delta -500 -> int(100 * sigmoid(-0.5)) = 37
    assert lookahead.Lookahead().score_node(state, pod, ctx).score == int(100 / (1 + math.exp(0.5))) == 37


def test_top_by_type_keeps_each_constraint_class() -> None:
    a, b, c = (api.Shape(cpu_milli=1000 * k, share_milli=1000, count=1) for k in (1, 2, 3))
    t1 = api.Shape(cpu_milli=1000, share_milli=500, count=1, types=("T4",))
    t2 = api.Shape(cpu_milli=2000, share_milli=500, count=1, types=("T4",))
    hist = api.Workload((a, b, c, t1, t2), (0.5, 0.3, 0.1, 0.06, 0.04))
    # global cut (FGD): a, b, c = 0.9 < 0.95 -> + t1 = 0.96 -> t2 is dropped
    assert fragmentation.top_shapes(hist).shapes == (a, b, c, t1)
    # per class: untyped 0.5 + 0.3 = 0.8 < 0.95 * 0.9 = 0.855 -> + c; T4 class 0.06 < 0.095 -> + t2
    got = lookahead.top_by_type(hist)
    assert set(got.shapes) == {a, b, c, t1, t2}
    assert sum(got.weights) == pytest.approx(1.0)


def test_registered() -> None:
    assert registry.get("fgd-lookahead").name == "fgd-lookahead"


def test_lookahead_memo_tells_cpu_levels_apart_past_eight_cards() -> None:
    # One sharing shape of 4000 CPU and half a card; a node of 16 idle cards. At 32000 CPU 8 tasks
    # fit (16000 - 8 * 1000 = 8000 left unused), at 48000 CPU 12 (4000). Both levels lie past the
    # shared step table's last step (8 * 4000): the second call used to get the first one's 8000.
    shape = api.Shape(cpu_milli=4000, share_milli=500, count=1)
    frag = lookahead.RepeatedFragmentation(api.Workload((shape,), (1.0,)))
    free = (1000,) * 16
    unit = fragmentation.UNIT
    assert frag.of("G2", 32000, free) == 8000 * unit
    assert frag.of("G2", 48000, free) == 4000 * unit
    assert frag.of("G2", 64000, free) == 0
    assert frag.of("G2", 48000, (1000,) * 8) == 0  # an 8-card node on the shared table still


# Model-aware weights: a cluster of 8 T4 cards and 24 G2 cards (T4 reach 8 / 32 = 0.25).
CAP = (("G2", 24), ("T4", 8))
ANY = api.Shape(cpu_milli=0, share_milli=1000, count=1)
PIN = api.Shape(cpu_milli=0, share_milli=1000, count=1, types=("T4",))
CPU = api.Shape(cpu_milli=4000, share_milli=0, count=0)


def _weights(measure: lookahead.RepeatedFragmentation, model: str) -> tuple[float, ...]:
    cpu, gpu = measure.model_weights(model)
    return (cpu / fragmentation.UNIT, *(w / fragmentation.UNIT for w in gpu))


def test_model_weights_without_scarcity() -> None:
    # p = (CPU 0.2, ANY 0.7, PIN 0.1). a = p / reach: CPU 0.2, ANY 0.7, PIN 0.1 / 0.25 = 0.4.
    # PIN's demand share is 0.1 / 0.8 = 0.125 of the GPU demand on 0.25 of the cards: pi = 0.5, not scarce.
    m = api.Workload((CPU, ANY, PIN), (0.2, 0.7, 0.1))
    f = lookahead.RepeatedFragmentation(m, capacity=CAP)
    # T4 node serves all: Z = 0.2 + 0.7 + 0.4 = 1.3 -> CPU 0.2 / 1.3, ANY 0.7 / 1.3, PIN 0.4 / 1.3
    assert _weights(f, "T4") == pytest.approx((0.2 / 1.3, 0.7 / 1.3, 0.4 / 1.3))
    # G2 node serves CPU and ANY: Z = 0.9; PIN is not scarce -> 0 (other nodes take it)
    assert _weights(f, "G2") == pytest.approx((0.2 / 0.9, 0.7 / 0.9, 0.0))


def test_model_weights_with_scarcity() -> None:
    # p = (ANY 0.6, PIN 0.4): PIN is 0.4 of the GPU demand on 0.25 of the cards, pi = 1.6 -> scarce.
    # a: ANY 0.6, PIN 0.4 / 0.25 = 1.6; G = 2.2.
    m = api.Workload((ANY, PIN), (0.6, 0.4))
    f = lookahead.RepeatedFragmentation(m, capacity=CAP)
    assert _weights(f, "T4") == pytest.approx((0.0, 0.6 / 2.2, 1.6 / 2.2))
    # G2 cannot serve PIN, which is scarce: it weighs a / G = 1.6 / 2.2, so G2's free cards count as
    # fragments for it and a pod that fills them lowers F there by 1.6 / 2.2 per milli on top
    assert _weights(f, "G2") == pytest.approx((0.0, 0.6 / 0.6, 1.6 / 2.2))


def test_unknown_capacity_weighs_like_the_histogram_on_untyped_workloads() -> None:
    m = api.Workload((CPU, ANY, S), (0.2, 0.5, 0.3))
    for model in ("T4", "G2"):
        got = lookahead.RepeatedFragmentation(m, capacity=CAP).model_weights(model)
        assert got == lookahead.RepeatedFragmentation(m).model_weights(model)
        assert got == (fragmentation.quantize([0.2])[0], fragmentation.quantize([0.5, 0.3]))


def test_scarce_model_keeps_flexible_pods_away() -> None:
    # One whole-card pod that can go anywhere; a T4 node and a G2 node, both empty with two cards.
    # Under a workload where T4-pinned demand is scarce, the G2 node scores higher: on T4 the pod
    # removes a card the pinned shape could use (F unchanged: no slivers either way) while on G2 it
    # fills cards that count as fragments for the pinned shape (F falls by 1.6 / 2.2 * 1000).
    m = api.Workload((ANY, PIN), (0.6, 0.4))
    ctx = api.Context(workload=m, capacity=CAP)
    pod = sim_pod(cpu=0, share=1000, count=1).request
    t4 = sim_state((1000, 1000), cpu=64000, model="T4")
    g2 = sim_state((1000, 1000), cpu=64000, model="G2")
    policy = lookahead.Lookahead()
    s_t4 = policy.score_node(t4, pod, ctx).score
    s_g2 = policy.score_node(g2, pod, ctx).score
    assert s_t4 == 50  # dF = 0
    assert s_g2 == int(100 / (1 + math.exp(-1.6 / 2.2))) == 67
    # FGD sees both alike: PIN counts all free cards as fragments off T4 with its plain weight 0.4,
    # so on G2 F falls by 400 -> int(100 * sigmoid(0.4)) = 59, and 50 on T4
    assert fragmentation.FGD().score_node(g2, pod, ctx).score == 59
