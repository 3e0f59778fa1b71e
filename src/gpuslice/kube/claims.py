"""Another scheduler's filter claim on an unbound pod: held while a scheduler may act on it, then stale.

HAMi's scheduler writes its choice onto the Pending pod in its filter: ``hami.io/vgpu-node``,
``hami.io/vgpu-time`` (unix seconds), both device keys and the ``hami.io/vgpu-node`` label
(Project-HAMi/HAMi ``pkg/scheduler/scheduler.go``, ``Filter``, which answers that one node). Its
bind then takes the node lock, patches ``hami.io/bind-phase: allocating`` and ``hami.io/bind-time``
and creates the Binding (``Bind``, same file). A scheduler that stops in between (scaled to 0 for
a migration) leaves the claim behind with no bind phase, and so does a bind that lost the node
lock (``acquireNodeLocks`` fails before the patch) when no re-filter follows. Nothing else ever
removes such a claim.

A card must never be handed out twice, so the claim counts as held for as long as a scheduler can
still act on it. The limit is HAMi's own for a bind in progress, the node lock's expiry
(``--node-lock-timeout``, 5 min, ``pkg/util/nodelock/nodelock.go``: an older lock is taken over by
the next acquirer; gpuslice's ``--node-lock-expiry-s``). ``judge`` decides, at ``now``:

* ``LOCKED`` (held): the claimed node's lock, not expired, names the pod (a bind is between its
  lock and its Binding; one that died there is the recovery loop's), or is a legacy lock without
  owner, which may be the pod's.
* ``FRESH`` (held): the claim is not older than the expiry. kube-scheduler calls the extender's
  bind in the binding cycle of the same attempt, right after the filter. Only a Permit plugin
  (HAMi's chart configures none) or a PreBind one can hold it in between: VolumeBinding waits for
  a pod's delayed volumes, up to its ``bindTimeoutSeconds`` (10 min by default). A scheduler
  still running re-filters a pod whose bind failed within kube-scheduler's backoff, and the
  re-filter writes a new time. So only while HAMi's scheduler still runs beside gpuslice (a canary
  under another scheduler name) can a claim outlive the expiry and still be bound, and only for a
  pod whose volumes take longer than that to provision.
* ``STALE`` otherwise: the cache stops counting it, the pod is scheduled as if unallocated, and
  gpuslice's Binding overwrites every key of the claim (``codec.pod_devices.BIND_KEYS``).

The age counts from ``hami.io/vgpu-time`` rounded up to the end of its second, but never from later
than this process first saw the claim (it existed by then): a claim without a readable time, or
stamped ahead of this clock, ages from that first sight (after a restart, from the new first
sight: it only waits longer). A writer whose clock runs behind ours makes its claims look older by
the difference, as HAMi's lock looks to acquirers on other hosts.

Only claims without ``hami.io/bind-phase`` are judged here. Every bind writes one: gpuslice writes
its claim only inside its Binding, with ``allocating`` (``codec.pod_devices.bind_annotations``), so
it never leaves a claim without a phase, and HAMi's bind patches the phase before its Binding. A
phase on an unbound pod is an interrupted bind, which the recovery loop judges
(``extender.recovery.orphan_claim``); a bound pod's claim is its allocation.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import msgspec

from gpuslice.codec import errors as codec_errors
from gpuslice.codec import keys
from gpuslice.codec import locks as lockcodec
from gpuslice.kube import objects

TIME_RESOLUTION_S = 1.0
"""``hami.io/vgpu-time`` carries whole seconds, rounded down: the claim may be that much younger."""


class State(enum.Enum):
    """What a claim without a bind phase is, at one instant."""

    FRESH = "fresh"
    """Not older than the expiry: the scheduler that wrote it may still bind it. Held."""
    LOCKED = "locked"
    """The claimed node's lock names the pod (or has no owner) and has not expired. Held."""
    STALE = "stale"
    """No scheduler can still act on it: not counted, and overwritten by the pod's next bind."""


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """A filter claim no bind has taken up, judged at one instant.

    Attributes:
        node: the claimed node (``hami.io/vgpu-node``).
        state: ``FRESH`` or ``LOCKED`` (held) or ``STALE``.
        written: the claim's ``hami.io/vgpu-time``; None when absent or unreadable.
        since: the instant its age counts from (see the module docstring).
        stale_at: when it stops being ``FRESH`` (``since`` plus the expiry).
        age_s: seconds since ``since``.
    """

    node: str
    state: State
    written: int | None
    since: float
    stale_at: float
    age_s: float

    @property
    def held(self) -> bool:
        """True when the claim counts as held (``FRESH`` or ``LOCKED``)."""
        return self.state is not State.STALE


def unclaimed_by_a_bind(pod: objects.Pod) -> bool:
    """True when an unbound pod carries a filter claim that no bind has taken up (no bind phase)."""
    ann = pod.metadata.annotations
    return not pod.spec.node_name and keys.VGPU_NODE in ann and keys.BIND_PHASE not in ann


def written_at(annotations: Mapping[str, str]) -> int | None:
    """``hami.io/vgpu-time`` as unix seconds, None when absent or not a number."""
    stamp = annotations.get(keys.VGPU_TIME, "")
    return int(stamp) if stamp.isdigit() and len(stamp) <= 12 else None


def lock_holds(lock_value: str | None, namespace: str, name: str, now: float, expiry_s: float) -> bool:
    """True when a node lock value, not expired, names the pod or has no owner.

    An unreadable value is held by nobody: HAMi's acquirers fail on it, so no HAMi bind is behind it.
    """
    if not lock_value:
        return False
    try:
        lock = lockcodec.decode(lock_value)
    except codec_errors.DecodeError:
        return False
    if lockcodec.is_expired(lock, now, expiry_s):
        return False
    return not lock.has_owner or (lock.namespace == namespace and lock.name == name)


def judge(
    pod: objects.Pod, lock_value: str | None, now: float, expiry_s: float, seen_at: float
) -> Claim | None:
    """The pod's filter claim at ``now``; None when it has none that no bind took up.

    Args:
        pod: the pod as last seen.
        lock_value: ``hami.io/mutex.lock`` of the claimed node as last seen (None: none).
        now: wall-clock unix seconds.
        expiry_s: the node lock's expiry (``--node-lock-expiry-s``).
        seen_at: when this process first saw this claim (the latest its age may count from).
    """
    if not unclaimed_by_a_bind(pod):
        return None
    ann = pod.metadata.annotations
    written = written_at(ann)
    since = seen_at if written is None else min(written + TIME_RESOLUTION_S, seen_at)
    stale_at = since + expiry_s
    meta = pod.metadata
    if lock_holds(lock_value, meta.namespace, meta.name, now, expiry_s):
        state = State.LOCKED
    elif now <= stale_at:
        state = State.FRESH
    else:
        state = State.STALE
    node = ann[keys.VGPU_NODE]
    return Claim(node=node, state=state, written=written, since=since, stale_at=stale_at, age_s=now - since)


def unlocked(claim: Claim, now: float) -> Claim:
    """The claim judged by its age alone, as if no lock named its pod (a lock the judge holds)."""
    state = State.FRESH if now <= claim.stale_at else State.STALE
    return msgspec.structs.replace(claim, state=state)


def waiting_note(key: str, claim: Claim, now: float) -> str:
    """Why a pod's bind waits for a claim another scheduler wrote (the bind's ``Error`` text)."""
    when = f"hami.io/vgpu-time {claim.written}" if claim.written is not None else "no hami.io/vgpu-time"
    head = (
        f"pod {key} carries another scheduler's claim on node {claim.node} ({when}, "
        f"{max(0.0, claim.age_s):.0f}s old, no hami.io/bind-phase)"
    )
    if claim.state is State.LOCKED:
        return f"{head}: the node lock on {claim.node} may be its bind's; counted as held while it is held"
    return (
        f"{head}: counted as held until it is older than the node lock expiry, "
        f"in {max(0.0, claim.stale_at - now):.0f}s; then gpuslice replaces it"
    )


def replaced_note(claim: Claim, node: str) -> str:
    """The event text of a bind that overwrote a stale claim."""
    when = f"written at {claim.written}" if claim.written is not None else "without hami.io/vgpu-time"
    return (
        f"replaced another scheduler's stale claim on node {claim.node} ({when}, "
        f"{claim.age_s:.0f}s old, no bind followed, no node lock named the pod); bound to {node}"
    )
