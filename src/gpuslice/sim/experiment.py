"""One (policy, seed) run of the FGD benchmark, and many of them in a process pool."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import msgspec
import numpy as np

from gpuslice.cache import shapes
from gpuslice.framework import registry
from gpuslice.model import config as model_config
from gpuslice.policy import api
from gpuslice.sim import engine, gangsim, lockwindow, metrics, trace, workload

J = TypeVar("J")
R = TypeVar("R")

WORKLOADS = ("oracle", "online")
"""Where FGD-style policies get their target workload: the whole trace (the paper's protocol) or,
as ``gpuslice serve`` does, a decayed histogram of the pods seen so far (``engine`` module docstring)."""


@dataclasses.dataclass(frozen=True)
class Job:
    """One run to do (``settings``: how the online workload is learned; unused by the oracle).

    ``lock``: HAMi's node lock modelled (bursts, a lock window per placement, the lock-aware choice
    with its margin; ``lockwindow``); None: no locks, the paper's protocol.

    ``gangs``: place gangs all-or-nothing (``gangsim``); None: every pod on its own (the paper's).
    """

    policy: str
    seed: int
    nodes: Path
    pods: Path
    tune: float = 1.3
    workload: str = "oracle"
    settings: model_config.WorkloadSettings = model_config.DEFAULT_WORKLOAD
    lock: lockwindow.LockModel | None = None
    gangs: gangsim.GangSpec | None = None


@dataclasses.dataclass(frozen=True)
class Result:
    """One run's figures.

    Attributes:
        policy: registry name.
        seed: workload seed.
        curve: a(x) for x = 0..130.
        pods_arrived: pods in the arrival sequence.
        pods_failed: pods that did not fit.
        wall_seconds: time of the scheduling loop.
        failed_shapes: (cpu, d, n) -> failed pods, for diagnosis.
        workload: ``oracle`` or ``online`` (``WORKLOADS``).
        settings: the learned-workload settings of an online run (None for the oracle).
        snapshots: target-workload snapshots an online run took.
        fallback_pods: pods an online run placed with the fallback policy.
        lock: the lock model of the run (None: no locks).
        locks: what the node locks did (None: no locks).
        first_failure_milli: milli-GPU allocated when the first pod did not fit (None: none failed).
        gangs: the run's gang setting (None: no gangs).
        gang_stats: what its gangs did (None: no gangs).
        final_used_milli: milli-GPU allocated after the last arrival.
        capacity_milli: the cluster's GPU capacity.
    """

    policy: str
    seed: int
    curve: np.ndarray
    pods_arrived: int
    pods_failed: int
    wall_seconds: float
    failed_shapes: dict[tuple[int, int, int], int]
    workload: str = "oracle"
    settings: model_config.WorkloadSettings | None = None
    snapshots: int = 0
    fallback_pods: int = 0
    lock: lockwindow.LockModel | None = None
    locks: lockwindow.Stats | None = None
    first_failure_milli: int | None = None
    gangs: gangsim.GangSpec | None = None
    gang_stats: gangsim.GangStats | None = None
    final_used_milli: int = 0
    capacity_milli: int = 0

    def unallocated(self, x: int) -> float:
        """U(x) in percent."""
        return metrics.unallocated(self.curve, x)

    def as_json(self) -> dict[str, object]:
        """The CLI's JSON record (``workload`` and its settings only for the non-default online workload)."""
        extra: dict[str, object] = {}
        if self.workload != "oracle":
            extra = {
                "workload": self.workload,
                "workload_settings": msgspec.to_builtins(self.settings),
                "workload_snapshots": self.snapshots,
                "fallback_pods": self.fallback_pods,
            }
        if self.lock is not None and self.locks is not None:
            extra["lock_model"] = dataclasses.asdict(self.lock)
            extra["locks"] = self.locks.as_json()
            first = self.first_failure_milli
            extra["gpus_at_first_failure"] = None if first is None else first / 1000
        if self.gangs is not None and self.gang_stats is not None:
            extra["gangs"] = {**self.gangs.as_json(), **self.gang_stats.as_json()}
            extra["gpu_demand_placed"] = self.final_used_milli / 1000
            cap = self.capacity_milli
            extra["final_gpu_allocation_pct"] = round(100 * self.final_used_milli / cap, 4) if cap else None
        return {
            "policy": self.policy,
            "seed": self.seed,
            "unallocated_gpu_pct": {
                "100": round(self.unallocated(100), 4),
                "130": round(self.unallocated(130), 4),
            },
            "pods_arrived": self.pods_arrived,
            "pods_failed": self.pods_failed,
            "wall_seconds": round(self.wall_seconds, 3),
            **extra,
        }


def _number(value: float) -> float | None:
    """A JSON-safe figure: rounded, None for NaN."""
    return None if math.isnan(value) else round(value, 4)


def run_job(job: Job) -> Result:
    """Load the trace, build the seed's arrivals and run the policy."""
    inventories = trace.load_nodes(job.nodes)
    w = workload.sorted_by_name(trace.load_pods(job.pods))
    target = workload.histogram(w)
    capacity = sum(len(inv.devices) for inv in inventories) * trace.FULL
    arr = workload.arrivals(w, len(inventories), capacity, job.seed, job.tune)
    ranked = [inventories[i] for i in arr.node_order.tolist()]
    policy = registry.get(job.policy)
    if job.workload not in WORKLOADS:
        raise ValueError(f"unknown workload {job.workload!r}; known: {', '.join(WORKLOADS)}")
    histogram = shapes.ShapeHistogram(registry.checked(job.settings)) if job.workload == "online" else None
    ctx = api.Context(
        workload=None if histogram is not None else target,
        rng=np.random.default_rng([job.seed, 1]),
        capacity=api.model_capacity(d.type for inv in inventories for d in inv.devices),
    )
    start = time.perf_counter()
    stats: gangsim.GangStats | None = None
    if job.gangs is None:
        out = engine.run(ranked, w, arr.seq, policy, ctx, histogram, job.lock)
    else:
        if job.lock is not None:
            raise ValueError("gangs with the node-lock model are not simulated")
        members = gangsim.groups(job.gangs, w, arr.seq, job.seed)
        ran = gangsim.run(ranked, w, arr.seq, members, policy, ctx, histogram, job.gangs.planner)
        out, stats = ran.outcome, ran.stats
    wall = time.perf_counter() - start
    failed: dict[tuple[int, int, int], int] = {}
    for k in out.failed:
        p = w[int(arr.seq[k])]
        key = (p.cpu_milli, p.share, p.count)
        failed[key] = failed.get(key, 0) + 1
    curve = metrics.allocation_curve(out.arrived, out.used, out.capacity_milli)
    return Result(
        job.policy,
        job.seed,
        curve,
        len(arr.seq),
        len(out.failed),
        wall,
        failed,
        job.workload,
        job.settings if histogram is not None else None,
        out.snapshots,
        out.fallback_pods,
        job.lock,
        out.locks,
        int(out.used[out.failed[0]]) if out.failed else None,
        job.gangs,
        stats,
        int(out.used[-1]) if len(out.used) else 0,
        out.capacity_milli,
    )


def run_all(
    jobs: Sequence[Job], workers: int, on_done: Callable[[Result], None] | None = None
) -> list[Result]:
    """Run the jobs (in a process pool when ``workers`` > 1), results in job order."""
    return run_many(run_job, jobs, workers, on_done)


def run_many(
    fn: Callable[[J], R], jobs: Sequence[J], workers: int, on_done: Callable[[R], None] | None = None
) -> list[R]:
    """``fn`` of every job, in job order (a process pool when ``workers`` > 1: ``fn`` module-level).

    ``on_done`` sees each result as it comes.
    """
    results: dict[int, R] = {}
    for idx, res in _iterate(fn, jobs, workers):
        results[idx] = res
        if on_done is not None:
            on_done(res)
    return [results[i] for i in range(len(jobs))]


def _iterate(fn: Callable[[J], R], jobs: Sequence[J], workers: int) -> Iterator[tuple[int, R]]:
    if workers <= 1 or len(jobs) <= 1:
        for idx, job in enumerate(jobs):
            yield idx, fn(job)
        return
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(fn, job): idx for idx, job in enumerate(jobs)}
        for fut in concurrent.futures.as_completed(futures):
            yield futures[fut], fut.result()
