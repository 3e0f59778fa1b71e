"""The allocation curve a(x) and U(x) (fgd-experiment.md section 5)."""

from __future__ import annotations

import numpy as np
import pytest

from gpuslice.sim import metrics

pytestmark = pytest.mark.unit


def test_curve_with_gap_and_neighbours() -> None:
    # capacity 10000: arrived 100, 200, 400 -> x = 1, 2, 4; used 100, 200, 300 -> 1.0, 2.0, 3.0 %
    curve = metrics.allocation_curve(np.array([100, 200, 400]), np.array([100, 200, 300]), 10000, x_max=4)
    # a(0): no event at 0 -> the events at x = 1 (no x = -1): 1.0
    # a(3): none at 3 -> mean of events at 2 and 4: (2.0 + 3.0) / 2 = 2.5
    assert curve.tolist() == pytest.approx([1.0, 1.0, 2.0, 2.5, 3.0])
    assert metrics.unallocated(curve, 3) == pytest.approx(97.5)


def test_mean_over_events_and_go_rounding() -> None:
    # x = round(100 * 50 / 10000) = round(0.5) = 1 (half away from zero, unlike numpy's 0)
    # used 12345 of 1e6 -> 1.2345 % -> round to 2 decimals = 1.23; 12355 -> 1.2355 -> 1.24
    curve = metrics.allocation_curve(np.array([50, 10000]), np.array([0, 0]), 10000, x_max=1)
    assert curve[1] == pytest.approx(0.0)
    c2 = metrics.allocation_curve(np.array([10000, 10000]), np.array([12345, 12355]), 1_000_000, x_max=1)
    assert c2[1] == pytest.approx((1.23 + 1.24) / 2)


def test_far_gaps_carry_the_last_event_forward() -> None:
    # events at x = 10 (used 5 %) and x = 100: a(50) has no event at 49..51 -> the last event below, 5.0
    curve = metrics.allocation_curve(np.array([1000, 10000]), np.array([500, 9000]), 10000, x_max=100)
    assert curve[50] == pytest.approx(5.0) and curve[100] == pytest.approx(90.0)
    # before any event: NaN
    assert np.isnan(curve[5])


def test_go_round() -> None:
    assert metrics.go_round(np.array([0.5, 1.5, 2.5, -0.5])).tolist() == [1.0, 2.0, 3.0, -1.0]
