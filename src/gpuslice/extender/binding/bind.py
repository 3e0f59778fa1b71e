"""The bind verb: choose cards, reserve them, take HAMi's node lock, check the truth, bind.

The order of one GPU bind, and why each step is where it is:

1. **Gates.** Only the leader binds, and only from a synced cache (``sync_wait_s`` is waited at
   most); otherwise the answer is an ``Error`` kube-scheduler retries.
2. **Reserve.** The fit runs with the card policy on the *current* snapshot and the allocation is
   assumed in the cache with no ``await`` in between (the cache re-checks the cards atomically),
   so concurrent binds of this process never share capacity and the next filter sees it at once.
3. **Queue per node.** An in-process lock orders the API calls of binds to one node; a bind waits
   for it at most until its own deadline (``bind_timeout_s``, below kube-scheduler's
   ``httpTimeout``), so a queue on one node never outlives the scheduler's HTTP call.
4. **Node lock.** HAMi's ``hami.io/mutex.lock`` (waiting briefly, see ``nodelock``). Every writer
   of device annotations (other replicas, a previous incarnation of this process, HAMi's own
   scheduler) holds it while it writes, so once it is ours nobody else changes the node's pods.
5. **Check the truth.** The cache must have seen every pod write on the node made under the lock
   before us: the pod watch must have passed the resourceVersion ``lock_node`` returns (etcd
   revisions are one global counter; it is the node version our lock's compare-and-swap was
   based on, at or after the previous holder's release), or else the node's claimed pods are read
   from the API and applied. Then the
   reservation is admitted again against that state, and re-placed (or refused) if it no longer
   fits. This is what makes restarts, several replicas and a lagging watch safe.
6. **Bind.** One write: the Binding, with the pod UID as precondition, carrying every device
   annotation HAMi's device plugin reads (``vgpu-node``, ``vgpu-time``, both device keys,
   ``bind-phase: allocating``, ``bind-time``) in its metadata. The apiserver merges them into the
   pod in the same etcd update that sets ``spec.nodeName`` (``kube.binding``), so the pod is never
   bound without its devices, nor annotated without being bound, and the device plugin reading
   the pod at ``Allocate`` (after the Binding) sees them as it saw a separate patch. It is sent
   within ``commit_deadline_s`` of the lock (a per-request timeout), so a live bind is never
   older than the recovery loop's orphan grace. The ``hami.io/vgpu-node`` label HAMi's scheduler
   also sets travels in the Binding too, but the apiserver copies Binding labels only behind a
   feature gate that is off by default: the truth check therefore lists the node's bound pods as
   well as the labelled ones (``kube.pods.list_claimed``), and the label, which HAMi's vGPU
   monitor selects a node's pods by, is merge-patched once the device plugin has released the
   node lock after ``Allocate`` (``_label_later``): it never races the plugin's own pod writes
   and is off the path of the node's next bind.
7. **Outcome.** Success, or the pod found bound to the node already (a repeat: it carries our
   ``binder.DECISION_KEYS``; or another writer's Binding: its devices are charged by the watch
   and our reservation goes, the lock stays for its ``Allocate``). A definite failure (4xx) wrote
   nothing, and is rolled back: reservation forgotten, lock released. An *ambiguous* failure
   (timeout, lost connection, 5xx: the Binding may have landed) is not: the reservation and the
   lock stay, and a resolver task reads the pod until it can tell: bound here with our
   annotations (done), not bound (the Binding is sent again), gone or bound elsewhere (undone).

A pod may carry another scheduler's filter claim that no bind took up (HAMi's scheduler stopped
between its filter and its bind; ``kube.claims``). While that claim is held (younger than the node
lock's expiry, or a lock names the pod) the cache charges it, and the bind refuses the pod with the
reason and the time left (``claims.waiting_note``); once stale the cache no longer charges it, the
pod is placed as if it held nothing, and its Binding overwrites every key of the claim, with a
``StaleClaimReplaced`` event and a log line. The feed (``truth``) judges the claim at the bind
(``ClaimSource``), so the bind never waits for the feed's next pass.

A crash before the Binding leaves only the node lock, which names a pod nothing will bind: the
recovery loop releases it after the orphan grace (or a retried bind of the pod adopts it). A crash
after it leaves a bound pod with its devices (without the label if it came before the label
patch: only HAMi's vGPU monitor misses the pod). The node lock stays held after success: the device
plugin releases it after ``Allocate``. Every outcome is an ``Outcome`` (a ``Result``, whose value
is the metric label, and the error text for the wire), never an exception. A repeated bind of a pod
already bound to the node succeeds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import msgspec
import numpy as np

from gpuslice.codec import errors as codec_errors
from gpuslice.codec import pod_devices, resources
from gpuslice.extender import listeners, metrics, tasks, wire
from gpuslice.extender.binding import barrier as barriers
from gpuslice.extender.binding import binder as binders
from gpuslice.extender.binding import failpoints, nodelock, requeue
from gpuslice.framework import cycle as cycles
from gpuslice.framework import logs, memo, view
from gpuslice.framework import profile as profiles
from gpuslice.kube import claims as kclaims
from gpuslice.model import allocations, requests, status
from gpuslice.model import config as model_config
from gpuslice.policy import mig as migs

QUEUE_MARGIN_S = 1.0
"""Of ``bind_timeout_s``, kept back from the per-node queue for the truth check and the answer."""
RESOLVE_BACKOFF_S = (0.5, 1.0, 2.0, 4.0)
"""Pauses between the resolver's attempts to finish an ambiguous bind (the last one repeats)."""
LABEL_AFTER_S = 30.0
"""A pod we bound is labelled at the latest this long after its Binding (see ``_label_later``)."""
PODS_MEMO = (20_000, 16 << 20)
"""Entries and bytes of the filtered requests kept for their binds (``memo.Memo``)."""
SMALL_MEMO = (20_000, 4 << 20)
"""Entries and bytes of the per-pod scores, filter summaries and finished binds."""
CLAIM_TTL_S = 1.0
"""How long a node the filter chose for a pod counts as taken before the pod's bind arrives."""
CLAIMS_MAX = 4096
"""Claims kept at most (the oldest go first; a claim only matters for ``CLAIM_TTL_S``)."""


class Events(Protocol):
    """Where Kubernetes events go (non-blocking; the real one queues for a worker)."""

    def record(
        self, namespace: str, name: str, uid: str, type_: str, reason: str, action: str, note: str
    ) -> None:
        """Record an event about a pod."""
        ...


class NoEvents:
    """An ``Events`` that drops everything."""

    def record(
        self, namespace: str, name: str, uid: str, type_: str, reason: str, action: str, note: str
    ) -> None:
        """Drop the event."""


class Truth(Protocol):
    """Brings the cache up to date with the API for one node (``feed.Feed`` implements it)."""

    async def settle(self, node: str, resource_version: str) -> None:
        """Return once the cache reflects every pod write on ``node`` up to ``resource_version``.

        Raises:
            binders.BindFailure: the API could not be read.
        """
        ...


class Trusting:
    """A ``Truth`` for a cache that is the only writer (unit tests, benchmarks); never the server's."""

    async def settle(self, node: str, resource_version: str) -> None:
        """Nothing to do: no other writer exists."""


@runtime_checkable
class ClaimSource(Protocol):
    """Judges another scheduler's filter claim on a pod (``feed.Feed`` does, through ``kube.sync``)."""

    def foreign_claim(self, key: str) -> kclaims.Claim | None:
        """Pod ``key``'s filter claim that no bind took up, judged now (the cache follows at once)."""
        ...


class Result(enum.Enum):
    """How a bind ended, in one word; the value is the ``outcome`` label of ``gpuslice_bind_total``."""

    BOUND = "bound"
    """Success: bound to the node by this bind."""
    REPEAT = "repeat"
    """Success: the pod was bound to the node already (a repeated call, or another writer)."""
    REJECTED = "rejected"
    """Refused without a write: the pod or the node cannot take this bind now."""
    HELD = "held"
    """Inside the flow only (answered as ``REJECTED``): the pod already holds a reservation."""
    NO_FIT = "no_fit"
    """The pod no longer fits the node."""
    BUSY = "busy"
    """Binds queued on the node longer than the bind timeout allows."""
    FAILED = "failed"
    """An API call failed definitely; nothing was written (or it was undone)."""
    PENDING = "pending"
    """Ambiguous: the Binding may have landed; a resolver finishes it in the background."""
    NOT_LEADER = "not_leader"
    """This replica does not lead; only the leader binds."""
    NOT_SYNCED = "not_synced"
    """The cache did not sync within ``sync_wait_s``."""
    GANG = "gang"
    """A gang member's bind gave up at the barrier: its plan's quorum did not come (or it went)."""
    ERROR = "error"
    """A surprise (a bug), answered as an internal error."""


class Outcome(msgspec.Struct, frozen=True):
    """How a bind ended.

    Attributes:
        result: the one-word outcome (its value is the metric label).
        error: what kube-scheduler's ``Error`` says ('' on success).
    """

    result: Result
    error: str = ""

    @property
    def ok(self) -> bool:
        """True when the pod is bound to the node."""
        return self.result is Result.BOUND or self.result is Result.REPEAT


BOUND = Outcome(Result.BOUND)
REPEAT = Outcome(Result.REPEAT)


async def _acquire(lock: asyncio.Lock, timeout_s: float) -> bool:
    """Take ``lock`` within ``timeout_s``; never leaves it taken when giving up (no wait_for race)."""
    if not lock.locked():
        await lock.acquire()
        return True
    task = asyncio.ensure_future(lock.acquire())
    done, _ = await asyncio.wait({task}, timeout=max(0.0, timeout_s))
    if task in done:
        return True
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return False
    lock.release()  # acquired in the same instant it was cancelled
    return False


def describe(alloc: allocations.PodAllocation) -> str:
    """``GPU-abc (4000MB/30cores), GPU-def 2g.20gb@2-3 (...)`` for events and logs.

    A MIG grant names its instance: profile and memory slices (``policy.mig.span``).
    """
    parts = [
        f"{g.uuid}{'' if g.mig is None else f' {g.mig.profile}@{migs.span(g.mig)}'} "
        f"({g.memory_mib}MB/{g.cores}cores)"
        for grants in alloc.containers
        for g in grants
    ]
    return ", ".join(parts) or "no devices"


class _Reserved(NamedTuple):
    """A reservation made: the allocation assumed, and its MIG comparison for the event (or None)."""

    alloc: allocations.PodAllocation
    mig_note: str | None


@dataclasses.dataclass
class _Bind:
    """One GPU bind in progress."""

    ns: str
    name: str
    uid: str
    node: str
    pod: requests.PodRequest
    alloc: allocations.PodAllocation
    started: float
    replaces: kclaims.Claim | None = None
    """Another scheduler's stale claim on the pod, which the Binding overwrites."""
    mig_note: str | None = None
    """How its MIG instances compare with HAMi's first fit (``cycle.Cycle.mig_note``)."""

    @property
    def key(self) -> str:
        return f"{self.ns}/{self.name}"


@dataclasses.dataclass
class _Unlabelled:
    """A pod we bound, whose ``hami.io/vgpu-node`` label waits for its device plugin's Allocate."""

    job: _Bind
    seen: bool
    """The node watch has shown the node lock naming the pod."""
    timer: asyncio.TimerHandle | None = None


@dataclasses.dataclass(kw_only=True)
class BindFlow:
    """The bind verb's state: per-pod memos, per-node queues, lock waits, live binds, resolvers.

    The safety settings (``truth``, ``leading``, ``synced``, ``excluded``, ``lock_owner``) have no
    defaults: a composition that forgets one fails here, at construction, instead of binding from a
    partial cache, on a follower or past the truth check.
    """

    cache: view.Cache
    binder: binders.Binder
    profile: profiles.Profile
    request_config: model_config.RequestConfig
    clock: Callable[[], float]
    log: logs.Log
    metrics: metrics.Metrics
    events: Events = dataclasses.field(default_factory=NoEvents)
    truth: Truth
    """The truth check after the node lock (``Feed``; ``Trusting`` only where no other writer exists)."""
    leading: Callable[[], bool]
    """True while this replica leads: only the leader binds."""
    synced: Callable[[], bool]
    """True once every watched kind is listed and healthy: no bind from a partial cache."""
    excluded: Mapping[str, str]
    """Nodes not to place on now -> reason code (invalid registration, stale handshake, ...)."""
    invalid_nodes: Collection[str] = frozenset()
    """Nodes whose registration could not be decoded (the sync's live set), to name the reason."""
    lock_owner: Callable[[str], str | None]
    """``ns/name`` of the pod HAMi's lock on a node names, as the node watch shows it."""
    lock_wait_s: float = 3.0
    bind_timeout_s: float = 20.0
    commit_deadline_s: float = 3.0
    sync_wait_s: float = 5.0
    faults: failpoints.Failpoints = dataclasses.field(default_factory=failpoints.Failpoints)
    monotonic: Callable[[], float] = time.monotonic
    on_bound: listeners.Listeners[[requests.PodRequest, str, allocations.PodAllocation]] = dataclasses.field(
        default_factory=listeners.Listeners
    )
    """Told of every GPU pod this flow bound (pod, node, cards), after the fact (shadow mode)."""
    foreign_claims: ClaimSource | None = None
    """Judges other schedulers' claims on pods (the feed, in ``serve.build``); None: no other scheduler."""
    barrier: barriers.Barrier | None = None
    """Holds gang members' binds until their plan's quorum is at bind (None: gangs are off)."""
    _pods: memo.Memo = dataclasses.field(default_factory=lambda: memo.Memo(*PODS_MEMO, requests.footprint))
    _scores: memo.Memo = dataclasses.field(default_factory=lambda: memo.Memo(*SMALL_MEMO, memo.strings))
    _filters: memo.Memo = dataclasses.field(default_factory=lambda: memo.Memo(*SMALL_MEMO, memo.strings))
    _done: memo.Memo = dataclasses.field(default_factory=lambda: memo.Memo(*SMALL_MEMO, memo.strings))
    _queues: dict[str, asyncio.Lock] = dataclasses.field(default_factory=dict)
    _live: dict[str, str] = dataclasses.field(default_factory=dict)
    _resolvers: set[asyncio.Task[None]] = dataclasses.field(default_factory=set)
    _unlabelled: dict[str, _Unlabelled] = dataclasses.field(default_factory=dict)
    _labellers: set[asyncio.Task[None]] = dataclasses.field(default_factory=set)
    _claims: dict[str, tuple[str, float]] = dataclasses.field(default_factory=dict)
    """Pod key -> (node, monotonic time) the filter chose for it, until its bind starts (``claim``)."""

    def __post_init__(self) -> None:
        self._waiter = nodelock.LockWaiter(self.binder, self._now, self.metrics, self.lock_wait_s)
        self._nudger = requeue.Nudger(self.binder.touch_node, self._now, self.metrics, self.log)

    def _now(self) -> float:
        """``clock()`` looked up at each call (tests replace the clock)."""
        return self.clock()

    # ----- hooks from filter, prioritize and the watches

    def remember(self, pod: requests.PodRequest) -> None:
        """Keep a filtered pod's request for its bind (the bind args carry only names)."""
        if pod.uid:
            self._pods.put(pod.uid, pod)

    def mark_unschedulable(self, uid: str, unschedulable: bool) -> None:
        """Track pods our filter left without a node (they wait for capacity; see ``requeue``)."""
        self._nudger.mark(uid, unschedulable)

    def capacity_freed(self, node: str) -> None:
        """A pod holding GPUs on ``node`` went away (from the pod watch); see ``requeue``."""
        self._nudger.capacity_freed(node)

    def node_lock_changed(self, node: str, held: bool) -> None:
        """The node watch saw HAMi's lock annotation set (held) or removed; see ``nodelock``.

        Also labels the pod we bound last on the node once the lock, having named it, names it no
        more: its device plugin has answered ``Allocate`` (``_label_later``).
        """
        self._waiter.changed(node, held)
        pending = self._unlabelled.get(node)
        if pending is None:
            return
        if self.lock_owner(node) == pending.job.key:
            pending.seen = True
        elif pending.seen:
            self._label_now(node, pending)

    def claim(self, key: str, node: str) -> None:
        """The filter answered ``node`` alone for pod ``key`` (``node_choice: extender``).

        kube-scheduler filters the next pod of a burst while this one binds, often before its
        ``/bind`` arrives; until then (at most ``CLAIM_TTL_S``) the node counts as taken in
        ``in_flight``, as it will be once the bind takes its lock.
        """
        self._claims.pop(key, None)
        self._claims[key] = (node, self.monotonic())
        if len(self._claims) > CLAIMS_MAX:
            del self._claims[next(iter(self._claims))]

    def in_flight(self, key: str) -> set[str]:
        """Nodes that binds of pods other than ``key`` are taking here.

        A bind queued for its node, holding its lock or resolving, or a node the filter just chose
        (``claim``). Expired claims are dropped on the way.
        """
        out = {node for other, node in self._live.items() if other != key}
        if self._claims:
            now = self.monotonic()
            while self._claims:  # oldest first: ``claim`` re-inserts at the end
                oldest = next(iter(self._claims))
                if now - self._claims[oldest][1] <= CLAIM_TTL_S:
                    break
                del self._claims[oldest]
            out.update(node for other, (node, _) in self._claims.items() if other != key)
        return out

    def remember_filter(self, uid: str, summary: str) -> None:
        """Keep the filter summary of a pod for its bind event."""
        if uid:
            self._filters.put(uid, summary)

    def remember_scores(self, uid: str, names: Sequence[str], scores: np.ndarray) -> None:
        """Keep the best three scores (internal, ``names`` order) for the bind event.

        Ties keep the input order. Called by prioritize, and by the filter when the extender chose
        the node (kube-scheduler runs no prioritize for a single feasible node).
        """
        if uid and len(names):
            top = np.argsort(-scores, kind="stable")[:3].tolist()
            self._scores.put(uid, [(names[i], int(scores[i])) for i in top])

    def _foreign_claim(self, key: str) -> kclaims.Claim | None:
        source = self.foreign_claims
        return source.foreign_claim(key) if source is not None else None

    def held_claim(self, key: str) -> kclaims.Claim | None:
        """Another scheduler's claim on pod ``key`` that still counts as held, judged now; else None.

        The filter refuses such a pod on every node (``status.FOREIGN_CLAIM_HELD``).
        """
        claim = self._foreign_claim(key)
        return claim if claim is not None and claim.held else None

    def is_live(self, key: str) -> bool:
        """True while a bind (or the resolver of an ambiguous one) of pod ``ns/name`` runs here."""
        return key in self._live

    def live(self) -> dict[str, str]:
        """Pod key -> node of every bind in progress in this process."""
        return dict(self._live)

    async def drain(self) -> None:
        """Finish what the flow left running: label the pods whose label waits, wait for the resolvers.

        The app's lifespan runs it at shutdown (within ``http.app.DRAIN_BINDS_S``), while the API
        client still runs: a pod's label timer and task die with the event loop, and recovery does
        not label. The waiting labels start first, so a resolver that takes the whole budget does
        not cost them; a pod a resolver binds meanwhile is labelled after it.
        """
        self._label_waiting()
        while self._resolvers:
            await asyncio.gather(*list(self._resolvers), return_exceptions=True)
        self._label_waiting()
        while self._labellers:
            await asyncio.gather(*list(self._labellers), return_exceptions=True)

    def _label_waiting(self) -> None:
        """Start the label of every pod whose label waits for its device plugin's Allocate."""
        for node, pending in list(self._unlabelled.items()):
            self._label_now(node, pending)

    # ----- the verb

    async def bind(self, args: wire.ExtenderBindingArgs) -> Outcome:
        """Bind the pod (see the module docstring); the outcome, never an exception.

        The flow runs as its own task, shielded, so a dropped connection cannot stop it halfway.
        """
        task = asyncio.ensure_future(self._guarded(args))
        outcome = await asyncio.shield(task)
        self.metrics.binds.labels(outcome.result.value).inc()
        return outcome

    async def _guarded(self, args: wire.ExtenderBindingArgs) -> Outcome:
        try:
            return await self._bind(args)
        except Exception as err:  # noqa: BLE001 - a surprise must still become an Error answer
            self.log.error(
                "bind failed unexpectedly", pod=f"{args.pod_namespace}/{args.pod_name}", err=repr(err)
            )
            return Outcome(Result.ERROR, f"internal error: {type(err).__name__}")

    async def _request(self, args: wire.ExtenderBindingArgs) -> requests.PodRequest | Outcome:
        """The pod's request from the filter memo, else read from the API (restart, other replica)."""
        memo_: requests.PodRequest | None = self._pods.get(args.pod_uid)
        if memo_ is not None:
            return memo_
        try:
            obj = await self.binder.read_pod(args.pod_namespace, args.pod_name)
        except binders.BindFailure as err:
            self.metrics.api_errors.labels("read").inc()
            return Outcome(Result.FAILED, f"cannot read pod: {err}")
        if obj is None:
            return Outcome(Result.REJECTED, "pod not found")
        meta = obj.get("metadata") or {}
        if args.pod_uid and meta.get("uid") != args.pod_uid:
            return Outcome(Result.REJECTED, "pod UID mismatch (deleted and recreated?)")
        try:
            return resources.parse_pod(obj, self.request_config)
        except codec_errors.DecodeError as err:
            return Outcome(Result.REJECTED, f"{status.INVALID_REQUEST}: {err}")

    async def _bind(self, args: wire.ExtenderBindingArgs) -> Outcome:
        ns, name, uid, node = args.pod_namespace, args.pod_name, args.pod_uid, args.node
        key = f"{ns}/{name}"
        started = self.monotonic()
        self._claims.pop(key, None)  # from here the bind itself counts (``_live``) until it ends
        if uid and self._done.get(uid) == node:
            return REPEAT
        if not self.leading():
            return Outcome(Result.NOT_LEADER, "this gpuslice replica is not the leader; retry")
        if not await tasks.wait_until(self.synced, self.sync_wait_s, self.monotonic):
            return Outcome(Result.NOT_SYNCED, "gpuslice cache not synced yet; retry")
        pod = await self._request(args)
        if isinstance(pod, Outcome):
            return pod
        if not pod.wants_gpu:
            return await self._bind_plain(ns, name, uid, node)
        # Another scheduler's claim on the pod, judged now: held, the pod waits for it; stale, the
        # cache no longer charges it, the pod is placed as if it held nothing and the Binding
        # overwrites the claim.
        claim = self._foreign_claim(key)
        if claim is not None and claim.held:
            return Outcome(Result.REJECTED, kclaims.waiting_note(key, claim, self.clock()))
        gang = self.barrier if self.barrier is not None and self.barrier.gangs.gated(pod) else None
        if gang is not None:
            # All or nothing: wait for the plan's quorum, leaving the queue, the lock and the
            # writes their budget (``bind_timeout_s``).
            budget = self.bind_timeout_s - self.lock_wait_s - self.commit_deadline_s - QUEUE_MARGIN_S
            why = await gang.pass_(pod, node, started + budget)
            if why:
                return Outcome(Result.GANG, why)
            gang.gangs.claim(pod)  # its held cards leave the snapshots for the re-fit below
        outcome = await self._bind_gpu(ns, name, uid, node, key, pod, claim, started)
        if gang is not None:
            if outcome.ok:
                gang.gangs.bound(pod)
            elif outcome.result is not Result.PENDING:
                gang.gangs.failed(pod, None, self.clock())
        return outcome

    async def _bind_gpu(
        self,
        ns: str,
        name: str,
        uid: str,
        node: str,
        key: str,
        pod: requests.PodRequest,
        claim: kclaims.Claim | None,
        started: float,
    ) -> Outcome:
        """Reserve, queue for the node, commit (the module docstring's steps 2 to 7)."""
        placed = self._reserve(key, uid, node, pod)
        if isinstance(placed, Outcome):
            if placed.result is not Result.HELD:
                return placed
            if await self._bound_anyway(ns, name, uid, node):
                return REPEAT
            return Outcome(Result.REJECTED, placed.error)
        job = _Bind(ns, name, uid, node, pod, placed.alloc, started, claim, placed.mig_note)
        self._live[key] = node
        handed_over = False
        try:
            if self.lock_owner(node) == key:
                # HAMi's lock already names this pod (a bind of it died after taking the lock, e.g.
                # before a restart): every bind queued on the node waits for this one, so it must
                # not queue behind them.
                outcome = await self._commit(job, adopt=True)
            else:
                queue = self._queues.setdefault(node, asyncio.Lock())
                # What stays for the queue once the lock wait and the writes are budgeted, so the
                # whole call ends within bind_timeout_s.
                budget = self.bind_timeout_s - self.lock_wait_s - self.commit_deadline_s - QUEUE_MARGIN_S
                if not await _acquire(queue, budget - (self.monotonic() - started)):
                    self.cache.forget(key)
                    return Outcome(
                        Result.BUSY, f"node {node} busy: binds queued longer than {self.bind_timeout_s:g}s"
                    )
                try:
                    outcome = await self._commit(job)
                finally:
                    queue.release()
            handed_over = outcome.result is Result.PENDING
        except BaseException:
            self.cache.forget(key)
            raise
        finally:
            if not handed_over:
                self._live.pop(key, None)
        if outcome is BOUND:
            self._label_later(job)
        return outcome

    def _excluded(self, node: str, locked: bool) -> str | None:
        """Why ``node`` must not get the pod now; once we hold its lock, a held lock is no reason."""
        reason = self.excluded.get(node)
        if reason is None or (locked and reason == status.NODE_LOCK_HELD):
            return None
        return reason

    def _reserve(
        self, key: str, uid: str, node: str, pod: requests.PodRequest, locked: bool = False
    ) -> _Reserved | Outcome:
        """Fit on the current snapshot and assume it, with no await in between."""
        reason = self._excluded(node, locked)
        if reason is not None:
            return Outcome(Result.REJECTED, f"node {node}: {reason}")
        cyc = cycles.Cycle.of(self.profile, self.cache.snapshot(), pod)
        state = cyc.state(node)
        if state is None:
            return Outcome(Result.REJECTED, f"node {node}: {view.node_problem(node, self.invalid_nodes)}")
        placement = cyc.place(state)
        if placement.allocation is None:
            return Outcome(
                Result.NO_FIT, f"pod no longer fits node {node}: {','.join(placement.status.reasons)}"
            )
        alloc = placement.allocation
        verdict = self.cache.assume(key, uid, alloc, self.clock(), pod.job(self.profile.job_label))
        if verdict.reasons == (status.ALREADY_CACHED,):
            # Already in the cache: confirmed by the watch, or another bind of it is in flight.
            return Outcome(Result.HELD, f"pod {key} already holds an allocation")
        if not verdict.ok:
            return Outcome(Result.NO_FIT, f"pod no longer fits node {node}: {','.join(verdict.reasons)}")
        return _Reserved(alloc, cyc.mig_note(state, alloc))

    def _claim_refuses(self, job: _Bind) -> Outcome | None:
        """After the truth check: another scheduler's claim on the pod, judged again.

        The watch may have shown the pod only now. A held claim refuses the bind; a stale one is
        what the Binding replaces. The lock on our node names the pod now, taken by this bind: it
        keeps no claim held.
        """
        claim = self._foreign_claim(job.key)
        ours = claim is not None and claim.state is kclaims.State.LOCKED and claim.node == job.node
        if claim is not None and ours:
            claim = kclaims.unlocked(claim, self.clock())
        if claim is not None and claim.held:
            return Outcome(Result.REJECTED, kclaims.waiting_note(job.key, claim, self.clock()))
        job.replaces = claim
        return None

    def _readmit(self, job: _Bind) -> Outcome | None:
        """After the truth check: admit the reservation again, re-placing it if it no longer fits."""
        if not self.cache.forget(job.key):
            # The watch took the pod out of the assumed state while we waited: it was deleted,
            # or bound (elsewhere) by someone else. Nothing of ours is left to admit.
            return Outcome(Result.REJECTED, f"pod {job.key} changed while its bind waited")
        reason = self._excluded(job.node, locked=True)
        if reason is not None:
            # The node died (or stopped answering Allocate) while the bind queued for its lock.
            return Outcome(Result.REJECTED, f"node {job.node}: {reason}")
        verdict = self.cache.assume(
            job.key, job.uid, job.alloc, self.clock(), job.pod.job(self.profile.job_label)
        )
        if verdict.ok:
            return None
        self.metrics.truth_corrections.inc()
        placed = self._reserve(job.key, job.uid, job.node, job.pod, locked=True)
        if isinstance(placed, Outcome):
            return placed
        self.log.info(
            "bind: re-placed after the truth check", pod=job.key, node=job.node, was=verdict.reasons
        )
        job.alloc, job.mig_note = placed
        return None

    def _remaining(self, deadline: float) -> float:
        return max(0.2, deadline - self.monotonic())

    async def _bind_plain(self, ns: str, name: str, uid: str, node: str) -> Outcome:
        """A pod without GPUs: no reservation, no node lock, no annotations; just the Binding."""
        try:
            await self.binder.bind(ns, name, uid, node)  # no annotations: any Binding to node is it
        except binders.BindFailure as err:
            self.metrics.api_errors.labels(err.operation).inc()
            if err.ambiguous and await self._bound_anyway(ns, name, uid, node):
                return BOUND
            return Outcome(Result.FAILED, f"{err.operation} failed: {err}")
        return BOUND

    async def _commit(self, job: _Bind, adopt: bool = False) -> Outcome:
        ns, name, uid, node, key = job.ns, job.name, job.uid, job.node, job.key
        marks = [self.monotonic()]
        try:
            if adopt:  # the lock names this pod already: take it over at once, no waiting
                lock_rv = await self.binder.lock_node(node, ns, name)
            else:
                lock_rv = await self._waiter.acquire(node, ns, name)
        except binders.BindFailure as err:
            self.metrics.api_errors.labels(err.operation).inc()
            self.cache.forget(key)
            if err.ambiguous:
                # The lock write may have landed; it names this pod, which nothing will bind, so
                # the recovery loop releases it after the orphan grace.
                self.log.warning("bind: node lock outcome unknown", pod=key, node=node, err=str(err))
            return self._failed(job, err)
        deadline = self.monotonic() + self.commit_deadline_s
        marks.append(self.monotonic())
        await self.faults.hit("bind-after-lock")
        try:
            await self.truth.settle(node, lock_rv)
        except binders.BindFailure as err:
            self.metrics.api_errors.labels(err.operation).inc()
            await self._undo(job)
            return self._failed(job, err)
        refused = self._claim_refuses(job) or self._readmit(job)
        if refused is None and self.monotonic() >= deadline:
            # Writing now could outlive the recovery grace another replica allows a live bind.
            refused = Outcome(
                Result.FAILED, f"commit deadline ({self.commit_deadline_s:g}s) passed before the writes"
            )
        if refused is not None:
            await self._undo(job)
            return refused
        annotations = pod_devices.bind_annotations(job.alloc, self.clock())  # the time of the write
        # The annotations travel in the Binding; this failpoint keeps its place just before it.
        await self.faults.hit("bind-before-binding")
        marks.append(self.monotonic())
        try:
            ours = await self.binder.bind(ns, name, uid, node, annotations, timeout=self._remaining(deadline))
        except binders.BindFailure as err:
            self.metrics.api_errors.labels(err.operation).inc()
            if err.ambiguous:
                return self._hand_over(job, annotations, err)
            await self._undo(job)
            return self._failed(job, err)
        await self.faults.hit("bind-after-binding")
        marks.append(self.monotonic())
        if self.log.enabled(3):
            lock_ms, truth_ms, bind_ms = ((b - a) * 1e3 for a, b in zip(marks, marks[1:], strict=False))
            self.log.v(
                3,
                "bind timing",
                pod=key,
                node=node,
                lock_ms=f"{lock_ms:.1f}",
                truth_ms=f"{truth_ms:.1f}",
                binding_ms=f"{bind_ms:.1f}",
            )
        if not ours:
            return self._bound_by_another(job)
        return self._succeeded(job)

    def _label_later(self, job: _Bind) -> None:
        """Label the pod we just bound once its device plugin is done with it.

        HAMi's ``hami.io/vgpu-node`` label cannot travel in the Binding (``kube.binding``); HAMi's
        vGPU monitor selects a node's pods by it, for containers that run, i.e. after
        ``Allocate``. The device plugin writes the pod (``bind-phase``, the device entries it
        consumed) and then releases the node lock, so the label is patched when the node watch
        shows the lock, having named the pod, naming it no more: never in a race with the plugin's
        writes (a compare-and-swap writer would have to retry), and off the path of the node's
        next bind. A later bind on the node labels an earlier pod still waiting (its Allocate is
        over, since the lock moved on), and ``LABEL_AFTER_S`` bounds the wait, should the watch
        never show the lock naming the pod (its plugin answered before the watch caught up).
        """
        earlier = self._unlabelled.pop(job.node, None)
        if earlier is not None:
            self._start_label(earlier)
        pending = _Unlabelled(job, seen=self.lock_owner(job.node) == job.key)
        pending.timer = asyncio.get_running_loop().call_later(
            LABEL_AFTER_S, self._label_now, job.node, pending
        )
        self._unlabelled[job.node] = pending

    def _label_now(self, node: str, pending: _Unlabelled) -> None:
        if self._unlabelled.get(node) is pending:
            del self._unlabelled[node]
            self._start_label(pending)

    def _start_label(self, pending: _Unlabelled) -> None:
        if pending.timer is not None:
            pending.timer.cancel()
        task = asyncio.create_task(self._label(pending.job), name=f"label-{pending.job.key}")
        self._labellers.add(task)
        task.add_done_callback(self._labellers.discard)

    async def _label(self, job: _Bind) -> None:
        """Set the label (``binder.label``), best effort.

        Nothing of the placement depends on it (the truth check lists bound pods by node), so a
        failure is logged and counted only.
        """
        try:
            await self.binder.label(job.ns, job.name, job.uid, job.node)
        except binders.BindFailure as err:
            self.metrics.api_errors.labels(err.operation).inc()
            self.log.warning("bind: cannot label the bound pod", pod=job.key, node=job.node, err=str(err))

    def _failed(self, job: _Bind, err: binders.BindFailure) -> Outcome:
        self.events.record(
            job.ns, job.name, job.uid, "Warning", "BindingFailed", "Binding", f"{err.reason}: {err}"[:1024]
        )
        self.log.info(
            "bind failed", pod=job.key, node=job.node, op=err.operation, reason=err.reason, err=str(err)
        )
        return Outcome(Result.FAILED, f"{err.operation} failed: {err}")

    def _succeeded(self, job: _Bind) -> Outcome:
        self.cache.finish_binding(job.key, self.clock())
        uid = job.uid
        if uid:
            self._done.put(uid, job.node)
            self._pods.pop(uid, None)
            self._nudger.mark(uid, False)
        top = self._scores.pop(uid, None) if uid else None
        scores = ", ".join(f"{n}={wire.to_extender_score(s)}" for n, s in top) if top else "n/a"
        summary = self._filters.pop(uid, None) if uid else None
        note = (
            f"{summary or 'Filter: n/a'}; bound to {job.node}; top scores: {scores}; "
            f"Device: {describe(job.alloc)}"
        )
        if job.mig_note:
            note += f"; {job.mig_note}"
        self.events.record(job.ns, job.name, uid, "Normal", "GPUAllocated", "Binding", note[:1024])
        self.log.v(2, "bound", pod=job.key, node=job.node, devices=describe(job.alloc))
        if job.replaces is not None:
            self._replaced(job, job.replaces)
        self.on_bound.emit(job.pod, job.node, job.alloc)
        return BOUND

    def _replaced(self, job: _Bind, claim: kclaims.Claim) -> None:
        """Say that the Binding overwrote another scheduler's stale claim."""
        self.events.record(
            job.ns,
            job.name,
            job.uid,
            "Normal",
            "StaleClaimReplaced",
            "Binding",
            kclaims.replaced_note(claim, job.node)[:1024],
        )
        self.log.info(
            "bind: replaced another scheduler's stale claim",
            pod=job.key,
            node=job.node,
            claimed=claim.node,
            written=claim.written,
            age_s=f"{claim.age_s:.0f}",
        )

    def _bound_by_another(self, job: _Bind) -> Outcome:
        """The pod was bound to our node by another writer, with its own devices.

        The pod is where kube-scheduler wants it, so the answer is a success; its devices are the
        other writer's, which the pod watch charges, so our reservation goes. The node lock names
        the pod, which the device plugin serves and then releases: it stays.
        """
        self.cache.forget(job.key)
        if job.uid:
            self._done.put(job.uid, job.node)
            self._pods.pop(job.uid, None)
        self.log.info("bind: pod already bound to the node by another writer", pod=job.key, node=job.node)
        return REPEAT

    async def _bound_anyway(self, ns: str, name: str, uid: str, node: str) -> bool:
        """Whether the pod is bound to ``node`` by now (a repeat, or a Binding whose answer was lost)."""
        try:
            obj = await self.binder.read_pod(ns, name)
        except binders.BindFailure:
            return False
        if obj is None:
            return False
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        return bool(spec.get("nodeName") == node and (not uid or meta.get("uid") == uid))

    async def _undo(self, job: _Bind) -> None:
        """Undo a bind that wrote nothing but its node lock, best effort for the API part.

        The reservation goes; a lock that cannot be released names a pod nothing binds, which the
        recovery loop releases after its grace.
        """
        self.cache.forget(job.key)
        self._foreign_claim(job.key)  # another scheduler's held claim on the pod is charged again
        try:
            await self.binder.unlock_node(job.node, job.ns, job.name)
        except binders.BindFailure as err:
            self.metrics.api_errors.labels("unlock").inc()
            self.log.warning("undo: cannot release node lock", node=job.node, pod=job.key, err=str(err))

    # ----- ambiguous outcomes

    def _hand_over(self, job: _Bind, annotations: Mapping[str, str], err: binders.BindFailure) -> Outcome:
        """Keep everything and let a resolver finish or undo the bind once the API answers."""
        self.metrics.ambiguous.labels(err.operation).inc()
        self.log.warning(
            "bind outcome unknown; finishing in the background",
            pod=job.key,
            node=job.node,
            op=err.operation,
            err=str(err),
        )
        task = asyncio.create_task(self._resolve(job, dict(annotations)), name=f"resolve-{job.key}")
        self._resolvers.add(task)
        task.add_done_callback(self._resolvers.discard)
        return Outcome(
            Result.PENDING, f"{err.operation} outcome unknown ({err}); gpuslice finishes it; retry"
        )

    async def _resolve(self, job: _Bind, annotations: dict[str, str]) -> None:
        """Finish an ambiguous bind: read the pod, send the Binding again, until bound or definitely not."""
        attempt = 0
        try:
            while True:
                await asyncio.sleep(RESOLVE_BACKOFF_S[min(attempt, len(RESOLVE_BACKOFF_S) - 1)])
                attempt += 1
                if not self.leading():
                    # A new leader owns recovery now: our lock becomes its orphan (or our Binding
                    # landed, and the pod's device plugin releases the lock).
                    self.log.warning(
                        "resolver: no longer leading; leaving the bind to the leader", pod=job.key
                    )
                    self.cache.forget(job.key)
                    return
                try:
                    done = await self._finish(job, annotations)
                except binders.BindFailure as err:
                    if err.ambiguous:
                        continue  # still no answer; keep everything and try again
                    await self._undo(job)
                    self._failed(job, err)
                    return
                if done:
                    self._succeeded(job)
                    self._label_later(job)
                    self.metrics.binds.labels("resolved").inc()
                    self.log.info("resolver: bind finished", pod=job.key, node=job.node, attempts=attempt)
                else:
                    self.cache.forget(job.key)
                    self.log.info("resolver: pod gone; reservation dropped", pod=job.key, node=job.node)
                return
        finally:
            self._live.pop(job.key, None)

    async def _finish(self, job: _Bind, annotations: dict[str, str]) -> bool:
        """One attempt: True when bound to our node with our annotations, False when nothing is left.

        False: the pod is gone, recreated or bound elsewhere (our lock and reservation are
        dropped), or bound to our node by another writer (our reservation is dropped, the lock
        stays for its device plugin).

        Raises:
            binders.BindFailure: the read or the Binding failed (ambiguous: try again; definite:
                undo).
        """
        obj = await self.binder.read_pod(job.ns, job.name)
        if obj is None:
            await self._undo(job)
            return False
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        if job.uid and meta.get("uid") != job.uid:
            await self._undo(job)
            return False
        bound_to = spec.get("nodeName") or ""
        if bound_to == job.node:
            if binders.carries(meta.get("annotations") or {}, annotations):
                return True  # our Binding landed
            self._bound_by_another(job)
            return False
        if bound_to:
            # Bound elsewhere by another binder: only our lock and our reservation go.
            await self._undo(job)
            return False
        if await self.binder.bind(
            job.ns, job.name, job.uid, job.node, annotations, timeout=self.commit_deadline_s
        ):
            return True
        self._bound_by_another(job)  # bound to our node meanwhile, by another writer
        return False
