"""HAMi's node lock in the FGD benchmark: pods arrive in bursts, and each placement locks its node.

HAMi's node lock (``hami.io/mutex.lock``) is taken at bind and released by the device plugin's
``Allocate``, which kubelet calls only once it admits the pod: one GPU pod per node at a time sits
in between. Measured with a real kubelet and HAMi's plugin, a burst of 40 one-card fractional pods
to one node bound in 81 s, about 2 s per pod (docs/node-choice.md). The model:

* **Arrivals.** Pod k of the benchmark's sequence arrives at ``(k // burst) * period_s +
  (k % burst) * gap_s``: bursts of ``burst`` pods, one every ``gap_s`` (kube-scheduler's cycle
  per pod), a new burst every ``period_s``. The order and the pods are the benchmark's; only the
  clock is added.
* **The lock window.** A GPU pod placed on a node holds the node's lock for ``window_s`` from the
  moment it gets it; a pod placed on a node whose lock is busy queues for it (FIFO), so the lock
  is next free at ``max(now, free_at) + window_s``. The capacity is taken at placement (the
  extender reserves the cards at bind, before the lock). Pods without GPUs take no lock.
* **The choice.** The lock-aware rule the extender runs (``policy.lockchoice.prefer_free`` over
  the policy's scores after its candidate step): with ``margin`` > 0, among the nodes within the
  margin of the best score, a node whose lock is free at the pod's arrival goes first. Margin 0
  places every pod where the benchmark without locks does; the waits are then what the policy's
  choice costs in bind time.

``Stats`` counts what the locks did: placements moved off the policy's best node, placements that
queued for a lock and how long, and each burst's span (first arrival to the last lock release of
its pods, i.e. the last ``Allocate``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from gpuslice.policy import lockchoice

WINDOW_S = 2.0
"""One ``Allocate`` with HAMi's device plugin behind a real kubelet: 40 pods in 81 s on one node."""
BURST = 40
"""Pods per burst (the measured burst)."""
GAP_S = 0.02
"""Between two pods of a burst: kube-scheduler's cycle with the extender's calls, about 50 pods/s."""
PERIOD_S = 120.0
"""Between the starts of two bursts: longer than a 40-pod burst takes on one node (80 s)."""


@dataclasses.dataclass(frozen=True)
class LockModel:
    """The lock window and arrival settings (module docstring); all times in seconds."""

    margin: float = 0.0
    window_s: float = WINDOW_S
    burst: int = BURST
    gap_s: float = GAP_S
    period_s: float = PERIOD_S

    def problems(self) -> list[str]:
        """What is wrong with the settings (empty when valid)."""
        out = []
        if not 0.0 <= self.margin <= 1.0:
            out.append(f"lock margin must be in [0, 1], got {self.margin!r}")
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            out.append(f"lock window must be > 0 s, got {self.window_s!r}")
        if self.burst < 1:
            out.append(f"burst must be >= 1 pod, got {self.burst}")
        if not (math.isfinite(self.gap_s) and self.gap_s >= 0):
            out.append(f"gap must be >= 0 s, got {self.gap_s!r}")
        if not (math.isfinite(self.period_s) and self.period_s >= self.burst * self.gap_s):
            span = self.burst * self.gap_s
            out.append(f"period must be >= burst x gap ({span:g} s), got {self.period_s!r}")
        return out

    def arrival(self, k: int) -> float:
        """Arrival time of pod k of the sequence."""
        return (k // self.burst) * self.period_s + (k % self.burst) * self.gap_s


@dataclasses.dataclass
class Stats:
    """What the locks did over one run.

    Attributes:
        placements: GPU pods placed (each takes its node's lock).
        moved: of them, placed off the policy's best node because its lock was busy.
        waited: of them, placed on a node whose lock was busy (their bind queues for it).
        wait_s: the total time those waited for the lock.
        max_wait_s: the longest wait.
        bursts: bursts with at least one GPU pod placed.
        burst_s: the total span of those bursts (first arrival to the last lock release).
        max_burst_s: the longest span.
    """

    placements: int = 0
    moved: int = 0
    waited: int = 0
    wait_s: float = 0.0
    max_wait_s: float = 0.0
    bursts: int = 0
    burst_s: float = 0.0
    max_burst_s: float = 0.0

    @property
    def mean_burst_s(self) -> float:
        """The mean burst span (NaN without bursts)."""
        return self.burst_s / self.bursts if self.bursts else math.nan

    def as_json(self) -> dict[str, float | int | None]:
        """The figures as a JSON record."""
        return {
            "placements": self.placements,
            "moved": self.moved,
            "waited": self.waited,
            "wait_s": round(self.wait_s, 3),
            "max_wait_s": round(self.max_wait_s, 3),
            "bursts": self.bursts,
            "mean_burst_s": round(self.mean_burst_s, 3) if self.bursts else None,
            "max_burst_s": round(self.max_burst_s, 3),
        }


class NodeLocks:
    """Each node's lock over a run: when it is next free, and the clock of the arrivals.

    Args:
        nodes: the cluster's node count (indices as in ``cluster.Cluster``).
        model: the settings.
    """

    def __init__(self, nodes: int, model: LockModel) -> None:
        problems = model.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.model = model
        self.free_at = np.zeros(nodes, np.float64)
        self.now = 0.0
        self.stats = Stats()
        self._burst = -1
        self._start = 0.0
        self._end: float | None = None

    def arrive(self, k: int) -> None:
        """Pod k of the sequence arrives: the clock moves to its arrival (a new burst may start)."""
        burst = k // self.model.burst
        self.now = self.model.arrival(k)
        if burst != self._burst:
            self.finish()
            self._burst, self._start = burst, self.now

    def locked(self, nodes: np.ndarray) -> np.ndarray:
        """True where the node's lock is busy now (held, or with binds queued for it)."""
        held: np.ndarray = self.free_at[nodes] > self.now
        return held

    def choose(self, scores: np.ndarray, cand: np.ndarray) -> tuple[int, bool]:
        """The position in ``cand`` the lock-aware rule picks, and whether the locks moved it.

        ``scores`` are the policy's scores of ``cand`` after its candidate step; ties go to the
        first position (the lowest rank), as in the benchmark.
        """
        plain = int(np.argmax(scores))
        keys = lockchoice.prefer_free(scores, self.locked(cand), self.model.margin)
        if keys is scores:
            return plain, False
        pick = int(np.argmax(keys))
        return pick, pick != plain

    def take(self, j: int, moved: bool) -> float:
        """A GPU pod placed on node j takes its lock (queueing behind the busy window); its wait."""
        start = max(self.now, float(self.free_at[j]))
        release = start + self.model.window_s
        self.free_at[j] = release
        wait = start - self.now
        s = self.stats
        s.placements += 1
        s.moved += moved
        if wait > 0:
            s.waited += 1
            s.wait_s += wait
            s.max_wait_s = max(s.max_wait_s, wait)
        self._end = release if self._end is None else max(self._end, release)
        return wait

    def finish(self) -> None:
        """Close the current burst's span (call once after the last pod)."""
        if self._end is not None:
            span = self._end - self._start
            self.stats.bursts += 1
            self.stats.burst_s += span
            self.stats.max_burst_s = max(self.stats.max_burst_s, span)
        self._end = None
