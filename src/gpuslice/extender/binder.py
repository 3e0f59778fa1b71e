"""The API calls of the bind path behind a small protocol, so unit tests can replace them.

``KubeBinder`` is the real implementation on ``gpuslice.kube`` (raw Binding POST, HAMi node lock,
annotation merge patches); e2e tests exercise it against a real apiserver. Every failure surfaces
as ``BindFailure`` with the operation that failed, so the bind flow can roll back precisely, and
says whether its outcome is *ambiguous*: a timeout, a lost connection or a 5xx may come after the
apiserver applied the write, so such a failure must not be rolled back blindly. A 4xx (conflict,
not found, invalid, too many requests) means the write was not applied.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgspec

from gpuslice.codec import keys
from gpuslice.codec import locks as lockcodec
from gpuslice.kube import binding, locks, objects, pods
from gpuslice.kube import client as kclient
from gpuslice.kube import errors as kerrors

CONTENTION = "NodeLockContention"
WATCHED_LOCK_TRUST_S = 5.0
"""A lock the node watch shows held by another pod, younger than this, is contention without an API
call: its owner was bound moments ago, and the watch reports the release. An older one is checked
through the API (``kube.locks.acquire``: expired or dangling locks are taken over)."""


class BindFailure(Exception):
    """A bind-path API call failed.

    Attributes:
        operation: ``lock``, ``annotate``, ``bind``, ``read`` or ``unlock``.
        reason: a short machine-readable reason (e.g. ``NodeLockContention``).
    """

    def __init__(self, operation: str, message: str, reason: str = "", ambiguous: bool = False) -> None:
        super().__init__(message)
        self.operation = operation
        self.reason = reason or operation
        self.ambiguous = ambiguous
        """True when the write may have been applied (no answer, timeout, 5xx)."""


class Binder(Protocol):
    """What the bind flow needs from the API."""

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as an API dict, or None when it does not exist."""
        ...

    async def lock_node(self, node: str, namespace: str, name: str) -> str:
        """Take HAMi's node lock for the pod; returns the node's resourceVersion after the write."""
        ...

    async def unlock_node(self, node: str, namespace: str, name: str) -> None:
        """Release the node lock if the pod holds it."""
        ...

    async def annotate(
        self,
        namespace: str,
        name: str,
        uid: str,
        annotations: Mapping[str, str | None],
        timeout: float | None = None,
    ) -> None:
        """Merge-patch the pod's annotations (and the ``hami.io/vgpu-node`` label)."""
        ...

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, timeout: float | None = None
    ) -> None:
        """POST the Binding; a repeat to the same node succeeds."""
        ...

    async def touch_node(self, node: str, annotations: Mapping[str, str]) -> None:
        """Merge-patch node annotations (used to make kube-scheduler retry pending pods)."""
        ...


def _failure(operation: str, err: kerrors.ApiError) -> BindFailure:
    reason = err.reason or type(err).__name__
    ambiguous = isinstance(err, kerrors.ApiServerError | kerrors.ApiUnavailable)
    return BindFailure(operation, str(err), str(reason), ambiguous=ambiguous)


class KubeBinder:
    """``Binder`` on a ``KubeClient``.

    Args:
        kube: the API client.
        lock_timeout_s: age after which another pod's node lock counts as expired.
    """

    def __init__(
        self,
        kube: kclient.KubeClient,
        lock_timeout_s: float = locks.DEFAULT_TIMEOUT_S,
        cached_node: Callable[[str], objects.Node | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kube = kube
        self._lock_timeout_s = lock_timeout_s
        self._cached_node = cached_node
        self._clock = clock

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as a plain dict, or None when it is gone."""
        try:
            resp = await self._kube.request("GET", pods.path(namespace, name))
        except kerrors.NotFound:
            return None
        except kerrors.ApiError as err:
            raise _failure("read", err) from err
        out = msgspec.json.decode(resp.content)
        return out if isinstance(out, dict) else None

    async def lock_node(self, node: str, namespace: str, name: str) -> str:
        """Take the node lock (CAS with retries inside ``kube.locks``); the node's new resourceVersion.

        Fast path: when the node watch shows the lock free, write it at once with the watched
        resourceVersion (one request instead of a read and a write). A stale resourceVersion gets
        409 and falls back to ``locks.acquire``, so the compare-and-swap stays exact. When the watch
        shows a fresh lock of another pod (``WATCHED_LOCK_TRUST_S``), it is contention at once, with
        no request: the caller waits for the watch to report the release. A fast-path write whose
        reply was lost falls back to ``locks.acquire`` too, which recognises the lock as ours.
        """
        cached = self._cached_node(node) if self._cached_node is not None else None
        held = cached.metadata.annotations.get(keys.NODE_LOCK) if cached is not None else None
        if held:
            now = self._clock()
            state = lockcodec.assess(held, namespace, name, now, self._lock_timeout_s)
            lock = state.lock
            if (
                state.verdict is lockcodec.Verdict.HELD_BY_OTHER
                and lock is not None
                and lock.has_owner
                and not lockcodec.is_expired(lock, now, WATCHED_LOCK_TRUST_S)
            ):
                # Waiting binds poll; a GET of the node and of its owner each time changes nothing.
                raise BindFailure(
                    "lock", f"node {node} is locked by {held!r} (watched): node lock contention", CONTENTION
                )
        if cached is not None and not held:
            value = lockcodec.encode(self._clock(), namespace, name)
            body = {
                "metadata": {
                    "annotations": {keys.NODE_LOCK: value},
                    "resourceVersion": cached.metadata.resource_version,
                }
            }
            try:
                resp = await self._kube.request(
                    "PATCH", locks.node_path(node), body=body, content_type=kclient.MERGE_PATCH
                )
                return objects.decode_node(resp.content).metadata.resource_version
            except (kerrors.Conflict, kerrors.ApiServerError, kerrors.ApiUnavailable):
                pass
            except kerrors.ApiError as err:
                raise _failure("lock", err) from err
        try:
            acquired = await locks.acquire(self._kube, node, namespace, name, timeout_s=self._lock_timeout_s)
        except kerrors.ApiError as err:
            raise _failure("lock", err) from err
        return acquired.resource_version

    async def unlock_node(self, node: str, namespace: str, name: str) -> None:
        """Release the node lock if this pod holds it."""
        try:
            await locks.release(self._kube, node, namespace, name)
        except kerrors.ApiError as err:
            raise _failure("unlock", err) from err

    async def annotate(
        self,
        namespace: str,
        name: str,
        uid: str,
        annotations: Mapping[str, str | None],
        timeout: float | None = None,
    ) -> None:
        """Patch the annotations; the ``vgpu-node`` label follows the annotation (set or removed)."""
        labels = {keys.VGPU_NODE: annotations[keys.VGPU_NODE]} if keys.VGPU_NODE in annotations else None
        try:
            await pods.patch_annotations(
                self._kube, namespace, name, annotations, labels=labels, uid=uid or None, timeout=timeout
            )
        except kerrors.ApiError as err:
            raise _failure("annotate", err) from err

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, timeout: float | None = None
    ) -> None:
        """POST the Binding (raw); already bound to ``node`` is success."""
        try:
            await binding.bind(self._kube, namespace, name, uid, node, timeout=timeout)
        except kerrors.ApiError as err:
            raise _failure("bind", err) from err

    async def touch_node(self, node: str, annotations: Mapping[str, str]) -> None:
        """Merge-patch the node's annotations."""
        body = {"metadata": {"annotations": dict(annotations)}}
        try:
            await self._kube.request(
                "PATCH", f"/api/v1/nodes/{node}", body=body, content_type=kclient.MERGE_PATCH
            )
        except kerrors.ApiError as err:
            raise _failure("touch", err) from err
