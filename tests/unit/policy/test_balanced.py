"""balanced: each component and the weighted total, with the arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from gpuslice.framework import registry
from gpuslice.model import nodes, requests
from gpuslice.policy import api, balanced, fit, thermal
from tests.unit.builders import node, pod

pytestmark = pytest.mark.unit

CTX = api.EMPTY_CONTEXT
POLICY = registry.get("balanced")

CASES = [
    # (id, state, pod, expected (U, A, T, F, score))
    (
        # 2 idle cards of 10000; the pod takes 5000 on card 0: u = (0.6 * 0.5, 0) = (0.3, 0)
        # std 0.15 -> U = 100 * (1 - 0.3) = 70; fractional on an idle card: A = 0;
        # no telemetry: T = 50; free 5000 >= 10 %: F = 100
        # 0.4 * 70 + 0.3 * 0 + 0.2 * 50 + 0.1 * 100 = 28 + 0 + 10 + 10 = 48
        "fractional-on-idle",
        node().gpus(2, memory=10000).state(),
        pod().gpu(1, memory=5000).obj(),
        (70.0, 0.0, 50.0, 100.0, 48),
    ),
    (
        # card 0 has 4000 used; spread-like choice takes idle card 1:
        # u = (0.6 * 0.4, 0.6 * 0.3) = (0.24, 0.18)
        # std 0.03 -> U = 94; card 1 was idle: A = 0; T = 50; F = 100
        # 37.6 + 0 + 10 + 10 = 57.6 -> 57
        "joins-emptier-card",
        node().gpus(2, memory=10000).used(0, memory=4000).state(),
        pod().gpu(1, memory=3000).obj(),
        (94.0, 0.0, 50.0, 100.0, 57),
    ),
    (
        # whole-card pod on card 1; card 0 held exclusively (100 cores): A = 100 * 1/1 = 100
        # u after = (0.6 * 1 + 0.4 * 1, 1.0) = (1, 1): U = 100; T = 50; free 0: F = 100
        # 40 + 30 + 10 + 10 = 90
        "whole-card-joins-whole-cards",
        node().gpus(2, memory=10000).used(0, memory=10000, cores=100).state(),
        pod().gpu(1, cores=100, pct=100).obj(),
        (100.0, 100.0, 50.0, 100.0, 90),
    ),
    (
        # one card, 9500 of 10000 taken: free 500 < 1000 -> stranded: F = 0
        # U = 100 (one card); A = 0; T: temperature 60 C -> 100 * 30/60 = 50, power 150/300 -> 50: 50
        # 40 + 0 + 10 + 0 = 50
        "stranded-sliver-and-telemetry",
        node()
        .gpus(1, memory=10000)
        .telemetry(0, temperature_c=60.0, power_draw_w=150.0, power_limit_w=300.0)
        .state(),
        pod().gpu(1, memory=9500).obj(),
        (100.0, 0.0, 50.0, 0.0, 50),
    ),
]


@pytest.mark.parametrize(("state", "req", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_components(
    state: nodes.NodeState, req: requests.PodRequest, expected: tuple[float, float, float, float, int]
) -> None:
    placed = fit.place(state, req, POLICY)
    assert placed.allocation is not None
    got = balanced.components(state, req, placed.allocation)
    assert got[:4] == pytest.approx(expected[:4])
    assert got[4] == expected[4]
    assert POLICY.score_node(state, req, CTX).score == expected[4]


def test_cooler_card_wins_ties() -> None:
    # both idle; card 0 at 85 C (headroom 100 * 5/60 = 8.3), card 1 at 40 C (83.3): take card 1
    state = node().gpus(2).telemetry(0, temperature_c=85.0).telemetry(1, temperature_c=40.0).state()
    req = requests.ContainerRequest(count=1, memory_mib=1)
    assert POLICY.choose_cards(state, req, (0, 1), CTX) == (1,)


def test_args_rejected() -> None:
    with pytest.raises(ValueError, match="no args"):
        registry.get("balanced", {"x": 1.0})


@pytest.mark.parametrize(
    ("readings", "expected"),
    [
        # temperature only: 100 * (90 - 45) / 60 = 75
        ({"temperature_c": 45.0}, 75.0),
        # power only: 100 * (1 - 100 / 400) = 75; a zero or missing limit is no reading
        ({"power_draw_w": 100.0, "power_limit_w": 400.0}, 75.0),
        ({"power_draw_w": 100.0, "power_limit_w": 0.0}, None),
        ({"power_draw_w": 100.0}, None),
        # both: the mean of 100 (20 C, clipped) and 0 (draw above the limit, clipped)
        ({"temperature_c": 20.0, "power_draw_w": 500.0, "power_limit_w": 400.0}, 50.0),
        ({}, None),
    ],
    ids=["temperature", "power", "zero-limit", "no-limit", "both-clipped", "none"],
)
def test_headroom(readings: dict[str, float], expected: float | None) -> None:
    t = nodes.CardTelemetry(uuid="GPU-x", **readings)  # type: ignore[arg-type]
    assert thermal.headroom(t) == expected
    assert thermal.headroom(None) is None


def test_sums_run_left_to_right() -> None:
    # 1 + 1e-16 + 1e-16: left to right each small term rounds away (1.0); a compensated or
    # pairwise sum keeps them (1.0000000000000002). Both paths of the score use the first.
    xs = [1.0, 1e-16, 1e-16]
    assert balanced._sum(xs) == 1.0
    assert balanced._seq_sum(np.array([xs]))[0] == 1.0
