"""The API calls of the bind path behind a small protocol, so unit tests can replace them.

``KubeBinder`` is the real implementation on ``gpuslice.kube`` (raw Binding POST carrying the
pod's device annotations, HAMi node lock); e2e tests exercise it against a real apiserver. Every
failure surfaces as ``BindFailure`` with the operation that failed, so the bind flow can roll back
precisely, and says whether its outcome is *ambiguous*: a timeout, a lost connection or a 5xx may
come after the apiserver applied the write, so such a failure must not be rolled back blindly. A
4xx (conflict, not found, invalid, too many requests) means the write was not applied.

A Binding refused because the pod is already bound to the same node is not a failure: the pod is
where kube-scheduler wants it. Whose devices it carries decides what the bind flow does next, so
``bind`` compares the pod's ``DECISION_KEYS`` with the annotations it sent (``carries``).

HAMi's ``hami.io/vgpu-node`` label (HAMi's scheduler sets it with the annotations; HAMi's vGPU
monitor lists a node's pods by it, ``cmd/vGPUmonitor/metrics.go``) travels in the Binding too, but
the apiserver copies Binding labels only behind the ``PodTopologyLabelsAdmission`` feature gate
(alpha, off by default through 1.34). ``label`` therefore sets it with a merge patch after the
Binding, once the node's queue has moved on (where the Binding carried it, the patch changes
nothing and the apiserver writes nothing).
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
DECISION_KEYS = (keys.VGPU_NODE, keys.VGPU_TIME, keys.DEVICES_ALLOCATED, keys.BIND_TIME)
"""The bind annotations that identify one binder's decision: written once with the Binding and never
rewritten by the device plugin (which blanks ``vgpu-devices-to-allocate`` and sets ``bind-phase``
after ``Allocate``; HAMi ``pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go``)."""
WATCHED_LOCK_TRUST_S = 5.0
"""A lock the node watch shows held by another pod, younger than this, is contention without an API
call: its owner was bound moments ago, and the watch reports the release. An older one is checked
through the API (``kube.locks.acquire``: expired or dangling locks are taken over)."""


class BindFailure(Exception):
    """A bind-path API call failed.

    Attributes:
        operation: ``lock``, ``bind``, ``label``, ``read``, ``unlock`` or ``touch``.
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
        """Take HAMi's node lock for the pod; returns the truth check's resourceVersion.

        Every pod write of a writer that held the node lock before us happened before that
        version: the node's version the lock was compare-and-swapped against (the previous
        holder's release is at or before it), or any later one.
        """
        ...

    async def unlock_node(self, node: str, namespace: str, name: str) -> None:
        """Release the node lock if the pod holds it."""
        ...

    async def bind(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        annotations: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> bool:
        """POST the Binding carrying ``annotations``; the pod is bound to ``node`` afterwards.

        Returns:
            True when the pod carries ``annotations`` (this call bound it, or an earlier one of
            ours did); False when another writer bound it to ``node`` with other devices.
        """
        ...

    async def label(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Give a pod bound with our annotations HAMi's ``hami.io/vgpu-node=<node>`` label."""
        ...

    async def touch_node(self, node: str, annotations: Mapping[str, str]) -> None:
        """Merge-patch node annotations (used to make kube-scheduler retry pending pods)."""
        ...


def carries(pod_annotations: Mapping[str, str], ours: Mapping[str, str] | None) -> bool:
    """True when a bound pod's annotations hold our decision (the ``DECISION_KEYS`` we sent)."""
    if not ours:
        return True
    return all(pod_annotations.get(k) == ours[k] for k in DECISION_KEYS if k in ours)


def _failure(operation: str, err: kerrors.ApiError) -> BindFailure:
    reason = err.reason or type(err).__name__
    ambiguous = isinstance(err, kerrors.ApiServerError | kerrors.ApiUnavailable)
    return BindFailure(operation, str(err), str(reason), ambiguous=ambiguous)


class KubeBinder:
    """``Binder`` on a ``KubeClient``.

    Args:
        kube: the API client.
        lock_timeout_s: age after which another pod's node lock counts as expired.
        cached_node: the node as the node watch shows it (the lock's fast path).
        clock: wall clock (the lock's time).
        label_pods: patch HAMi's ``hami.io/vgpu-node`` label onto bound pods (``label``); off, a
            bind writes one request less per pod, for clusters that run no HAMi vGPU monitor or
            whose apiserver copies Binding labels.
    """

    def __init__(
        self,
        kube: kclient.KubeClient,
        lock_timeout_s: float = locks.DEFAULT_TIMEOUT_S,
        cached_node: Callable[[str], objects.Node | None] | None = None,
        clock: Callable[[], float] = time.time,
        label_pods: bool = True,
    ) -> None:
        self._kube = kube
        self._label_pods = label_pods
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
        """Take the node lock (CAS with retries inside ``kube.locks``); the truth check's resourceVersion.

        Fast path: when the node watch shows the lock free, write it at once with the watched
        resourceVersion (one request instead of a read and a write). A stale resourceVersion gets
        409 and falls back to ``locks.acquire``, so the compare-and-swap stays exact. The version
        returned is then the watched one the write was conditioned on: the write succeeding proves
        the node did not change since, so the previous holder's release, and every pod write it
        made while it held the lock (its Binding with its devices), came at or before it. The pod
        watch has usually passed that version already, where it cannot pass our own lock write
        until some later pod write or bookmark arrives; the truth check then costs no wait and no
        read. ``locks.acquire`` returns the version after its write (later, so as safe). When the watch
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
                await self._kube.request(
                    "PATCH", locks.node_path(node), body=body, content_type=kclient.MERGE_PATCH
                )
                return cached.metadata.resource_version  # see the docstring: the CAS's base version
            except (kerrors.Conflict, kerrors.ApiServerError, kerrors.ApiUnavailable):
                pass
            except kerrors.ApiError as err:
                raise _failure("lock", err) from err
        try:
            acquired = await locks.acquire(
                self._kube, node, namespace, name, timeout_s=self._lock_timeout_s, clock=self._clock
            )
        except kerrors.ApiError as err:
            raise _failure("lock", err) from err
        return acquired.resource_version

    async def unlock_node(self, node: str, namespace: str, name: str) -> None:
        """Release the node lock if this pod holds it."""
        try:
            await locks.release(self._kube, node, namespace, name)
        except kerrors.ApiError as err:
            raise _failure("unlock", err) from err

    async def bind(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        annotations: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> bool:
        """POST the Binding (raw) with the annotations; already bound to ``node`` is not a failure.

        The ``hami.io/vgpu-node`` label HAMi's scheduler sets goes in the Binding's labels, which
        the apiserver copies only where it copies Binding labels at all (see ``kube.binding``).
        """
        node_label = (annotations or {}).get(keys.VGPU_NODE)
        labels = {keys.VGPU_NODE: node_label} if node_label else None
        try:
            bound = await binding.create(
                self._kube,
                namespace,
                name,
                uid,
                node,
                annotations=annotations,
                labels=labels,
                timeout=timeout,
            )
        except kerrors.ApiError as err:
            raise _failure("bind", err) from err
        return bound.pod is None or carries(bound.pod.metadata.annotations, annotations)

    async def label(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Set the ``hami.io/vgpu-node`` label by merge patch (UID-checked), unless ``label_pods`` is off."""
        if not self._label_pods:
            return
        meta: dict[str, Any] = {"labels": {keys.VGPU_NODE: node}}
        if uid:
            meta["uid"] = uid  # a pod recreated under the name: 422, metadata.uid is immutable
        try:  # the answer (the whole pod) is not decoded: nothing in it is needed
            await self._kube.request(
                "PATCH", pods.path(namespace, name), body={"metadata": meta}, content_type=kclient.MERGE_PATCH
            )
        except kerrors.ApiError as err:
            raise _failure("label", err) from err

    async def touch_node(self, node: str, annotations: Mapping[str, str]) -> None:
        """Merge-patch the node's annotations."""
        body = {"metadata": {"annotations": dict(annotations)}}
        try:
            await self._kube.request(
                "PATCH", f"/api/v1/nodes/{node}", body=body, content_type=kclient.MERGE_PATCH
            )
        except kerrors.ApiError as err:
            raise _failure("touch", err) from err
