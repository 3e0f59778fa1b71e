"""Scenario a: many concurrent mixed pods while the extender is SIGKILLed three times.

Each round creates a mixed workload that over-fills the cluster from four threads, paced so that
binding goes on for several seconds; at three random moments (seeded) in that window the extender
is SIGKILLed and started again on the same port. Then the cluster settles and the audit must be
clean: no card over-committed, nobody bound without devices, no phantom reservation, no lock
left, and the restarted extender's per-card usage equal to the API's. ``GPUSLICE_CHAOS_REPEAT``
sets the number of rounds (default 1), each its own test; ``GPUSLICE_CHAOS_PODS`` and
``GPUSLICE_CHAOS_THREADS`` size the workload (default 96 pods from 4 threads).
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from tests.chaos import load
from tests.chaos.conftest import CARD_MIB, GPUS_PER_NODE, SCHEDULER, WORK_NODES, Chaos

pytestmark = pytest.mark.chaos

PODS = int(os.environ.get("GPUSLICE_CHAOS_PODS", "96"))
"""About 1.4 times the eight nodes' 32 cards (``load.demand_cards``): the cluster fills up."""
THREADS = int(os.environ.get("GPUSLICE_CHAOS_THREADS", "4"))
KILLS = 3


def repeat() -> int:
    """Rounds from ``GPUSLICE_CHAOS_REPEAT`` (default 1)."""
    return max(1, int(os.environ.get("GPUSLICE_CHAOS_REPEAT", "1")))


class BoundSampler:
    """Polls the namespace's bound-pod count in a thread: (monotonic time, count) samples."""

    def __init__(self, chaos: Chaos, ns: str, period_s: float = 0.2) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(chaos, ns, period_s), daemon=True)

    def _run(self, chaos: Chaos, ns: str, period_s: float) -> None:
        while not self._stop.wait(period_s):
            self.samples.append((time.monotonic(), len(chaos.bound(ns))))

    def __enter__(self) -> BoundSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def first_increase_after(self, t0: float) -> float | None:
        """Seconds from ``t0`` to the first sample with more bound pods than the last one before it."""
        before = [c for t, c in self.samples if t <= t0]
        base = before[-1] if before else 0
        return next((t - t0 for t, c in self.samples if t > t0 and c > base), None)


@pytest.mark.parametrize("round_", range(repeat()), ids=lambda r: f"round{r + 1}")
def test_sigkill_extender_during_mixed_load(chaos: Chaos, round_: int) -> None:
    ext = chaos.extender("chaos-main").start()
    chaos.point_scheduler(ext.url)
    rng = random.Random(20261201 + round_)
    ns = chaos.namespace(f"kill{round_}")
    bodies = load.mixed_pods(PODS, 1000 + round_, ns, SCHEDULER, node_names=WORK_NODES)
    demand = load.demand_cards(bodies, CARD_MIB)
    assert demand > 1.2 * len(WORK_NODES) * GPUS_PER_NODE, f"workload too small to fill the cluster: {demand}"
    pid_before = ext.pid
    restarts: list[float] = []
    ready_s: list[float] = []
    killed_with: list[int] = []
    with BoundSampler(chaos, ns) as sampler:
        creating = load.Background(chaos.cp, bodies, threads=THREADS, pace_s=0.25).start()
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.5, 2.5))
            ext.kill()
            killed_with.append(len(chaos.bound(ns)))
            time.sleep(rng.uniform(0.0, 1.0))
            t0 = time.monotonic()
            ext.start()
            restarts.append(t0)
            ready_s.append(time.monotonic() - t0)
        names = creating.join()
        quiet = chaos.wait_quiet(ns)
    assert len(names) == PODS
    assert ext.pid != pid_before and ext.running()
    report = chaos.audit(ext)
    first_bind = [sampler.first_increase_after(t) for t in restarts]
    print(
        f"\n[chaos a] round {round_ + 1}: demand {demand:.1f} cards on {len(WORK_NODES) * GPUS_PER_NODE}; "
        f"killed with {killed_with} pods bound; restart->ready {_fmt(ready_s)}; restart->first new bind "
        f"{_fmt(first_bind)}; quiet after {quiet:.1f} s; {report.summary()}"
    )
    report.assert_clean(f"round {round_ + 1}")
    # Contention was real: the cluster is full, so some pods are still waiting.
    assert report.pending, "every pod was placed: the workload did not fill the cluster"
    assert len(report.bound) + len(report.pending) == PODS


def _fmt(values: list[float] | list[float | None]) -> str:
    return "[" + ", ".join("-" if v is None else f"{v:.1f}s" for v in values) + "]"
