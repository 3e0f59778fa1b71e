"""Time replay on a one-card cluster: waiting, departures, failures and the time-averaged allocation."""

from __future__ import annotations

import pytest

from gpuslice.policy import registry
from gpuslice.sim import replay, trace

pytestmark = pytest.mark.unit


def test_fifo_wait_and_average() -> None:
    inv = [trace.node_inventory("n0", 16000, 65536, 1, "T4")]
    pods = [
        trace.make_pod("a", 1000, 0, 1, 1000, creation=0, deletion=10),  # runs 0..10
        trace.make_pod("b", 1000, 0, 1, 1000, creation=4, deletion=9),  # waits 4..10, then runs 5 s
        trace.make_pod("c", 1000, 0, 1, 500, creation=8, deletion=30),  # waits 8..15 (b leaves at 15)
        trace.make_pod("d", 1000, 0, 0, 0, creation=20, deletion=21),  # CPU-only, fits at once
    ]
    r = replay.run(inv, pods, registry.get("fgd"), registry.EMPTY_CONTEXT)
    # arrival span 0..20: 1000 milli in use 0..15, then 500 (c) 15..20 -> (15000 + 2500) / 20 / 1000 = 87.5 %
    assert r.gpu_allocation_pct == pytest.approx(87.5) and r.peak_allocation_pct == pytest.approx(100.0)
    assert (r.waited, r.failed) == (2, 0)
    assert r.mean_wait_seconds == pytest.approx(((10 - 4) + (15 - 8)) / 2)


def test_never_fitting_pod_fails() -> None:
    inv = [trace.node_inventory("n0", 16000, 65536, 1, "T4")]
    pods = [trace.make_pod("big", 1000, 0, 2, 1000, creation=0, deletion=5)]
    r = replay.run(inv, pods, registry.get("fgd"), registry.EMPTY_CONTEXT)
    assert (r.waited, r.failed) == (0, 1)


def test_trace_without_times_is_refused() -> None:
    inv = [trace.node_inventory("n0", 16000, 65536, 1, "T4")]
    with pytest.raises(replay.ReplayError):
        replay.run(inv, [trace.make_pod("a", 1, 0, 0, 0)], registry.get("fgd"), registry.EMPTY_CONTEXT)
