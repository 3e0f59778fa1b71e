"""GPU-aware preemption: evict lower-priority pods to free concrete cards (docs/preemption.md).

kube-scheduler's own preemption never finds victims for a GPU shortage (the GPU resources are
hidden from its fit), so this module does it, on the leader only and off the request path:

1. **Trigger.** ``consider`` is called by the filter when a GPU pod fits no node and at least one
   node failed for GPU capacity alone (``GPU_REASONS``: freeing cards could help there). Pods
   with ``preemptionPolicy: Never``, pods holding a nomination already and pods tried within
   ``RETRY_S`` are left alone; one attempt runs per pod UID at a time, as a background task.
2. **Victims.** For every such node, ``policy.victims.select_on_node`` on the cache's snapshot:
   the residents are the pods the cache charges there, with the priority and labels the pod
   watch saw (a pod the watch does not know, or one still being bound, is never a victim), and
   the PodDisruptionBudgets listed once per attempt, so on every node the sets no budget
   protects are preferred. The best few nodes are looked at again with their pods read from the
   API (fresh labels, and the start times kube-scheduler breaks ties with); candidates are
   ordered as kube-scheduler orders them (``victims.order``).
3. **Budgets.** If the best candidate still needs a pod a budget protects, nothing is evicted:
   a Warning ``PreemptionBlocked`` event on the preemptor names the budget(s).
4. **Nomination, then evictions.** The preemptor's cards are nominated (``framework.nominations``,
   which the cache applies; held for ``nomination_ttl_s``; every other pod's filter and bind see
   them taken) *before* the first
   eviction, so the capacity each victim frees is held from the moment it frees. Victims are
   evicted through the Eviction API (``kube.evictions``), most important first; a refusal by a
   budget (429) or any failure stops the evictions for this pod, releases the nomination and
   is reported in a Warning event. Events: ``Preempting`` on the preemptor (node, cards,
   victims) and ``Preempted`` on each victim (preemptor and cards).
5. **Hand-over.** The preemptor's filter sees its own cards free (``snapshot``); when
   kube-scheduler binds it on the nominated node, ``binding`` claims the nomination so the bind
   path's fit sees them free too, and the bind's ``assume`` converts it atomically. The sweep
   (``running``) releases nominations that expired or whose pod was deleted or bound elsewhere.

Gangs (docs/gangs.md) are evicted whole or not at all: a gang member is never a victim, and a
gang member waiting for GPUs starts no preemption (freeing room for one member frees none for
its gang, which is planned whole).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Protocol

from gpuslice.cache import cache as caches
from gpuslice.cache import snapshot as snapshots
from gpuslice.extender import metrics, parsing, tasks
from gpuslice.extender.binding import bind as binds
from gpuslice.framework import cycle as cycles
from gpuslice.framework import logs, memo, nominations, scheduling, view
from gpuslice.framework import profile as profiles
from gpuslice.kube import client as kclient
from gpuslice.kube import errors as kerrors
from gpuslice.kube import evictions, objects
from gpuslice.model import allocations, requests, status
from gpuslice.policy import victims

GPU_REASONS = frozenset(
    (
        status.INSUFFICIENT_GPU_MEMORY,
        status.INSUFFICIENT_GPU_CORES,
        status.INSUFFICIENT_GPU_COUNT,
        status.GPU_SLOTS_EXHAUSTED,
        status.EXCLUSIVE_CONFLICT,
        status.NUMA_UNSATISFIED,
    )
)
"""Filter reasons that freeing cards can cure (not host CPU or memory, quota, locks, health)."""
RETRY_S = 5.0
"""A pod is not considered again this soon after an attempt that evicted nobody."""
BUDGET_NODES = 3
"""How many of the best nodes are examined again, with their pods read from the API, before the
decision (when budgets exist)."""
CHUNK = 64
"""Nodes examined between two yields to the event loop in the first pass."""
SWEEP_S = 1.0
"""Period of the nomination sweep."""
NORMAL, WARNING = "Normal", "Warning"
ACTION = "Preempt"


class Cache(Protocol):
    """The cache operations preemption uses (``cache.ClusterCache``)."""

    def snapshot(self) -> snapshots.Snapshot:
        """The plain snapshot (nominations count as taken)."""
        ...

    def snapshot_for(self, key: str) -> snapshots.Snapshot:
        """The snapshot with the pod's own nomination left out."""
        ...

    def pods_on(self, node: str) -> tuple[caches.HeldPod, ...]:
        """What each pod charged on the node holds."""
        ...

    def nominate(self, key: str, uid: str, alloc: allocations.PodAllocation, expires_at: float) -> bool:
        """Hold cards for a preemptor (in its nominator), if the node is known."""
        ...


Pods = Callable[[str], objects.Pod | None]
"""The pod watch's store (``feed.Feed.pod``): the pod as the watch last saw it."""


def _in_gang(pod: objects.Pod) -> bool:
    """True when the pod names a gang (well-formed or not: never evict a member by mistake)."""
    meta, spec = pod.metadata, pod.spec
    return (
        parsing.gang_of(
            meta.namespace, meta.labels, meta.annotations, spec.scheduling_group, spec.workload_ref
        )
        is not None
    )


def gpu_candidates(outcome: scheduling.FilterOutcome) -> list[str]:
    """The nodes the filter rejected for GPU capacity alone, sorted."""
    return sorted(n for n, why in outcome.failed.items() if set(why.split(",")) <= GPU_REASONS)


def describe_victims(chosen: Iterable[victims.Resident]) -> str:
    """``ns/a (priority 1), ns/b (priority 1)`` for events."""
    return ", ".join(f"{v.key} (priority {v.priority})" for v in chosen)


class Preemption:
    """The preemption orchestrator of one extender process (see the module docstring).

    Args:
        kube: API client (evictions, budgets, the pods of a node).
        cache: the cluster cache.
        profile: the scheduling profile (the same fit as filter and bind).
        events: where events go.
        metrics_: preemption and eviction counters.
        log: logger.
        pods: the pod watch's store (priorities, preemptors that went away).
        leading: True while this replica leads (only the leader preempts); required, so the gate
            is never open by default.
        nominator: the nominations the cache applies (the one given to ``cache``).
        ttl_s: how long a nomination holds the freed cards.
        clock: wall clock for nomination deadlines.
        evict: how a victim is evicted (default: the Eviction API through ``kube``).
        budgets: how the PodDisruptionBudgets are read (default: listed through ``kube``; none
            without a client).
    """

    def __init__(
        self,
        kube: kclient.KubeClient | None,
        cache: Cache,
        profile: profiles.Profile,
        events: binds.Events,
        metrics_: metrics.Metrics,
        log: logs.Log,
        pods: Pods,
        *,
        leading: Callable[[], bool],
        nominator: nominations.Nominator,
        ttl_s: float = 60.0,
        clock: Callable[[], float] = time.time,
        evict: Callable[[victims.Resident], Awaitable[evictions.Result]] | None = None,
        budgets: Callable[[], Awaitable[list[victims.Budget]]] | None = None,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.profile = profile
        self.events = events
        self.metrics = metrics_
        self.log = log
        self.pods = pods
        self.leading = leading
        self.nominator = nominator
        self.ttl_s = ttl_s
        self.clock = clock
        self.evict = evict or self._evict
        self.budgets = budgets or self._budgets
        self.monotonic: Callable[[], float] = time.monotonic
        self._running: dict[str, asyncio.Task[None]] = {}
        self._tried = memo.Memo(4096, 2 << 20)  # uid -> monotonic time of the last attempt

    # ----- hooks from the handlers

    def snapshot(self, pod: requests.PodRequest) -> view.Snapshot:
        """The snapshot the pod's filter reads: its own nominated cards free, others' taken."""
        return self.cache.snapshot_for(f"{pod.namespace}/{pod.name}")

    def binding(self, key: str, uid: str, node: str) -> None:
        """kube-scheduler binds ``key`` on ``node``: hand its nomination there to the bind path."""
        nom = self.nominator.nomination(key)
        if nom is not None and nom.alloc.node == node:
            self.nominator.claim(key, uid)

    def consider(
        self,
        pod: requests.PodRequest,
        spec_priority: int | None,
        policy: str | None,
        outcome: scheduling.FilterOutcome,
    ) -> bool:
        """Start a preemption attempt for a pod the filter could not place; True when one started."""
        if outcome.feasible or not pod.wants_gpu or not pod.uid or pod.gang is not None or not self.leading():
            return False
        priority = victims.DEFAULT_PRIORITY if spec_priority is None else spec_priority
        if not victims.can_preempt(priority, policy) or pod.uid in self._running:
            return False
        key = f"{pod.namespace}/{pod.name}"
        if self.nominator.nomination(key) is not None:
            return False  # its victims are leaving; the nomination holds their cards
        last = self._tried.get(pod.uid)
        now = self.monotonic()
        if last is not None and now - last < RETRY_S:
            return False
        nodes = gpu_candidates(outcome)
        if not nodes:
            return False
        self._tried.put(pod.uid, now)
        task = asyncio.get_running_loop().create_task(
            self._attempt(pod, priority, nodes), name=f"preempt-{key}"
        )
        self._running[pod.uid] = task
        task.add_done_callback(lambda _: self._running.pop(pod.uid, None))
        return True

    async def wait_idle(self) -> None:
        """Wait until no attempt runs (tests, shutdown)."""
        while self._running:
            await asyncio.gather(*list(self._running.values()), return_exceptions=True)

    # ----- one attempt

    def residents(self, node: str) -> list[victims.Resident]:
        """The pods on ``node`` that could be victims, with the priority the watch saw."""
        out = []
        for held in self.cache.pods_on(node):
            if held.state is not caches.PodState.ADDED or not held.reservation:
                continue  # a bind in flight, or a pod without cards: never a victim
            pod = self.pods(held.key)
            if pod is None or pod.metadata.uid != held.uid:
                continue  # not (yet) known to the watch: priority unknown
            if _in_gang(pod):
                continue  # a gang is evicted whole or not at all: never one member
            priority = pod.spec.priority
            out.append(
                victims.Resident(
                    key=held.key,
                    uid=held.uid,
                    priority=victims.DEFAULT_PRIORITY if priority is None else priority,
                    reservation=held.reservation,
                    cpu_milli=held.cpu_milli,
                    memory_mib=held.memory_mib,
                    labels=tuple(sorted(pod.metadata.labels.items())),
                )
            )
        return out

    def candidates(
        self,
        snap: view.Snapshot,
        pod: requests.PodRequest,
        priority: int,
        nodes: Sequence[str],
        budgets: Sequence[victims.Budget] = (),
        labelled: dict[str, list[victims.Resident]] | None = None,
    ) -> list[victims.Candidate]:
        """The candidates on ``nodes``, best first (``labelled``: residents read from the API)."""
        cyc = cycles.Cycle.of(self.profile, snap, pod)
        found = []
        for name in nodes:
            state = cyc.state(name)
            if state is None:
                continue
            residents = (labelled or {}).get(name)
            if residents is None:
                residents = self.residents(name)
            c = victims.select_on_node(state, residents, pod, priority, cyc.cards, cyc.ctx, budgets)
            if c is not None:
                found.append(c)
        return victims.order(found)

    async def _labelled(self, node: str) -> list[victims.Resident]:
        """The node's residents with labels and start times from the API (for budgets)."""
        assert self.kube is not None
        by_key = {r.key: r for r in self.residents(node)}
        out = []
        for p in await evictions.pods_on_node(self.kube, node):
            r = by_key.get(p.key)
            if r is None or r.uid != p.metadata.uid:
                continue
            labels = tuple(sorted(p.metadata.labels.items()))
            out.append(
                victims.Resident(
                    key=r.key,
                    uid=r.uid,
                    priority=r.priority,
                    reservation=r.reservation,
                    cpu_milli=r.cpu_milli,
                    memory_mib=r.memory_mib,
                    labels=labels,
                    start=evictions.start_time(p),
                )
            )
        return out

    async def _attempt(self, pod: requests.PodRequest, priority: int, nodes: Sequence[str]) -> None:
        key = f"{pod.namespace}/{pod.name}"
        try:
            outcome = await self.preempt(pod, priority, nodes)
        except Exception as err:  # noqa: BLE001 - a background attempt must never die silently
            self.log.error("preemption failed unexpectedly", pod=key, err=repr(err))
            outcome = "failed"
        self.metrics.preemptions.labels(outcome).inc()

    async def preempt(self, pod: requests.PodRequest, priority: int, nodes: Sequence[str]) -> str:
        """One attempt (see the module docstring); the outcome label."""
        key = f"{pod.namespace}/{pod.name}"
        try:
            budgets = await self.budgets()
        except kerrors.ApiError as err:
            self._warn(pod, "PreemptionFailed", f"cannot read PodDisruptionBudgets: {err}")
            return "failed"
        ranked: list[victims.Candidate] = []
        for at in range(0, len(nodes), CHUNK):  # a large cluster: let the request path run between chunks
            chunk = nodes[at : at + CHUNK]
            ranked += self.candidates(self.cache.snapshot(), pod, priority, chunk, budgets)
            await asyncio.sleep(0)
        ranked = victims.order(ranked)
        nodes = [c.node for c in ranked[:BUDGET_NODES]]
        labelled: dict[str, list[victims.Resident]] | None = None
        if ranked and budgets and self.kube is not None:
            try:
                labelled = {n: await self._labelled(n) for n in nodes}
            except kerrors.ApiError as err:
                self._warn(pod, "PreemptionFailed", f"cannot read the pods of the candidate nodes: {err}")
                return "failed"
        if ranked:
            # Again on a fresh snapshot, with no await from here to the nomination: the cache may
            # have changed meanwhile (another preemptor's nomination among it).
            ranked = self.candidates(self.cache.snapshot(), pod, priority, nodes, budgets, labelled)
        if not ranked:
            self.log.v(2, "preemption: no candidate", pod=key, nodes=len(nodes))  # no event: the common case
            return "no_candidate"
        best = ranked[0]
        if best.violations:
            protecting = sorted(
                {f"{b.namespace}/{b.name}" for b in budgets for v in best.victims if b.selects(v)}
            )
            self._warn(
                pod,
                "PreemptionBlocked",
                f"freeing card(s) {', '.join(best.cards)} on node {best.node} needs evicting "
                f"{describe_victims(best.victims)}; PodDisruptionBudget {', '.join(protecting)} allows no "
                "more disruption: nothing evicted",
            )
            return "blocked"
        if not self.leading():
            return "failed"
        if not self.cache.nominate(key, pod.uid, best.allocation, self.clock() + self.ttl_s):
            return "failed"
        cards = ", ".join(best.cards)
        self._event(
            pod,
            NORMAL,
            "Preempting",
            f"evicting {len(best.victims)} pod(s) of lower priority on node {best.node} to free card(s) "
            f"{cards}: {describe_victims(best.victims)}",
        )
        self.log.info(
            "preempting", pod=key, node=best.node, cards=cards, victims=describe_victims(best.victims)
        )
        for v in best.victims:
            result = await self.evict(v)
            self.metrics.evictions.labels(result.outcome.value).inc()
            if result.ok:
                ns, name = v.key.split("/", 1)
                self.events.record(
                    ns,
                    name,
                    v.uid,
                    NORMAL,
                    "Preempted",
                    ACTION,
                    f"evicted to free card(s) {cards} on node {best.node} "
                    f"for pod {key} (priority {priority})",
                )
                continue
            self.nominator.release(key)
            if result.outcome is evictions.Outcome.BLOCKED:
                self._warn(
                    pod,
                    "PreemptionBlocked",
                    f"eviction of {v.key} refused by a PodDisruptionBudget: {result.message}; "
                    "no more evictions",
                )
                return "blocked"
            self._warn(
                pod, "PreemptionFailed", f"eviction of {v.key} failed: {result.message}; no more evictions"
            )
            return "failed"
        return "preempted"

    async def _budgets(self) -> list[victims.Budget]:
        return [] if self.kube is None else await evictions.list_budgets(self.kube)

    async def _evict(self, v: victims.Resident) -> evictions.Result:
        if self.kube is None:
            return evictions.Result(evictions.Outcome.FAILED, "no API client")
        ns, name = v.key.split("/", 1)
        return await evictions.evict(self.kube, ns, name, v.uid)

    def _event(self, pod: requests.PodRequest, type_: str, reason: str, note: str) -> None:
        self.events.record(pod.namespace, pod.name, pod.uid, type_, reason, ACTION, note)

    def _warn(self, pod: requests.PodRequest, reason: str, note: str) -> None:
        self.log.info("preemption: " + reason, pod=f"{pod.namespace}/{pod.name}", note=note)
        self._event(pod, WARNING, reason, note)

    # ----- the sweep

    def sweep(self) -> tuple[str, ...]:
        """Release expired nominations and those whose pod went away or was bound elsewhere."""
        gone = list(self.nominator.expire(self.clock()))
        for nom in self.nominator.nominations():
            pod = self.pods(nom.key)
            bound = "" if pod is None else pod.spec.node_name
            if pod is None or pod.metadata.uid != nom.uid or (bound and bound != nom.alloc.node):
                if self.nominator.release(nom.key):
                    gone.append(nom.key)
        if gone:
            self.log.info("nominations released", pods=",".join(sorted(gone)))
        return tuple(sorted(gone))

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            self.sweep()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Preemption]:
        """Run the nomination sweep until the context exits; then cancel running attempts."""
        async with tasks.background(self._sweep_loop(), "preemption-sweep"):
            try:
                yield self
            finally:
                for task in list(self._running.values()):
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self.wait_idle()
