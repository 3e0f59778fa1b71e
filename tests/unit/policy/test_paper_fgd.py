"""FGD's fragmentation measure and scores (fgd-experiment.md section 6.6) on a hand-built node."""

from __future__ import annotations

import math

import pytest

from gpuslice.policy import api, fragmentation
from tests.unit.sim_builders import sim_pod, sim_state

pytestmark = pytest.mark.unit

# M: A = 1 card of 500 with 1000 CPU (p 0.5), B = 1 whole card with 4000 CPU (p 0.25),
# C = CPU-only 2000 (p 0.25).
A = api.Shape(cpu_milli=1000, share_milli=500, count=1)
B = api.Shape(cpu_milli=4000, share_milli=1000, count=1)
C = api.Shape(cpu_milli=2000, share_milli=0, count=0)
M = api.Workload((A, B, C), (0.5, 0.25, 0.25))
CTX = api.Context(workload=M)


def sig(delta: float) -> int:
    return int(100 / (1 + math.exp(-delta / 1000)))


@pytest.mark.parametrize(
    ("shape", "cpu", "free", "expected"),
    [
        (C, 8000, (1000, 300), 1300),  # CPU-only shape: all free milli R
        (A, 8000, (1000, 300), 300),  # fits: slivers < 500
        (B, 8000, (1000, 300), 300),  # fits: slivers < 1000
        (B, 3000, (1000, 300), 1300),  # CPU short: R
        (A, 8000, (400, 300), 700),  # no card >= 500: R
        (
            api.Shape(cpu_milli=0, share_milli=500, count=1, types=("T4",)),
            8000,
            (1000,),
            1000,
        ),  # wrong model
    ],
    ids=["cpu-only", "share-fits", "whole-fits", "cpu-short", "no-card", "model-mismatch"],
)
def test_per_shape(shape: api.Shape, cpu: int, free: tuple[int, ...], expected: int) -> None:
    assert fragmentation.Fragmentation(M).shape("G2", cpu, free, shape) == expected


def test_weighted_measure() -> None:
    # F = 0.5 * 300 + 0.25 * 300 + 0.25 * 1300 = 150 + 75 + 325 = 550 milli-GPU; the weights are
    # exact in units (0.5 -> 2**31, 0.25 -> 2**30), so F is exactly 550 * UNIT
    assert fragmentation.Fragmentation(M).of("G2", 8000, (1000, 300)) == 550 * fragmentation.UNIT
    # memo: card order does not matter
    assert fragmentation.Fragmentation(M).of("G2", 8000, (300, 1000)) == 550 * fragmentation.UNIT


@pytest.mark.parametrize(
    ("pod", "expected_score", "expected_cards"),
    [
        # sharing 200 with 1000 CPU, node CPU 8000 free, cards (1000, 300), F_old = 550.
        # card 0 -> (800, 300), CPU 7000: A 300, B R=1100, C 1100 -> F = 150 + 275 + 275 = 700, d = -150 -> 46
        # card 1 -> (1000, 100): A 100, B 100, C 1100 -> F = 50 + 25 + 275 = 350, d = +200 -> int(54.98) = 54
        ({"cpu": 1000, "share": 200, "count": 1}, sig(200), (1,)),
        # whole card, 4000 CPU -> (0, 300), CPU 4000: A R=300, B 300, C 300 -> F = 300, d = 250 -> 56
        ({"cpu": 4000, "share": 1000, "count": 1}, sig(250), (0,)),
        # CPU-only 7500 -> CPU 500: A and B lack CPU -> R = 1300 each, F = 1300, d = -750 -> 32
        ({"cpu": 7500}, sig(-750), None),
    ],
    ids=["sharing-picks-fuller-card", "whole-card", "cpu-only"],
)
def test_scores_and_card(
    pod: dict[str, int], expected_score: int, expected_cards: tuple[int, ...] | None
) -> None:
    assert (sig(200), sig(250), sig(-750), sig(-150)) == (54, 56, 32, 46)
    state = sim_state((1000, 300), cpu=8000, cpu_free=8000)
    policy = fragmentation.FGD()
    p = sim_pod(**pod)
    assert policy.score_node(state, p.request, CTX).score == expected_score
    req = p.request.containers[0]
    if expected_cards is not None:
        assert req is not None
        eligible = tuple(i for i, f in enumerate((1000, 300)) if f >= p.share)
        assert policy.choose_cards_for_pod(state, p.request, req, eligible, CTX) == expected_cards


def test_first_card_wins_ties() -> None:
    # two identical free cards: the lower-numbered one is chosen
    state = sim_state((600, 600), cpu=8000)
    p = sim_pod(cpu=1000, share=500, count=1)
    req = p.request.containers[0]
    assert req is not None
    assert fragmentation.FGD().choose_cards_for_pod(state, p.request, req, (0, 1), CTX) == (0,)


def test_sigmoid_score_saturates() -> None:
    assert fragmentation.sigmoid_score(0.0) == 50
    assert fragmentation.sigmoid_score(-1e9) == 0
    assert fragmentation.sigmoid_score(1e5) == 100
