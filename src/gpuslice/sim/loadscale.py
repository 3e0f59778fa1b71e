"""A loaded workload with departures, built from a trace's pod mix and durations (``--replay``).

The openb trace cannot be replayed as recorded and stay loaded: over its 149 days its pods offer
about 0.2 % of the cluster's GPUs, its first pods are survivors from months before the rest, and
a handful of pods that live for months carry most of its GPU-time (in the default pod list the 100
longest GPU pods hold 93 % of it). Compressing the recorded gaps by one factor keeps that shape:
a long lull, then a ramp. This module keeps what a trace says about each pod and draws a
stationary arrival process from it instead:

* **Duration.** A pod runs for ``deletion_time - scheduled_time`` (its time on a node in the traced
  cluster; our own queue adds our own wait), or ``deletion_time - creation_time`` when it has no
  ``scheduled_time`` (never scheduled there; the file lacks the column; or a scheduled time
  before creation). A pod without a deletion time runs until the trace's last recorded time, as
  the trace itself cuts off pods still running at its end. A pod without a creation time is left
  out (``Population.untimed``). Negative durations count as 0.
* **Arrivals.** Poisson arrivals at rate ``lam`` (their number fixed to the expected one); the
  k-th arriving pod is taken from a sequence of seeded permutations of the trace's pods (each
  pass uses every pod once, so a long-lived pod arrives as often as in the trace, not by the luck
  of sampling with replacement). The offered
  GPU load, the mean GPU demand of the pods whose duration has not elapsed since arrival (what a
  cluster with no queue would run), is ``lam * mean(g * L) / C`` for pods of demand ``g`` = n x d
  milli-GPU and duration ``L`` on ``C`` milli-GPU (Little's law), so ``lam = load * C / mean(g *
  L)``: one factor, taken from the trace. ``gap_factor`` says how much that compresses the
  trace's own mean inter-arrival gap.
* **Steady start.** At time 0 the cluster receives the population the same process would have
  running at any time (an M/G/infinity system in steady state): on average ``m_i = lam * L_i / N``
  copies of trace pod ``i`` (N pods), each with a remaining duration uniform on ``(0, L_i)``.
  Without it the months-long pods would need months of simulated arrivals (millions of pods) to
  build up. The count is ``floor(m_i + u)`` with ``u`` uniform on [0, 1) (mean ``m_i``, as the
  permutation deck fixes the mix) rather than Poisson: a Poisson count of a pod with a hundred
  copies of 8 GPUs moves the offered load by several points from seed to seed. These pods are
  placed at time 0 in a seeded random order, like the arrivals of the FGD benchmark.
* **Warm-up and window.** The placement still has to settle from that burst into the churn, so the
  figures leave out a warm-up ``[0, W)`` with ``W`` the ``warmup_quantile`` (0.9) quantile of the
  durations: by then nine in ten pods of the trace, by count, would have come and gone. The
  measured window ``[W, W + passes * N / lam)`` receives ``passes`` (1) times the trace's pod
  count in arrivals on average; the run stops at its end.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gpuslice.sim import trace

MAX_LOAD = 1.5
"""Largest target load accepted (above 1 the queue grows without bound; 1.5 shows how fast)."""
WARMUP_QUANTILE = 0.9
"""Quantile of the durations that makes the warm-up."""
TIME_COLUMNS = ("creation_time", "deletion_time")
"""Columns a replay needs (``scheduled_time`` is used when present)."""


class ReplayError(ValueError):
    """A trace or setting that cannot make a replay workload."""


class MissingColumnError(ReplayError):
    """The pod list lacks a column the replay needs.

    Attributes:
        column: the missing column's name.
    """

    def __init__(self, path: Path, column: str) -> None:
        """Name the file and the column."""
        super().__init__(f"{path}: no {column} column; --replay needs creation_time and deletion_time")
        self.column = column


@dataclasses.dataclass(frozen=True)
class Population:
    """The trace pods that have times, with what the replay draws from them.

    Attributes:
        index: positions in the pod list (file order) of the pods with a creation time.
        duration: run time in seconds of each of them (module docstring).
        gpu_milli: GPU demand n x d of each of them.
        creation: creation time of each of them (for ``gap_factor``).
        untimed: pods left out for lack of a creation time.
    """

    index: np.ndarray
    duration: np.ndarray
    gpu_milli: np.ndarray
    creation: np.ndarray
    untimed: int


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Arrivals in time order, each with its duration, and the measured window.

    Attributes:
        pod: index into the pod list of each arrival.
        arrival: arrival time in seconds (non-decreasing).
        duration: seconds the pod runs once started.
        window: the measured window ``[start, end)``; the replay stops at ``end``.
        rate: arrival rate ``lam`` in pods per second (0 for a hand-made schedule).
        initial: how many of the arrivals are the steady-state population at time 0.
        gap_factor: the trace's mean creation gap times ``rate`` (None without two timed pods).
        load: the target offered load, a fraction of GPU capacity (0 for a hand-made schedule).
    """

    pod: np.ndarray
    arrival: np.ndarray
    duration: np.ndarray
    window: tuple[float, float]
    rate: float = 0.0
    initial: int = 0
    gap_factor: float | None = None
    load: float = 0.0


def check_load(load: float) -> float:
    """``load`` if it is in (0, ``MAX_LOAD``]; ``ReplayError`` otherwise."""
    if not (0.0 < load <= MAX_LOAD) or math.isnan(load):
        raise ReplayError(f"load {load} is outside (0, {MAX_LOAD}]")
    return load


def _column(rows: list[dict[str, str]], key: str) -> np.ndarray:
    out = np.full(len(rows), np.nan)
    for i, row in enumerate(rows):
        raw = (row.get(key) or "").strip()
        if raw:
            try:
                out[i] = float(raw)
            except ValueError:
                raise ReplayError(f"bad {key} {raw!r} in row {i + 2}") from None
    return out


def population(path: Path, pods: Sequence[trace.TracePod]) -> Population:
    """Durations of the pods of ``path`` (``pods`` is ``trace.load_pods(path)``, same order)."""
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            columns = tuple(reader.fieldnames or ())
            rows = list(reader)
    except OSError as exc:
        raise ReplayError(f"{path}: {exc.strerror or exc}") from exc
    for col in TIME_COLUMNS:
        if col not in columns:
            raise MissingColumnError(path, col)
    if len(rows) != len(pods):
        raise ReplayError(f"{path}: {len(rows)} rows but {len(pods)} pods")
    creation = _column(rows, "creation_time")
    deletion = _column(rows, "deletion_time")
    scheduled = _column(rows, "scheduled_time") if "scheduled_time" in columns else np.full(len(rows), np.nan)
    return durations(creation, deletion, scheduled, np.array([p.gpu_milli for p in pods], np.int64))


def durations(
    creation: np.ndarray, deletion: np.ndarray, scheduled: np.ndarray, gpu_milli: np.ndarray
) -> Population:
    """The module docstring's duration rules over time columns (NaN = empty cell)."""
    recorded = np.concatenate([creation, deletion, scheduled])
    recorded = recorded[~np.isnan(recorded)]
    end_of_trace = float(recorded.max()) if len(recorded) else 0.0
    start = np.where(~np.isnan(scheduled) & (scheduled >= creation), scheduled, creation)
    end = np.where(np.isnan(deletion), end_of_trace, deletion)
    timed = ~np.isnan(creation)
    index = np.flatnonzero(timed)
    life = np.maximum(0.0, end[index] - start[index])
    return Population(index, life, gpu_milli[index].astype(np.int64), creation[index], int((~timed).sum()))


def arrival_rate(pop: Population, capacity_milli: int, load: float) -> float:
    """``lam = load * C / mean(g * L)``: pods per second that offer ``load`` of the capacity."""
    check_load(load)
    gpu_seconds = float(np.mean(pop.gpu_milli * pop.duration)) if len(pop.index) else 0.0
    if gpu_seconds <= 0.0 or capacity_milli <= 0:
        raise ReplayError("the trace's pods offer no GPU load (no GPU pod with a positive duration)")
    return load * capacity_milli / gpu_seconds


def warmup(pop: Population, quantile: float = WARMUP_QUANTILE) -> float:
    """The warm-up: the ``quantile`` of the durations (numpy's linear interpolation)."""
    return float(np.quantile(pop.duration, quantile)) if len(pop.duration) else 0.0


def build(
    pop: Population,
    capacity_milli: int,
    load: float,
    seed: int,
    passes: float = 1.0,
    warmup_quantile: float = WARMUP_QUANTILE,
) -> Schedule:
    """The seed's schedule at ``load`` (module docstring); ``Schedule.pod`` indexes the pod list."""
    if not passes > 0:
        raise ReplayError(f"passes {passes} must be positive")
    lam = arrival_rate(pop, capacity_milli, load)
    n = len(pop.index)
    w0 = warmup(pop, warmup_quantile)
    w1 = w0 + passes * n / lam
    rng = np.random.default_rng([seed, 2])
    mean = lam * pop.duration / n
    copies = np.floor(mean + rng.uniform(0.0, 1.0, n)).astype(np.int64)
    first = np.repeat(np.arange(n), copies)
    first = first[rng.permutation(len(first))]
    remaining = rng.uniform(0.0, 1.0, len(first)) * pop.duration[first]
    times = _poisson_times(rng, lam, w1)
    deck = (
        np.concatenate([rng.permutation(n) for _ in range(-(-len(times) // n))]) if len(times) else first[:0]
    )
    later = deck[: len(times)]
    span = float(pop.creation.max() - pop.creation.min()) if n > 1 else 0.0
    return Schedule(
        pod=pop.index[np.concatenate([first, later])],
        arrival=np.concatenate([np.zeros(len(first)), times]),
        duration=np.concatenate([remaining, pop.duration[later]]),
        window=(w0, w1),
        rate=lam,
        initial=len(first),
        gap_factor=span / (n - 1) * lam if span > 0 else None,
        load=load,
    )


def _poisson_times(rng: np.random.Generator, lam: float, end: float) -> np.ndarray:
    """``round(lam * end)`` arrival times uniform on ``(0, end)``, sorted.

    That is a rate-``lam`` Poisson process on ``(0, end)`` conditioned on its expected number of
    arrivals: the gaps are as memoryless, and the seed no longer moves the offered load by the
    count's own noise (about ``1 / sqrt(lam * end)``).
    """
    times = np.sort(rng.uniform(0.0, end, int(round(lam * end))))
    return times[times > 0.0]


def offered_pct(schedule: Schedule, gpu_milli: np.ndarray, capacity_milli: int) -> float:
    """Offered load over the window in % of capacity: every pod as if it started on arrival.

    ``gpu_milli`` is indexed like the pod list. 100 x sum(g x |[a, a + L) & window|) / (C x |window|).
    """
    w0, w1 = schedule.window
    if w1 <= w0 or capacity_milli <= 0:
        return 0.0
    lo = np.maximum(schedule.arrival, w0)
    hi = np.minimum(schedule.arrival + schedule.duration, w1)
    overlap = np.maximum(0.0, hi - lo)
    return float(100.0 * np.sum(gpu_milli[schedule.pod] * overlap) / (capacity_milli * (w1 - w0)))
