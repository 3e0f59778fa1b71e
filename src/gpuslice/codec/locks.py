"""Node lock ``hami.io/mutex.lock``: ``<RFC3339>,<namespace>,<pod>`` (docs/hami-compat.md section 7).

A bare RFC 3339 time (older HAMi) is accepted and has no owner. Expiry is lazy: only the next
acquirer checks it, with ``now`` and the timeout passed in.
"""

from __future__ import annotations

import datetime as dt
import enum

import msgspec

from gpuslice.codec import errors, instants, keys

DEFAULT_TIMEOUT = dt.timedelta(minutes=5)
"""HAMi's ``--node-lock-timeout`` default."""

SEPARATOR = ","


class NodeLock(msgspec.Struct, frozen=True, kw_only=True):
    """A decoded lock value; namespace and name are None for a legacy bare timestamp."""

    taken: dt.datetime
    namespace: str | None = None
    name: str | None = None

    @property
    def has_owner(self) -> bool:
        """True when the lock names the pod holding it."""
        return self.namespace is not None and self.name is not None


def encode(now: instants.Instant, namespace: str, name: str) -> str:
    """The lock value for a pod taking the lock at ``now`` (UTC, whole seconds).

    Raises:
        ValueError: namespace or name contains ``,`` (cannot happen for Kubernetes names).
    """
    if SEPARATOR in namespace or SEPARATOR in name:
        raise ValueError(f"lock owner {namespace}/{name} must not contain {SEPARATOR!r}")
    return f"{instants.format_rfc3339(now)}{SEPARATOR}{namespace}{SEPARATOR}{name}"


def decode(value: str) -> NodeLock:
    """Decode a lock value, as HAMi's ``ParseNodeLock`` does.

    Raises:
        DecodeError: not ``<RFC3339>`` or ``<RFC3339>,<ns>,<name>``.
    """
    parts = value.split(SEPARATOR)
    if len(parts) not in (1, 3):
        raise errors.DecodeError(
            keys.NODE_LOCK,
            "value",
            f"malformed lock annotation: expected 3 parts, got {len(parts)} from {value}",
        )
    try:
        taken = instants.parse_rfc3339(parts[0])
    except ValueError as exc:
        raise errors.DecodeError(keys.NODE_LOCK, "time", str(exc)) from None
    if len(parts) == 1:
        return NodeLock(taken=taken)
    return NodeLock(taken=taken, namespace=parts[1], name=parts[2])


def is_owner(value: str, namespace: str, name: str) -> bool:
    """True when the lock value names this pod (HAMi: the value ends with ``,<ns>,<name>``).

    A malformed or legacy value names nobody, so it is never ours.
    """
    try:
        lock = decode(value)
    except errors.DecodeError:
        return False
    return lock.namespace == namespace and lock.name == name


def _timeout(timeout: dt.timedelta | float) -> dt.timedelta:
    return timeout if isinstance(timeout, dt.timedelta) else dt.timedelta(seconds=timeout)


def is_expired(
    lock: NodeLock, now: instants.Instant, timeout: dt.timedelta | float = DEFAULT_TIMEOUT
) -> bool:
    """True when the lock is older than the timeout (a lock from the future never expires)."""
    return instants.to_datetime(now) - lock.taken > _timeout(timeout)


class Verdict(enum.Enum):
    """What an acquirer should do with the current lock value."""

    FREE = "free"
    """No lock: take it."""
    HELD_BY_US = "held-by-us"
    """This pod already holds it (e.g. a pod with two vendors)."""
    EXPIRED = "expired"
    """Older than the timeout: force-release and take."""
    MALFORMED = "malformed"
    """Unreadable: HAMi fails forever here; gpuslice force-releases and takes it."""
    HELD_BY_OTHER = "held-by-other"
    """Another pod holds it within the timeout: take it only if that pod is dangling (deleted or
    terminated; the caller checks), else fail with lock contention. A legacy lock without owner
    cannot be checked and is contention."""


class LockState(msgspec.Struct, frozen=True, kw_only=True):
    """The verdict and, when readable, the decoded lock."""

    verdict: Verdict
    lock: NodeLock | None = None


def assess(
    value: str | None,
    namespace: str,
    name: str,
    now: instants.Instant,
    timeout: dt.timedelta | float = DEFAULT_TIMEOUT,
) -> LockState:
    """Judge the current lock value for a pod that wants the lock."""
    if value is None:
        return LockState(verdict=Verdict.FREE)
    try:
        lock = decode(value)
    except errors.DecodeError:
        return LockState(verdict=Verdict.MALFORMED)
    if lock.namespace == namespace and lock.name == name:
        return LockState(verdict=Verdict.HELD_BY_US, lock=lock)
    if is_expired(lock, now, timeout):
        return LockState(verdict=Verdict.EXPIRED, lock=lock)
    return LockState(verdict=Verdict.HELD_BY_OTHER, lock=lock)
