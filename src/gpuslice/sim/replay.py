"""Time replay: pods arrive at their creation time and leave after their lifetime, on a virtual clock.

A pod that does not fit waits in a FIFO queue (at most ``QUEUE_LIMIT`` pods; later ones fail at
once). When a pod leaves node j, the queued pods that now fit node j are retried in queue order
(nothing else changed in their favour since they last failed, so node j is the only place they can
newly fit). After the last arrival the remaining departures run and pods still queued then fail.
Reported: the time-averaged GPU allocation over the arrival span, pods that waited, pods that failed.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
from rich.table import Table

from gpuslice.model import allocations, nodes
from gpuslice.policy import registry
from gpuslice.sim import cluster, engine, trace, workload

QUEUE_LIMIT = 1000
"""Most pods waiting at once."""


class ReplayError(ValueError):
    """A trace that cannot be replayed (no creation times)."""


@dataclasses.dataclass(frozen=True)
class ReplayJob:
    """One replay to do (the seed ranks the nodes and seeds the policy's random source)."""

    policy: str
    seed: int
    nodes: Path
    pods: Path


@dataclasses.dataclass(frozen=True)
class ReplayResult:
    """One replay's figures."""

    policy: str
    seed: int
    gpu_allocation_pct: float
    peak_allocation_pct: float
    pods_arrived: int
    pods_waited: int
    pods_failed: int
    mean_wait_seconds: float
    wall_seconds: float

    def as_json(self) -> dict[str, object]:
        """The CLI's JSON record for ``--replay``."""
        return {
            "policy": self.policy,
            "seed": self.seed,
            "mode": "replay",
            "time_avg_gpu_allocation_pct": round(self.gpu_allocation_pct, 4),
            "peak_gpu_allocation_pct": round(self.peak_allocation_pct, 4),
            "pods_arrived": self.pods_arrived,
            "pods_waited": self.pods_waited,
            "pods_failed": self.pods_failed,
            "mean_wait_seconds": round(self.mean_wait_seconds, 1),
            "wall_seconds": round(self.wall_seconds, 3),
        }


class Replayed(NamedTuple):
    """What a replay measured: time-averaged and peak GPU allocation %, pods waited/failed, mean wait."""

    gpu_allocation_pct: float
    peak_allocation_pct: float
    waited: int
    failed: int
    mean_wait_seconds: float


class _Queue:
    """Waiting pods in FIFO order, with numpy columns for a vectorised "fits node j" test."""

    def __init__(self, size: int) -> None:
        self.pod = np.zeros(size, np.int64)
        self.cpu = np.zeros(size, np.int64)
        self.mem = np.zeros(size, np.int64)
        self.share = np.zeros(size, np.int64)
        self.count = np.zeros(size, np.int64)
        self.since = np.zeros(size)
        self.live = np.zeros(size, bool)
        self.tail = 0
        self.waiting = 0

    def push(self, i: int, p: trace.TracePod, now: float) -> None:
        k = self.tail
        self.pod[k], self.cpu[k], self.mem[k] = i, p.cpu_milli, p.memory_mib
        self.share[k], self.count[k], self.since[k], self.live[k] = p.share, p.count, now, True
        self.tail += 1
        self.waiting += 1

    def fitting(self, live: cluster.Cluster, j: int) -> np.ndarray:
        """Queue slots (FIFO order) whose pod fits node j's free resources (model checked later)."""
        if not self.waiting:
            return np.zeros(0, np.int64)
        n = self.tail
        row = live.free[j]
        cards = (row[None, :] >= self.share[:n, None]).sum(axis=1)
        ok = (
            self.live[:n]
            & (self.cpu[:n] <= live.cpu_free[j])
            & (self.mem[:n] <= live.mem_free[j])
            & (cards >= self.count[:n])
        )
        return np.flatnonzero(ok)


def run(
    inventories: list[nodes.NodeInventory],
    pods: list[trace.TracePod],
    policy: registry.Policy,
    ctx: registry.Context,
) -> Replayed:
    """Replay the pods in creation order on the nodes (given in rank order)."""
    if any(p.creation is None for p in pods):
        raise ReplayError(
            "the pod list has no creation_time column; replay needs creation and deletion times"
        )
    live = cluster.Cluster(inventories)
    placer = engine.Placer(live, policy, ctx)
    order = sorted(range(len(pods)), key=lambda i: (pods[i].creation or 0.0, pods[i].name))
    departures: list[tuple[float, int, int, int, allocations.PodAllocation]] = []
    queue = _Queue(len(pods))
    used = 0
    area = 0.0
    last_t = (pods[order[0]].creation or 0.0) if order else 0.0
    start_t = last_t
    waited = failed = peak = 0
    wait_total = 0.0
    tick = 0

    def advance(t: float) -> None:
        nonlocal area, last_t
        area += used * max(0.0, t - last_t)
        last_t = max(last_t, t)

    def start(i: int, now: float) -> bool:
        nonlocal used, tick, peak
        p = pods[i]
        got = placer.place(p)
        if got is None:
            return False
        j, alloc = got
        used += p.gpu_milli
        peak = max(peak, used)
        life = max(0.0, (p.deletion or float("inf")) - (p.creation or 0.0))
        if life != float("inf"):
            tick += 1
            heapq.heappush(departures, (now + life, tick, i, j, alloc))
        return True

    def depart_until(t: float) -> None:
        nonlocal used, waited, wait_total
        while departures and departures[0][0] <= t:
            when, _, i, j, alloc = heapq.heappop(departures)
            advance(when)
            placer.remove(j, pods[i], alloc)
            used -= pods[i].gpu_milli
            for k in queue.fitting(live, j).tolist():
                qi = int(queue.pod[k])
                if start(qi, when):
                    queue.live[k] = False
                    queue.waiting -= 1
                    waited += 1
                    wait_total += when - float(queue.since[k])

    for i in order:
        now = pods[i].creation or 0.0
        depart_until(now)
        advance(now)
        if not start(i, now):
            if queue.waiting < QUEUE_LIMIT:
                queue.push(i, pods[i], now)
            else:
                failed += 1
    span = last_t - start_t
    pct = 100.0 * area / (span * live.capacity_milli) if span > 0 and live.capacity_milli else 0.0
    depart_until(float("inf"))  # after the last arrival: let the queue drain as pods leave
    failed += queue.waiting
    return Replayed(
        pct,
        100.0 * peak / live.capacity_milli if live.capacity_milli else 0.0,
        waited,
        failed,
        wait_total / waited if waited else 0.0,
    )


def run_job(job: ReplayJob) -> ReplayResult:
    """Load the trace, rank the nodes with the seed and replay it with the policy."""
    inventories = trace.load_nodes(job.nodes)
    pods = trace.load_pods(job.pods)
    rank = np.random.default_rng(job.seed).permutation(len(inventories))
    ranked = [inventories[i] for i in np.argsort(rank, kind="stable").tolist()]
    ctx = registry.Context(
        workload=workload.histogram(pods),
        rng=np.random.default_rng([job.seed, 1]),
    )
    t0 = time.perf_counter()
    r = run(ranked, pods, registry.get(job.policy), ctx)
    return ReplayResult(
        job.policy,
        job.seed,
        r.gpu_allocation_pct,
        r.peak_allocation_pct,
        len(pods),
        r.waited,
        r.failed,
        r.mean_wait_seconds,
        time.perf_counter() - t0,
    )


def table(results: list[ReplayResult]) -> Table:
    """A rich table of replay results."""
    t = Table(title="Trace replay (pods leave at their deletion time)")
    for col in ("policy", "seed", "avg GPU alloc %", "peak %", "arrived", "waited", "failed", "mean wait s"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in results:
        t.add_row(
            r.policy,
            str(r.seed),
            f"{r.gpu_allocation_pct:.2f}",
            f"{r.peak_allocation_pct:.2f}",
            str(r.pods_arrived),
            str(r.pods_waited),
            str(r.pods_failed),
            f"{r.mean_wait_seconds:.0f}",
        )
    return t
