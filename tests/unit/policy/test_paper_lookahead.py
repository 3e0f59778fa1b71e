"""fgd-lookahead: the repeated-task fragmentation measure and the per-class top-shapes cut."""

from __future__ import annotations

import math

import pytest

from gpuslice.policy import fragmentation, lookahead, registry
from tests.unit.sim_builders import sim_pod, sim_state

pytestmark = pytest.mark.unit

S = registry.Shape(cpu_milli=4000, share_milli=500, count=1)  # sharing
W = registry.Shape(cpu_milli=4000, share_milli=1000, count=1)  # whole card
M = registry.Workload((S, W), (0.5, 0.5))


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
    m = registry.Workload((S,), (1.0,))
    ctx = registry.Context(workload=m)
    state = sim_state((1000, 1000), cpu=8000)
    pod = sim_pod(cpu=4000, share=500, count=1).request
    # FGD: F = 0 before (S fits, no slivers) and after (500 and 1000 both fit S) -> delta 0 -> 50
    assert fragmentation.FGD().score_node(state, pod, ctx).score == 50
    # lookahead: before 2 tasks use both cards -> 0; after CPU 4000 allows 1 task on the 1000 card,
    # 1500 - 1000 = 500 fragment -> delta -500 -> int(100 * sigmoid(-0.5)) = 37
    assert lookahead.Lookahead().score_node(state, pod, ctx).score == int(100 / (1 + math.exp(0.5))) == 37


def test_top_by_type_keeps_each_constraint_class() -> None:
    a, b, c = (registry.Shape(cpu_milli=1000 * k, share_milli=1000, count=1) for k in (1, 2, 3))
    t1 = registry.Shape(cpu_milli=1000, share_milli=500, count=1, types=("T4",))
    t2 = registry.Shape(cpu_milli=2000, share_milli=500, count=1, types=("T4",))
    hist = registry.Workload((a, b, c, t1, t2), (0.5, 0.3, 0.1, 0.06, 0.04))
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
    shape = registry.Shape(cpu_milli=4000, share_milli=500, count=1)
    frag = lookahead.RepeatedFragmentation(registry.Workload((shape,), (1.0,)))
    free = (1000,) * 16
    unit = fragmentation.UNIT
    assert frag.of("G2", 32000, free) == 8000 * unit
    assert frag.of("G2", 48000, free) == 4000 * unit
    assert frag.of("G2", 64000, free) == 0
    assert frag.of("G2", 48000, (1000,) * 8) == 0  # an 8-card node on the shared table still
