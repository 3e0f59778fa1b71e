"""Replay with departures: pods arrive, wait when nothing fits, run for their duration and leave.

The workload is a ``loadscale.Schedule`` (a trace's pod mix and durations at a target offered load,
see ``loadscale``). The event loop runs on a virtual clock:

* A departure at the same instant as an arrival happens first.
* An arriving pod that fits nowhere waits in a FIFO queue of at most ``QUEUE_LIMIT`` pods; one that
  arrives to a full queue is rejected (it never runs). When a pod leaves node j, the waiting pods
  that now fit node j are retried in queue order (nothing else changed in their favour since they
  last failed, so node j is the only place they can newly fit); a later pod may start before an
  earlier one that still does not fit (no head-of-line blocking, as kube-scheduler retries every
  unschedulable pod). A pod that starts runs for its full duration from then on.
* The replay stops at the end of the measured window; pods still waiting then never ran.

Figures, over the measured window ``[W, E)`` (``Schedule.window``, after the warm-up):

* ``unallocated_pct``: 100 x (1 - time-average of allocated milli-GPU / capacity).
* ``queued_time_pct``: the share of the window during which at least one pod was waiting.
* ``stranded_pct``: the time-average, over the window, of the unallocated GPU % counted only while
  at least one pod was waiting (0 at other times): capacity left idle while demand queued.
  ``stranded_pct <= unallocated_pct`` always.
* ``queued_demand_pct``: the time-average of the GPU demand (n x d) of the waiting pods, % of capacity.
* Per pod arriving in the window (pods arriving in the warm-up, the time-0 population included, are
  not counted): ``waited`` pods started later than they arrived; ``mean_wait`` and ``p99_wait`` are
  over all counted pods that started (0 for those placed on arrival; p99 by nearest rank, the
  ``ceil(0.99 n)``-th smallest); ``rejected`` found the queue full; ``still_queued`` were waiting at
  ``E``; pods that never ran = rejected + still queued.

With gangs (``--gangs generated``, ``gangsim``), the arrivals after the time-0 population are
grouped into gangs of consecutive GPU arrivals (``gangsim.generated``). A gang is offered when its
last member arrives (the members before it wait from their own arrival) and placed whole, or not
at all (``gangsim.GangPlacer``). A gang that does not fit waits in a FIFO of gangs (at most
``QUEUE_LIMIT`` members waiting there; a gang offered to a full one is rejected, all its members
never run); after each departure, once the single pods have been retried, the waiting gangs whose
GPU demand the free capacity covers are tried in FIFO order. Each member runs for its own traced
duration from the gang's start, so every member leaves and frees its cards, and the offered load
is the same as without gangs. Gangs in the FIFO count as waiting pods in the figures (queued time,
stranded and queued demand); a member's wait runs from its own arrival, so it includes the time
until its gang's last member arrived.

With a ``ShapeHistogram`` (``--workload online``) the target workload of FGD-style policies is built
from the requests as in ``engine.Placer``, each arrival observed once, at its first attempt that
finds a node with room for its host CPU and memory: the extender's filter observes a pod uid once
(``extender/http/app.py``), and kube-scheduler only calls it when its own filters leave a node.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from gpuslice.cache import shapes
from gpuslice.framework import gangs as framework_gangs
from gpuslice.framework import registry
from gpuslice.model import allocations, nodes
from gpuslice.model import config as model_config
from gpuslice.policy import api
from gpuslice.sim import cluster, engine, experiment, gangsim, loadscale, trace, workload

QUEUE_LIMIT = 1000
"""Most pods waiting at once; later arrivals are rejected while it is full."""
SAMPLES = 241
"""Points of the allocation-over-time curve, evenly spaced on [0, window end]."""
WORKLOADS = ("oracle", "online")
"""Where FGD-style policies get their target workload (as ``experiment.WORKLOADS``)."""

ReplayError = loadscale.ReplayError
MissingColumnError = loadscale.MissingColumnError


@dataclasses.dataclass(frozen=True)
class Replayed:
    """What one replay measured (module docstring for the definitions).

    Attributes:
        unallocated_pct: time-averaged unallocated GPU % over the window.
        stranded_pct: time-averaged unallocated GPU % while at least one pod waited.
        queued_time_pct: % of the window with at least one pod waiting.
        queued_demand_pct: time-averaged GPU demand of the waiting pods, % of capacity.
        peak_allocation_pct: highest allocated GPU % at any time of the run.
        arrived: pods that arrived in the window.
        waited: of those, pods that started after waiting.
        mean_wait: mean wait in seconds of the window's pods that started.
        p99_wait: their 99th percentile wait (nearest rank).
        max_wait: their longest wait.
        rejected: window pods that arrived to a full queue.
        still_queued: window pods waiting when the replay stopped.
        sample_times: times of ``sample_alloc``.
        sample_alloc: allocated GPU % at those times.
        never_ran_shapes: (cpu milli, d, n, GPU models) -> window pods that never ran, for diagnosis.
        waits: the wait of each window pod that started, in arrival order.
        gang_stats: what the gangs did over the whole run (None: no gangs).
    """

    unallocated_pct: float
    stranded_pct: float
    queued_time_pct: float
    queued_demand_pct: float
    peak_allocation_pct: float
    arrived: int
    waited: int
    mean_wait: float
    p99_wait: float
    max_wait: float
    rejected: int
    still_queued: int
    sample_times: np.ndarray
    sample_alloc: np.ndarray
    never_ran_shapes: dict[tuple[int, int, int, tuple[str, ...]], int] = dataclasses.field(
        default_factory=dict
    )
    waits: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    gang_stats: gangsim.GangStats | None = None

    @property
    def never_ran(self) -> int:
        """Rejected plus still queued."""
        return self.rejected + self.still_queued


@dataclasses.dataclass(frozen=True)
class ReplayJob:
    """One replay to do (the seed ranks the nodes, seeds the policy's random source and the workload).

    ``settings``: how the online target workload is learned (as ``experiment.Job``; unused by the oracle).
    """

    policy: str
    seed: int
    nodes: Path
    pods: Path
    load: float = 0.9
    passes: float = 1.0
    workload: str = "oracle"
    settings: model_config.WorkloadSettings = model_config.DEFAULT_WORKLOAD
    gangs: gangsim.GangSpec | None = None


@dataclasses.dataclass(frozen=True)
class ReplayResult:
    """One replay's figures with its setting."""

    policy: str
    seed: int
    workload: str
    load: float
    offered_pct: float
    schedule_rate: float
    gap_factor: float | None
    warmup_seconds: float
    end_seconds: float
    initial_pods: int
    untimed_pods: int
    figures: Replayed
    wall_seconds: float
    settings: model_config.WorkloadSettings | None = None
    gangs: gangsim.GangSpec | None = None

    def as_json(self) -> dict[str, object]:
        """The CLI's JSON record for ``--replay`` (``workload_settings`` only for the online workload)."""
        f = self.figures
        extra: dict[str, object] = {}
        if self.settings is not None:
            extra["workload_settings"] = msgspec.to_builtins(self.settings)
        if self.gangs is not None and f.gang_stats is not None:
            extra["gangs"] = {**self.gangs.as_json(), **f.gang_stats.as_json()}
        return {
            "policy": self.policy,
            "seed": self.seed,
            "mode": "replay",
            "workload": self.workload,
            "load": self.load,
            "offered_load_pct": round(self.offered_pct, 3),
            "arrival_rate_per_s": round(self.schedule_rate, 6),
            "gap_factor": None if self.gap_factor is None else round(self.gap_factor, 3),
            "window_seconds": [round(self.warmup_seconds, 1), round(self.end_seconds, 1)],
            "initial_pods": self.initial_pods,
            "untimed_pods": self.untimed_pods,
            "unallocated_gpu_pct": round(f.unallocated_pct, 4),
            "stranded_gpu_pct": round(f.stranded_pct, 4),
            "queued_time_pct": round(f.queued_time_pct, 3),
            "queued_demand_gpu_pct": round(f.queued_demand_pct, 4),
            "peak_gpu_allocation_pct": round(f.peak_allocation_pct, 4),
            "pods_arrived": f.arrived,
            "pods_waited": f.waited,
            "mean_wait_seconds": round(f.mean_wait, 2),
            "p99_wait_seconds": round(f.p99_wait, 2),
            "max_wait_seconds": round(f.max_wait, 2),
            "pods_never_ran": f.never_ran,
            "pods_rejected_queue_full": f.rejected,
            "pods_still_queued": f.still_queued,
            "wall_seconds": round(self.wall_seconds, 3),
            **extra,
        }


def nearest_rank(values: np.ndarray, q: float) -> float:
    """The ``ceil(q n)``-th smallest of ``values`` (0 for none)."""
    if not len(values):
        return 0.0
    k = max(1, math.ceil(q * len(values)))
    return float(np.partition(values, k - 1)[k - 1])


class _Queue:
    """Waiting pods in FIFO order, with numpy columns for a vectorised "fits node j" test."""

    def __init__(self, size: int) -> None:
        self.pod = np.zeros(size, np.int64)
        self.cpu = np.zeros(size, np.int64)
        self.mem = np.zeros(size, np.int64)
        self.share = np.zeros(size, np.int64)
        self.count = np.zeros(size, np.int64)
        self.live = np.zeros(size, bool)
        self.tail = 0
        self.waiting = 0
        self.demand = 0

    def push(self, k: int, p: trace.TracePod) -> None:
        """Append arrival k (pod p)."""
        if self.tail == len(self.pod):
            self._compact()
        s = self.tail
        self.pod[s], self.cpu[s], self.mem[s] = k, p.cpu_milli, p.memory_mib
        self.share[s], self.count[s], self.live[s] = p.share, p.count, True
        self.tail += 1
        self.waiting += 1
        self.demand += p.gpu_milli

    def drop(self, s: int, p: trace.TracePod) -> None:
        """Slot s (pod p) left the queue."""
        self.live[s] = False
        self.waiting -= 1
        self.demand -= p.gpu_milli

    def _compact(self) -> None:
        keep = np.flatnonzero(self.live[: self.tail])
        for col in (self.pod, self.cpu, self.mem, self.share, self.count, self.live):
            col[: len(keep)] = col[keep]
        self.live[len(keep) :] = False
        self.tail = len(keep)

    def fitting(self, live: cluster.Cluster, j: int, among: np.ndarray | None = None) -> np.ndarray:
        """Slots (FIFO order; of ``among`` if given) whose pod fits node j's free CPU, memory, cards.

        The GPU model is not checked here (``_fits`` does).
        """
        if among is None:
            if not self.waiting:
                return np.zeros(0, np.int64)
            if self.tail > 2 * self.waiting + 64:
                self._compact()
            among = np.arange(self.tail)
        cards = (live.free[j][None, :] >= self.share[among, None]).sum(axis=1)
        ok = (
            self.live[among]
            & (self.cpu[among] <= live.cpu_free[j])
            & (self.mem[among] <= live.mem_free[j])
            & (cards >= self.count[among])
        )
        out: np.ndarray = among[ok]
        return out


class _OncePlacer(engine.Placer):
    """``engine.Placer`` that observes each arrival once (set ``arrival`` before ``place``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrival = -1
        self._seen: set[int] = set()

    def observe(self, pod: trace.TracePod) -> None:
        """Observe the current arrival unless it was; as ``engine.Placer.observe``, only with a host."""
        if self.histogram is None or self.arrival in self._seen:
            return
        live = self.live
        host = np.any((live.cpu_free >= pod.cpu_milli) & (live.mem_free >= pod.memory_mib))
        if pod.count > 0 and not host:
            return  # not observed by engine.Placer either: the extender's filter is not asked yet
        self._seen.add(self.arrival)
        super().observe(pod)


def _fits(live: cluster.Cluster, j: int, p: trace.TracePod) -> bool:
    """Whether pod p fits node j now (the pre-filter of ``cluster.Cluster.feasible`` for one node)."""
    if live.cpu_free[j] < p.cpu_milli or live.mem_free[j] < p.memory_mib:
        return False
    if p.count <= 0:
        return True
    if p.types and not live.type_mask(p.types)[j]:
        return False
    return int((live.free[j] >= p.share).sum()) >= p.count


def run(
    inventories: Sequence[nodes.NodeInventory],
    pods: Sequence[trace.TracePod],
    schedule: loadscale.Schedule,
    policy: api.Policy,
    ctx: api.Context,
    histogram: shapes.ShapeHistogram | None = None,
    queue_limit: int = QUEUE_LIMIT,
    samples: int = SAMPLES,
    gangs: Sequence[Sequence[int]] | None = None,
    planner: str = "trial",
) -> Replayed:
    """Replay ``schedule`` on the nodes (given in rank order) with the policy (module docstring).

    ``gangs``: positions in the schedule placed all-or-nothing (``planner``: ``gangsim.PLANNERS``).
    """
    live = cluster.Cluster(inventories if gangs is None else gangsim.rank_named(inventories))
    placer = _OncePlacer(live, policy, ctx, histogram)
    gang_placer = gangsim.GangPlacer(placer, planner)
    gang_of: dict[int, int] = {}
    last: dict[int, int] = {}
    for n_gang, gang in enumerate(gangs or ()):
        for q in gang:
            gang_of[q] = n_gang
        if gang:
            last[n_gang] = max(gang)
    stats = gangsim.GangStats() if gangs is not None else None
    waiting_gangs: list[int] = []
    gang_waiting = gang_demand = 0
    cap = live.capacity_milli
    arrival = np.asarray(schedule.arrival, dtype=np.float64)
    duration = np.asarray(schedule.duration, dtype=np.float64)
    index = np.asarray(schedule.pod, dtype=np.int64).tolist()
    n = len(index)
    if n and np.any(np.diff(arrival) < 0):
        raise ValueError("schedule arrivals must be in time order")
    w0, w1 = schedule.window
    started = np.full(n, np.nan)
    rejected = np.zeros(n, bool)
    queue = _Queue(max(16, min(n, 2 * queue_limit)))
    departures: list[tuple[float, int, int, int, allocations.PodAllocation]] = []
    sample_t = np.linspace(0.0, w1, samples) if samples > 0 else np.zeros(0)
    sample_v = np.zeros(len(sample_t))
    used = peak = tick = si = 0
    last_t = 0.0
    area = stranded = busy = queued = 0.0

    def advance(t: float) -> None:
        nonlocal area, stranded, busy, queued, last_t, si
        lo, hi = max(last_t, w0), min(t, w1)
        if hi > lo:
            area += used * (hi - lo)
            if queue.waiting or gang_waiting:
                stranded += (cap - used) * (hi - lo)
                busy += hi - lo
                queued += (queue.demand + gang_demand) * (hi - lo)
        while si < len(sample_t) and sample_t[si] < t:
            sample_v[si] = used
            si += 1
        last_t = max(last_t, t)

    def start(k: int, now: float) -> bool:
        nonlocal used, peak, tick
        p = pods[index[k]]
        placer.arrival = k
        got = placer.place(p)
        if got is None:
            return False
        j, alloc = got
        used += p.gpu_milli
        peak = max(peak, used)
        started[k] = now
        tick += 1
        heapq.heappush(departures, (now + float(duration[k]), tick, k, j, alloc))
        return True

    def start_gang(g: int, now: float) -> bool:
        nonlocal used, peak, tick
        assert gangs is not None and stats is not None
        positions = list(gangs[g])
        members = [pods[index[q]] for q in positions]
        for q, p in zip(positions, members, strict=True):
            placer.arrival = q
            placer.observe(p)
        got = gang_placer.place(members, observed=True)
        if isinstance(got, framework_gangs.Short):
            return False
        for q, p, (j, alloc) in zip(positions, members, got, strict=True):
            used += p.gpu_milli
            started[q] = now
            tick += 1
            heapq.heappush(departures, (now + float(duration[q]), tick, q, j, alloc))
        peak = max(peak, used)
        stats.placed += 1
        stats.members_placed += len(members)
        stats.demand_placed_milli += sum(p.gpu_milli for p in members)
        return True

    def gang_demand_of(g: int) -> int:
        assert gangs is not None
        return sum(pods[index[q]].gpu_milli for q in gangs[g])

    def retry_gangs(when: float, j: int) -> None:
        """After a departure from node j: the waiting gangs that may now fit, in FIFO order.

        A gang none of whose members fits node j now fails as it did before (the rest of the
        cluster only lost room since its last try, and with a fixed target workload the scores
        that chose its members' nodes are the same), so only the others are tried.
        """
        nonlocal gang_waiting, gang_demand
        assert gangs is not None
        for g in list(waiting_gangs):
            demand = gang_demand_of(g)
            if demand > cap - used or not any(_fits(live, j, pods[index[q]]) for q in gangs[g]):
                continue
            if start_gang(g, when):
                waiting_gangs.remove(g)
                gang_waiting -= len(gangs[g])
                gang_demand -= demand

    def offer_gang(g: int, now: float) -> None:
        nonlocal gang_waiting, gang_demand
        assert gangs is not None and stats is not None
        size = len(gangs[g])
        demand = gang_demand_of(g)
        stats.offered += 1
        stats.members_offered += size
        stats.demand_offered_milli += demand
        if start_gang(g, now):
            return
        if gang_waiting + size <= queue_limit:
            waiting_gangs.append(g)
            gang_waiting += size
            gang_demand += demand
        else:
            stats.rejected += 1
            rejected[list(gangs[g])] = True

    def depart_until(t: float) -> None:
        nonlocal used
        while departures and departures[0][0] <= t:
            when, _, k, j, alloc = heapq.heappop(departures)
            advance(when)
            p = pods[index[k]]
            placer.remove(j, p, alloc)
            used -= p.gpu_milli
            cand = queue.fitting(live, j)
            while len(cand):
                s = int(cand[0])
                qk = int(queue.pod[s])
                qp = pods[index[qk]]
                if _fits(live, j, qp) and start(qk, when):
                    queue.drop(s, qp)
                    cand = queue.fitting(live, j, cand[1:])  # node j has less room now
                else:
                    cand = cand[1:]
            if waiting_gangs:
                retry_gangs(when, j)

    for k in range(n):
        now = float(arrival[k])
        if now >= w1:
            break
        depart_until(now)
        advance(now)
        g = gang_of.get(k)
        if g is not None:
            if last[g] == k:
                offer_gang(g, now)
            continue
        if stats is not None:
            stats.singles += 1
        if not start(k, now):
            if queue.waiting < queue_limit:
                queue.push(k, pods[index[k]])
            else:
                rejected[k] = True
    depart_until(w1)
    advance(w1)
    sample_v[si:] = used

    counted = (arrival >= w0) & (arrival < w1)
    counted[: schedule.initial] = False  # the time-0 population was already running
    ran = counted & ~np.isnan(started)
    waits = started[ran] - arrival[ran]
    span = w1 - w0
    denom = cap * span if span > 0 and cap else 0.0
    shapes_out: dict[tuple[int, int, int, tuple[str, ...]], int] = {}
    for k in np.flatnonzero(counted & np.isnan(started)).tolist():
        p = pods[index[k]]
        key = (p.cpu_milli, p.share, p.count, p.types)
        shapes_out[key] = shapes_out.get(key, 0) + 1
    return Replayed(
        unallocated_pct=100.0 * (1.0 - area / denom) if denom else 0.0,
        stranded_pct=100.0 * stranded / denom if denom else 0.0,
        queued_time_pct=100.0 * busy / span if span > 0 else 0.0,
        queued_demand_pct=100.0 * queued / denom if denom else 0.0,
        peak_allocation_pct=100.0 * peak / cap if cap else 0.0,
        arrived=int(counted.sum()),
        waited=int((waits > 0).sum()),
        mean_wait=float(waits.mean()) if len(waits) else 0.0,
        p99_wait=nearest_rank(waits, 0.99),
        max_wait=float(waits.max()) if len(waits) else 0.0,
        rejected=int((counted & rejected).sum()),
        still_queued=int((counted & np.isnan(started) & ~rejected).sum()),
        sample_times=sample_t,
        sample_alloc=100.0 * sample_v / cap if cap else sample_v,
        never_ran_shapes=shapes_out,
        waits=waits,
        gang_stats=stats,
    )


def run_job(job: ReplayJob) -> ReplayResult:
    """Load the trace, build the seed's schedule, rank the nodes with the seed and replay."""
    if job.workload not in WORKLOADS:
        raise ValueError(f"unknown workload {job.workload!r}; known: {', '.join(WORKLOADS)}")
    inventories = trace.load_nodes(job.nodes)
    pods = trace.load_pods(job.pods)
    pop = loadscale.population(job.pods, pods)
    rank = np.random.default_rng(job.seed).permutation(len(inventories))
    ranked = [inventories[i] for i in np.argsort(rank, kind="stable").tolist()]
    capacity = sum(len(inv.devices) for inv in inventories) * trace.FULL
    schedule = loadscale.build(pop, capacity, job.load, job.seed, job.passes)
    histogram = shapes.ShapeHistogram(registry.checked(job.settings)) if job.workload == "online" else None
    ctx = api.Context(
        workload=None if histogram is not None else workload.histogram(pods),
        rng=np.random.default_rng([job.seed, 1]),
        capacity=api.model_capacity(d.type for inv in ranked for d in inv.devices),
    )
    members = None
    planner = "trial"
    if job.gangs is not None:
        if job.gangs.mode != "generated":
            raise gangsim.GangError(
                "the replay makes generated gangs only (its arrivals are drawn, not traced)"
            )
        members = gangsim.generated(pods, schedule.pod, job.gangs.sizes, job.seed, schedule.initial)
        planner = job.gangs.planner
    t0 = time.perf_counter()
    figures = run(
        ranked, pods, schedule, registry.get(job.policy), ctx, histogram, gangs=members, planner=planner
    )
    wall = time.perf_counter() - t0
    gpu = np.array([p.gpu_milli for p in pods], np.int64)
    return ReplayResult(
        policy=job.policy,
        seed=job.seed,
        workload=job.workload,
        load=job.load,
        offered_pct=loadscale.offered_pct(schedule, gpu, capacity),
        schedule_rate=schedule.rate,
        gap_factor=schedule.gap_factor,
        warmup_seconds=schedule.window[0],
        end_seconds=schedule.window[1],
        initial_pods=schedule.initial,
        untimed_pods=pop.untimed,
        figures=figures,
        wall_seconds=wall,
        settings=job.settings if histogram is not None else None,
        gangs=job.gangs,
    )


def check(pods: Path) -> None:
    """Raise ``ReplayError`` (``MissingColumnError`` naming the column) if ``pods`` cannot be replayed."""
    loadscale.population(pods, trace.load_pods(pods))


def run_all(
    jobs: Sequence[ReplayJob], workers: int, on_done: Callable[[ReplayResult], None] | None = None
) -> list[ReplayResult]:
    """Run the jobs (in a process pool when ``workers`` > 1), results in job order."""
    return experiment.run_many(run_job, jobs, workers, on_done)
