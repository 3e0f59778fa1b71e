"""The leader's recovery loop: orphan binds, stuck and dangling node locks, handshake requests.

HAMi's scheduler recovers a node lock only when the next acquirer finds it older than the expiry
(5 minutes; Project-HAMi/HAMi ``pkg/util/nodelock``), so a scheduler that dies between taking
the lock and the Binding stalls that node for 5 minutes (HAMi issue #1130), and pods left with
device annotations but no node keep their cards reserved. This loop, run by the leader only
every ``recovery_period_s``, finds and clears such leftovers without waiting for the expiry.

For each node lock (``judge_lock`` decides, pure):

* no owner recorded (legacy value): released only once expired (``node_lock_expiry_s``);
* owner handled by a live bind of this process: kept;
* owner gone, being deleted or terminated: *dangling*, released;
* owner bound to another node: released;
* owner bound to this node but its device plugin never answered (``bind-phase`` still
  ``allocating`` after ``allocate_timeout_s``): released with a Warning event, the pod keeps its
  devices (it is bound, its cards stay charged);
* owner bound here and answered (``success``/``failed``) but the lock stayed: released;
* owner Pending and unbound, older than ``orphan_grace_s``: an *orphan* of a bind that died: its
  device annotations are removed (compare-and-swap on the pod's resourceVersion, so a Binding
  that lands first wins and nothing is removed) and the lock is released.

Pods with a node claim but no binding that no lock names (a bind that failed after writing its
annotations) are orphans the same way once their ``bind-time`` is older than the grace. A claim
without ``hami.io/bind-phase`` that no lock names is a filter's, not a bind's (HAMi's scheduler
stopped between its filter and its bind): this loop leaves it alone. The cache stops charging it
once no scheduler can still act on it (``kube.claims``: older than ``node_lock_expiry_s``), and the
pod's next bind overwrites it.

Every destructive action re-reads the pod (and the lock release re-reads the node) from the API
first and judges again, so a lagging watch never causes one. Each action gives an event on the
pod, a log line and a count in ``gpuslice_recovery_actions_total{action}``.

The grace must exceed how long a live bind can take after it took the lock (``bind.BindFlow``
sends its writes within ``commit_deadline_s``), so a live bind of another replica is never
mistaken for an orphan; the lock's time has one-second resolution, which ``judge_lock`` allows for.
Leaders also write HAMi's ``Requesting_`` handshake (see ``liveness``), at most once per node per
``HANDSHAKE_MIN_INTERVAL_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import AsyncIterator, Callable

from gpuslice.codec import errors as codec_errors
from gpuslice.codec import handshake, keys, pod_devices
from gpuslice.codec import locks as lockcodec
from gpuslice.extender import feed, metrics, tasks
from gpuslice.extender.binding import bind
from gpuslice.framework import logs
from gpuslice.kube import client as kclient
from gpuslice.kube import errors as kerrors
from gpuslice.kube import locks, objects, pods

HANDSHAKE_MIN_INTERVAL_S = 10.0
LOCK_TIME_RESOLUTION_S = 1.0
"""The lock value carries whole seconds; an age is counted from the end of that second."""


class Action(enum.Enum):
    """What to do with a node lock."""

    KEEP = "keep"
    RELEASE_EXPIRED = "expired_lock_released"
    RELEASE_DANGLING = "dangling_lock_released"
    RELEASE_ELSEWHERE = "lock_of_pod_bound_elsewhere_released"
    RELEASE_ALLOCATE_TIMEOUT = "allocate_timeout_lock_released"
    RELEASE_ANSWERED = "answered_lock_released"
    CLEAR_ORPHAN = "orphan_bind_cleared"


class Limits:
    """The recovery loop's time limits, seconds.

    Args:
        orphan_grace_s: age after which an unbound owner is an orphan.
        allocate_timeout_s: age after which a bound owner's unanswered Allocate releases the lock.
        expiry_s: age after which any lock (also one without owner) is expired.
    """

    def __init__(self, orphan_grace_s: float, allocate_timeout_s: float, expiry_s: float) -> None:
        self.orphan_grace_s = orphan_grace_s
        self.allocate_timeout_s = allocate_timeout_s
        self.expiry_s = expiry_s


def lock_age(lock: lockcodec.NodeLock, now: float) -> float:
    """Seconds since the lock was taken, at least (whole-second timestamps round down)."""
    return now - lock.taken.timestamp() - LOCK_TIME_RESOLUTION_S


def judge_lock(
    node: str, lock: lockcodec.NodeLock, owner: objects.Pod | None, live: bool, now: float, limits: Limits
) -> Action:
    """What the recovery loop does with ``node``'s lock (see the module docstring)."""
    age = lock_age(lock, now)
    if not lock.has_owner:
        return Action.RELEASE_EXPIRED if age > limits.expiry_s else Action.KEEP
    if live:
        return Action.KEEP
    if owner is None or owner.metadata.deletion_timestamp is not None or owner.terminated:
        return Action.RELEASE_DANGLING
    bound = owner.spec.node_name
    if bound and bound != node:
        return Action.RELEASE_ELSEWHERE
    phase = owner.metadata.annotations.get(keys.BIND_PHASE)
    if bound:
        if phase in (keys.BIND_PHASE_SUCCESS, keys.BIND_PHASE_FAILED) and age > limits.orphan_grace_s:
            return Action.RELEASE_ANSWERED
        if age > limits.allocate_timeout_s:
            return Action.RELEASE_ALLOCATE_TIMEOUT
        return Action.KEEP
    return Action.CLEAR_ORPHAN if age > limits.orphan_grace_s else Action.KEEP


def orphan_claim(pod: objects.Pod, live: bool, lock_names_it: bool, now: float, grace_s: float) -> bool:
    """True when an unbound pod's bind annotations are left over from a bind that ended."""
    ann = pod.metadata.annotations
    if live or lock_names_it or pod.spec.node_name or pod.terminated:
        return False
    if ann.get(keys.BIND_PHASE) != keys.BIND_PHASE_ALLOCATING or keys.VGPU_NODE not in ann:
        return False  # not an interrupted bind; a filter's claim (no phase) is kube.claims' to judge
    stamp = ann.get(keys.BIND_TIME) or ann.get(keys.VGPU_TIME) or ""
    if not stamp.isdigit():
        return True  # a bind phase without a time: nothing will ever finish it
    return now - int(stamp) - LOCK_TIME_RESOLUTION_S > grace_s


class Recovery:
    """The loop; ``sweep`` is one pass (tests call it directly).

    Args:
        kube: the API client.
        source: the watches (nodes, pods, unbound claims, node health).
        flow: the bind flow (which binds are live here).
        limits: the time limits.
        events: where pod events go.
        metrics_: counts the actions.
        log: logger.
        leading: whether this replica leads (only the leader acts).
        period_s: time between passes.
        clock: wall clock (lock values and bind times are wall time).
    """

    def __init__(
        self,
        kube: kclient.KubeClient,
        source: feed.Feed,
        flow: bind.BindFlow,
        limits: Limits,
        events: bind.Events,
        metrics_: metrics.Metrics,
        log: logs.Log,
        leading: Callable[[], bool],
        period_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.source = source
        self.flow = flow
        self.limits = limits
        self.events = events
        self.metrics = metrics_
        self.log = log
        self.leading = leading
        self.period_s = period_s
        self.clock = clock
        self._handshaken: dict[str, float] = {}
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """Run a pass now (e.g. on becoming the leader)."""
        self._wake.set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Recovery]:
        """Run the loop until the context exits."""
        async with tasks.background(self._loop(), "recovery"):
            yield self

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.period_s)
            self._wake.clear()
            if not self.leading() or not self.source.ready():
                continue
            try:
                await self.sweep()
            except kerrors.ApiError as err:
                self.log.warning("recovery: pass cut short", err=str(err))

    async def sweep(self) -> None:
        """One pass over node locks, unbound claims and handshakes."""
        now = self.clock()
        live = self.flow.live()
        locked: set[str] = set()
        for node in self.source.nodes():
            value = node.metadata.annotations.get(keys.NODE_LOCK)
            if not value:
                continue
            try:
                lock = lockcodec.decode(value)
            except codec_errors.DecodeError:
                continue  # the next acquirer takes a malformed lock over
            key = f"{lock.namespace}/{lock.name}"
            owner = None
            if lock.has_owner:
                locked.add(key)
                owner = self.source.pod(key)
            action = judge_lock(node.metadata.name, lock, owner, key in live, now, self.limits)
            if action is not Action.KEEP:
                await self._act_on_lock(node.metadata.name, lock, value)
        for key, pod in list(self.source.unbound_claims.items()):
            if orphan_claim(pod, key in live, key in locked, now, self.limits.orphan_grace_s):
                await self._clear_claim(key)
        await self._handshakes(now)

    async def _act_on_lock(self, node: str, lock: lockcodec.NodeLock, value: str) -> None:
        """Judge again on fresh API reads, then act."""
        current = await locks.read_node(self.kube, node)
        if current.metadata.annotations.get(keys.NODE_LOCK) != value:
            return  # released or replaced meanwhile
        owner = None
        if lock.has_owner:
            assert lock.namespace is not None and lock.name is not None
            with contextlib.suppress(kerrors.NotFound):
                owner = await pods.get(self.kube, lock.namespace, lock.name)
        key = f"{lock.namespace}/{lock.name}"
        action = judge_lock(node, lock, owner, self.flow.is_live(key), self.clock(), self.limits)
        if action is Action.KEEP:
            return
        if action is Action.CLEAR_ORPHAN and owner is not None:
            if not await self._clear(owner, node):
                return  # the pod moved on (e.g. its Binding landed): judge it next pass
        if not await locks.clear_as_read(self.kube, node, current.metadata.resource_version):
            return  # the node changed since the read: judged again on the next pass
        if action is Action.RELEASE_ALLOCATE_TIMEOUT:
            self.source.health.allocate_stalled(node, self.clock(), self.source.monotonic())
        self.metrics.recovery.labels(action.value).inc()
        note = _NOTES[action].format(node=node, age=lock_age(lock, self.clock()))
        self.log.info("recovery: node lock released", node=node, owner=key, action=action.value)
        if owner is not None:
            warn = action in (Action.RELEASE_ALLOCATE_TIMEOUT, Action.CLEAR_ORPHAN)
            self.events.record(
                owner.metadata.namespace,
                owner.metadata.name,
                owner.metadata.uid,
                "Warning" if warn else "Normal",
                _REASONS[action],
                "Recovering",
                note,
            )

    async def _clear(self, pod: objects.Pod, node: str | None) -> bool:
        """Remove a pod's bind annotations if it is still unbound (compare-and-swap); True if done."""
        if pod.spec.node_name:
            return False  # bound meanwhile: judged again on the next pass
        claim = pod.metadata.annotations.get(keys.VGPU_NODE)
        if claim is None or (node is not None and claim != node):
            return True  # no claim on this node to clear: only the lock is left over
        try:
            await pods.patch_annotations(
                self.kube,
                pod.metadata.namespace,
                pod.metadata.name,
                dict.fromkeys(pod_devices.BIND_KEYS),
                labels={keys.VGPU_NODE: None},
                resource_version=pod.metadata.resource_version,
                uid=pod.metadata.uid,
            )
        except (kerrors.Conflict, kerrors.NotFound, kerrors.Invalid):
            return False
        return True

    async def _clear_claim(self, key: str) -> None:
        """An unbound pod's leftover bind annotations, with no lock naming it."""
        namespace, _, name = key.partition("/")
        try:
            pod = await pods.get(self.kube, namespace, name)
        except kerrors.NotFound:
            return
        node = pod.metadata.annotations.get(keys.VGPU_NODE, "")
        if not orphan_claim(pod, self.flow.is_live(key), False, self.clock(), self.limits.orphan_grace_s):
            return
        if not await self._clear(pod, None):
            return
        self.metrics.recovery.labels("orphan_claim_cleared").inc()
        self.log.info("recovery: orphan bind annotations cleared", pod=key, node=node)
        self.events.record(
            namespace,
            name,
            pod.metadata.uid,
            "Warning",
            "OrphanBindCleared",
            "Recovering",
            f"bind to {node} did not finish; its device reservation was removed, the pod is scheduled again",
        )

    async def _handshakes(self, now: float) -> None:
        """Write ``Requesting_<now>`` where the handshake lacks one (HAMi's scheduler does)."""
        due = [
            n
            for n in self.source.health.needs_handshake()
            if now - self._handshaken.get(n, -HANDSHAKE_MIN_INTERVAL_S) >= HANDSHAKE_MIN_INTERVAL_S
        ]
        for name in due:
            self._handshaken[name] = now
            body = {"metadata": {"annotations": {keys.NODE_HANDSHAKE: handshake.requesting_value(now)}}}
            try:
                await self.kube.request(
                    "PATCH", locks.node_path(name), body=body, content_type=kclient.MERGE_PATCH
                )
            except kerrors.NotFound:
                continue
            self.metrics.recovery.labels("handshake_requested").inc()


_REASONS = {
    Action.RELEASE_EXPIRED: "NodeLockExpired",
    Action.RELEASE_DANGLING: "NodeLockReleased",
    Action.RELEASE_ELSEWHERE: "NodeLockReleased",
    Action.RELEASE_ALLOCATE_TIMEOUT: "AllocateTimeout",
    Action.RELEASE_ANSWERED: "NodeLockReleased",
    Action.CLEAR_ORPHAN: "OrphanBindCleared",
}
_NOTES = {
    Action.RELEASE_EXPIRED: "node lock on {node} expired after {age:.0f}s; released",
    Action.RELEASE_DANGLING: "node lock on {node} named a pod that is gone or finished; released",
    Action.RELEASE_ELSEWHERE: "node lock on {node} named a pod bound to another node; released",
    Action.RELEASE_ALLOCATE_TIMEOUT: (
        "device plugin on {node} did not finish Allocate within {age:.0f}s; node lock released "
        "(the pod keeps its devices)"
    ),
    Action.RELEASE_ANSWERED: "device plugin on {node} answered but left the node lock; released",
    Action.CLEAR_ORPHAN: (
        "bind to {node} did not finish ({age:.0f}s); its device reservation and node lock were "
        "removed, the pod is scheduled again"
    ),
}
