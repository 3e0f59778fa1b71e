"""HAMi's node lock ``hami.io/mutex.lock`` (docs/hami-compat.md section 7), taken by compare-and-swap.

At most one HAMi pod per node may sit between its Binding and the device plugin's ``Allocate``
(kubelet's ``Allocate`` carries no pod identity); the lock names that pod. The extender takes it
just before the Binding and the device plugin (or ``gpuslice_dev.nodesim``) releases it.

Acquire, decided by ``decide`` from the current value:

- absent -> take;
- held by the same pod -> already held;
- older than the timeout (default 5 min), or unreadable -> take over (one CAS replaces the value);
- held by another pod: read it; deleted, being deleted, or Succeeded/Failed -> dangling, take
  over; otherwise (e.g. Pending, waiting for ``Allocate``) -> ``LockContention``. A legacy
  value without owner can only expire. A Pending owner
  is never stolen: the device plugin would then hand its devices to the wrong pod.

Every write is a JSON merge patch carrying the node's ``resourceVersion``; a 409 means somebody
else wrote first, so the node is re-read and the decision made again (bounded, jittered backoff).
A write whose reply was lost (5xx or no answer) may have been applied: the node is re-read, and a
lock that names this pod is ours. Release is owner-checked and also compare-and-swap. The expiry
is the caller's setting (HAMi's ``--node-lock-timeout`` / ``HAMI_NODELOCK_EXPIRE``).
"""

from __future__ import annotations

import asyncio
import enum
import random
import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from gpuslice.codec import keys
from gpuslice.codec import locks as lockcodec
from gpuslice.kube import client as kclient
from gpuslice.kube import errors, objects, pods

DEFAULT_TIMEOUT_S = 300.0
"""HAMi's ``--node-lock-timeout`` default (5 min)."""
DEFAULT_RETRIES = 5
BACKOFF_BASE_S = 0.1
BACKOFF_FACTOR = 2.0
BACKOFF_JITTER = 0.5


class LockContention(errors.ApiError, errors.TemporaryError):
    """Another live pod holds the node lock (or the CAS kept losing races)."""

    default_code = 409


class Outcome(enum.Enum):
    """How ``acquire`` got the lock."""

    TAKEN = "taken"
    ALREADY_HELD = "already-held"
    TOOK_EXPIRED = "took-expired"
    TOOK_MALFORMED = "took-malformed"
    TOOK_DANGLING = "took-dangling"


class Acquired(NamedTuple):
    """A successful acquire: how, and the node's resourceVersion after the write."""

    outcome: Outcome
    resource_version: str


_TAKE = {
    lockcodec.Verdict.FREE: Outcome.TAKEN,
    lockcodec.Verdict.EXPIRED: Outcome.TOOK_EXPIRED,
    lockcodec.Verdict.MALFORMED: Outcome.TOOK_MALFORMED,
}


def is_dangling(owner: objects.Pod | None) -> bool:
    """True when the lock's owner no longer needs it: gone, being deleted, or terminated."""
    return owner is None or owner.metadata.deletion_timestamp is not None or owner.terminated


def backoff(attempt: int, rng: Callable[[], float]) -> float:
    """Seconds to wait after the ``attempt``-th (0-based) lost race: 0.1 s x 2^attempt, +0..50 %."""
    base = BACKOFF_BASE_S * BACKOFF_FACTOR**attempt
    return base * (1.0 + BACKOFF_JITTER * rng())


def node_path(node: str) -> str:
    """API path of a node."""
    return f"/api/v1/nodes/{node}"


def _patch(value: str | None, resource_version: str) -> dict[str, object]:
    return {"metadata": {"annotations": {keys.NODE_LOCK: value}, "resourceVersion": resource_version}}


async def read_node(kube: kclient.KubeClient, node: str) -> objects.Node:
    """Read a node (its annotations carry the lock)."""
    return objects.decode_node((await kube.request("GET", node_path(node))).content)


async def _write(kube: kclient.KubeClient, node: str, value: str | None, resource_version: str) -> str:
    resp = await kube.request(
        "PATCH", node_path(node), body=_patch(value, resource_version), content_type=kclient.MERGE_PATCH
    )
    return objects.decode_node(resp.content).metadata.resource_version


def _owner_key(lock: lockcodec.NodeLock) -> tuple[str, str] | None:
    if lock.namespace is None or lock.name is None:
        return None  # a legacy lock names nobody: it can only expire
    return lock.namespace, lock.name


async def _owner(kube: kclient.KubeClient, namespace: str, name: str) -> objects.Pod | None:
    try:
        return await pods.get(kube, namespace, name)
    except errors.NotFound:
        return None


async def acquire(
    kube: kclient.KubeClient,
    node: str,
    namespace: str,
    name: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    retries: int = DEFAULT_RETRIES,
    clock: Callable[[], float] = time.time,
    rng: Callable[[], float] = random.random,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Acquired:
    """Take the node lock for pod ``namespace/name``.

    Args:
        kube: the API client.
        node: node name.
        namespace: the acquiring pod's namespace.
        name: the acquiring pod's name.
        timeout_s: age after which a lock is expired.
        retries: CAS attempts before giving up.
        clock: wall clock, unix seconds (the lock value is wall time).
        rng: uniform [0, 1) source for the backoff jitter.
        sleep: async sleep.

    Returns:
        How the lock was obtained and the node's new resourceVersion.

    Raises:
        LockContention: a live pod holds it, or every CAS attempt lost a race.
        errors.NotFound: no such node.
        errors.ApiError: any other failure.
    """
    for attempt in range(max(1, retries)):
        current = await read_node(kube, node)
        value = current.metadata.annotations.get(keys.NODE_LOCK)
        state = lockcodec.assess(value, namespace, name, clock(), timeout_s)
        if state.verdict is lockcodec.Verdict.HELD_BY_US:
            return Acquired(Outcome.ALREADY_HELD, current.metadata.resource_version)
        outcome = _TAKE.get(state.verdict)
        if outcome is None:
            holder = state.lock
            owner = None if holder is None else _owner_key(holder)
            if owner is None or not is_dangling(await _owner(kube, *owner)):
                raise LockContention(
                    f"node {node} has been locked within {timeout_s:g}s by {value!r}: node lock contention",
                    reason="NodeLockContention",
                )
            outcome = Outcome.TOOK_DANGLING
        mine = lockcodec.encode(clock(), namespace, name)
        try:
            rv = await _write(kube, node, mine, current.metadata.resource_version)
        except errors.Conflict:
            await sleep(backoff(attempt, rng))
            continue
        except (errors.ApiServerError, errors.ApiUnavailable):
            # The reply was lost: the write may have been applied. The next read tells, and a
            # lock naming this pod is recognised as ours (HELD_BY_US) instead of contention.
            await sleep(backoff(attempt, rng))
            continue
        return Acquired(outcome, rv)
    raise LockContention(
        f"node {node}: lock CAS lost {retries} races: node lock contention", reason="NodeLockContention"
    )


async def clear_as_read(kube: kclient.KubeClient, node: str, resource_version: str) -> bool:
    """Remove the lock from the node as it was read (compare-and-swap); False when it changed since."""
    try:
        await _write(kube, node, None, resource_version)
    except errors.Conflict:
        return False
    return True


async def release(
    kube: kclient.KubeClient,
    node: str,
    namespace: str,
    name: str,
    *,
    retries: int = DEFAULT_RETRIES,
    rng: Callable[[], float] = random.random,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> bool:
    """Release the node lock if pod ``namespace/name`` holds it.

    Returns:
        True when this call removed the lock; False when it was absent or held by someone else.

    Raises:
        errors.NotFound: no such node.
        errors.ApiError: any other failure (including losing every CAS race).
    """
    for attempt in range(max(1, retries)):
        current = await read_node(kube, node)
        value = current.metadata.annotations.get(keys.NODE_LOCK)
        if not value or not lockcodec.is_owner(value, namespace, name):
            return False
        try:
            await _write(kube, node, None, current.metadata.resource_version)
        except errors.Conflict:
            await sleep(backoff(attempt, rng))
            continue
        return True
    raise errors.Conflict(f"node {node}: lock release lost {retries} races")
