"""The bind verb: choose cards on the current snapshot, reserve them, write HAMi's contract, bind.

``bind`` re-runs the fit with the card policy on the *current* snapshot and assumes the allocation
in the cache with no ``await`` in between (the cache re-checks the cards atomically), so no
interleaving of concurrent binds can hand the same capacity to two pods, and the reservation is
visible to the next filter at once. Then, under an in-process lock per node that orders the API
calls of binds to one node, it takes HAMi's node lock (waiting briefly, see ``nodelock``), writes
the pod annotations (``vgpu-node`` + label, ``vgpu-time``, both device keys, ``bind-phase:
allocating``, ``bind-time``) and POSTs the Binding with the pod UID. Any failure rolls everything
back (forget the assumption, remove the annotations, release the node lock) and is answered as
``Error``, never as an exception. A repeated bind of a pod already bound to the node succeeds.
The node lock stays held after success: the device plugin releases it after ``Allocate``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

import numpy as np

from gpuslice.codec import errors as codec_errors
from gpuslice.codec import pod_devices, resources
from gpuslice.extender import binder as binders
from gpuslice.extender import logs, memo, metrics, nodelock, requeue, scheduling, view, wire
from gpuslice.model import allocations, requests, status
from gpuslice.model import config as model_config
from gpuslice.policy import fit


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


def describe(alloc: allocations.PodAllocation) -> str:
    """``GPU-abc (4000MB/30cores), GPU-def (...)`` for events and logs."""
    parts = [f"{g.uuid} ({g.memory_mib}MB/{g.cores}cores)" for grants in alloc.containers for g in grants]
    return ", ".join(parts) or "no devices"


@dataclasses.dataclass
class BindFlow:
    """The bind verb's state: per-pod memos, per-node locks, lock waits and requeue nudges."""

    cache: view.Cache
    binder: binders.Binder
    policies: scheduling.Policies
    request_config: model_config.RequestConfig
    clock: Callable[[], float]
    log: logs.Log
    metrics: metrics.Metrics
    events: Events = dataclasses.field(default_factory=NoEvents)
    lock_wait_s: float = 3.0
    invalid_nodes: Collection[str] = frozenset()
    """Nodes whose registration could not be decoded (the sync's live set), to name the reason."""
    _pods: memo.Memo = dataclasses.field(default_factory=memo.Memo)
    _scores: memo.Memo = dataclasses.field(default_factory=memo.Memo)
    _filters: memo.Memo = dataclasses.field(default_factory=memo.Memo)
    _done: memo.Memo = dataclasses.field(default_factory=memo.Memo)
    _locks: dict[str, asyncio.Lock] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self._waiter = nodelock.LockWaiter(self.binder, self._now, self.metrics, self.lock_wait_s)
        self._nudger = requeue.Nudger(self.binder.touch_node, self._now, self.metrics, self.log)

    def _now(self) -> float:
        """``clock()`` looked up at each call (tests replace the clock)."""
        return self.clock()

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
        """The node watch saw HAMi's lock annotation set (held) or removed; see ``nodelock``."""
        self._waiter.changed(node, held)

    def remember_filter(self, uid: str, summary: str) -> None:
        """Keep the filter summary of a pod for its bind event."""
        if uid:
            self._filters.put(uid, summary)

    def remember_scores(self, uid: str, names: Sequence[str], scores: np.ndarray) -> None:
        """Keep the best three prioritize scores (internal, ``names`` order) for the bind event.

        Ties keep the input order.
        """
        if uid and len(names):
            top = np.argsort(-scores, kind="stable")[:3].tolist()
            self._scores.put(uid, [(names[i], int(scores[i])) for i in top])

    async def bind(self, args: wire.ExtenderBindingArgs) -> str:
        """Bind the pod; returns '' on success, else the error (everything rolled back).

        The flow runs as its own task, shielded, so a dropped connection cannot stop it halfway.
        """
        task = asyncio.ensure_future(self._bind_locked(args))
        return await asyncio.shield(task)

    async def _bind_locked(self, args: wire.ExtenderBindingArgs) -> str:
        try:
            return await self._bind(args)
        except Exception as err:  # noqa: BLE001 - a surprise must still become an Error answer
            self.log.error(
                "bind failed unexpectedly", pod=f"{args.pod_namespace}/{args.pod_name}", err=repr(err)
            )
            self.metrics.binds.labels("error").inc()
            return f"internal error: {type(err).__name__}"

    async def _request(self, args: wire.ExtenderBindingArgs) -> requests.PodRequest | str:
        """The pod's request from the filter memo, else read from the API (restart, other replica)."""
        memo: requests.PodRequest | None = self._pods.get(args.pod_uid)
        if memo is not None:
            return memo
        try:
            obj = await self.binder.read_pod(args.pod_namespace, args.pod_name)
        except binders.BindFailure as err:
            self.metrics.api_errors.labels("read").inc()
            return f"cannot read pod: {err}"
        if obj is None:
            return "pod not found"
        meta = obj.get("metadata") or {}
        if args.pod_uid and meta.get("uid") != args.pod_uid:
            return "pod UID mismatch (deleted and recreated?)"
        try:
            return resources.parse_pod(obj, self.request_config)
        except codec_errors.DecodeError as err:
            return f"{status.INVALID_REQUEST}: {err}"

    async def _bind(self, args: wire.ExtenderBindingArgs) -> str:
        ns, name, uid, node = args.pod_namespace, args.pod_name, args.pod_uid, args.node
        key = f"{ns}/{name}"
        if uid and self._done.get(uid) == node:
            self.metrics.binds.labels("repeat").inc()
            return ""
        pod = await self._request(args)
        if isinstance(pod, str):
            self.metrics.binds.labels("rejected").inc()
            return pod
        if not pod.wants_gpu:
            return await self._bind_plain(ns, name, uid, node)
        card_policy = self.policies.card(pod)
        if card_policy is None:
            self.metrics.binds.labels("rejected").inc()
            return f"{status.INVALID_REQUEST}: unknown card policy {pod.card_policy!r}"
        snap = self.cache.snapshot()
        state = view.node_state(snap, node)
        if state is None:
            self.metrics.binds.labels("rejected").inc()
            return f"node {node}: {view.node_problem(node, self.invalid_nodes)}"
        placement = fit.place(
            state, pod, card_policy, scheduling.context(snap), view.quota(snap, pod.namespace)
        )
        if placement.allocation is None:
            self.metrics.binds.labels("no_fit").inc()
            return f"pod no longer fits node {node}: {','.join(placement.status.reasons)}"
        alloc = placement.allocation
        now = self.clock()
        # No await between the snapshot above and this reservation: concurrent binds see it. The
        # cache checks the cards again atomically and refuses what is no longer free.
        try:
            verdict = self.cache.assume(key, uid, alloc, now)
        except ValueError:
            # Already in the cache: confirmed by the watch or assumed by an earlier call.
            if await self._bound_anyway(ns, name, uid, node):
                self.metrics.binds.labels("repeat").inc()
                return ""
            self.metrics.binds.labels("rejected").inc()
            return f"pod {key} already holds an allocation"
        if isinstance(verdict, status.Status) and not verdict.ok:
            self.metrics.binds.labels("no_fit").inc()
            return f"pod no longer fits node {node}: {','.join(verdict.reasons)}"
        # The capacity is reserved; only the API sequence (node lock, annotations, Binding) waits
        # for earlier binds to the same node.
        lock = self._locks.setdefault(node, asyncio.Lock())
        try:
            async with lock:
                return await self._commit(ns, name, uid, node, key, alloc)
        except BaseException:
            self.cache.forget(key)
            raise

    async def _bind_plain(self, ns: str, name: str, uid: str, node: str) -> str:
        """A pod without GPUs: no reservation, no node lock, no annotations; just the Binding."""
        try:
            await self.binder.bind(ns, name, uid, node)
        except binders.BindFailure as err:
            self.metrics.api_errors.labels(err.operation).inc()
            self.metrics.binds.labels("failed").inc()
            return f"{err.operation} failed: {err}"
        self.metrics.binds.labels("bound").inc()
        return ""

    async def _commit(
        self, ns: str, name: str, uid: str, node: str, key: str, alloc: allocations.PodAllocation
    ) -> str:
        locked = annotated = False
        annotations = pod_devices.bind_annotations(alloc, self.clock())  # the time of the write
        marks = [self.clock()]
        try:
            await self._waiter.acquire(node, ns, name)
            locked = True
            marks.append(self.clock())
            await self.binder.annotate(ns, name, uid, annotations)
            annotated = True
            marks.append(self.clock())
            await self.binder.bind(ns, name, uid, node)
            marks.append(self.clock())
            if self.log.enabled(3):
                lock_ms, ann_ms, bind_ms = ((b - a) * 1e3 for a, b in zip(marks, marks[1:], strict=False))
                self.log.v(
                    3,
                    "bind timing",
                    pod=key,
                    node=node,
                    lock_ms=f"{lock_ms:.1f}",
                    annotate_ms=f"{ann_ms:.1f}",
                    binding_ms=f"{bind_ms:.1f}",
                )
        except binders.BindFailure as err:
            self.metrics.api_errors.labels(err.operation).inc()
            if err.operation == "bind" and await self._bound_anyway(ns, name, uid, node):
                return self._succeeded(ns, name, uid, node, key, alloc)
            await self._rollback(ns, name, uid, node, key, annotations if annotated else None, locked)
            self.metrics.binds.labels("failed").inc()
            self.events.record(
                ns, name, uid, "Warning", "BindingFailed", "Binding", f"{err.reason}: {err}"[:1024]
            )
            self.log.info(
                "bind failed", pod=key, node=node, op=err.operation, reason=err.reason, err=str(err)
            )
            return f"{err.operation} failed: {err}"
        except BaseException:
            await self._rollback(ns, name, uid, node, key, annotations if annotated else None, locked)
            raise
        return self._succeeded(ns, name, uid, node, key, alloc)

    def _succeeded(
        self, ns: str, name: str, uid: str, node: str, key: str, alloc: allocations.PodAllocation
    ) -> str:
        self.cache.finish_binding(key, self.clock())
        if uid:
            self._done.put(uid, node)
            self._pods.pop(uid, None)
            self._nudger.mark(uid, False)
        self.metrics.binds.labels("bound").inc()
        top = self._scores.pop(uid, None) if uid else None
        scores = ", ".join(f"{n}={wire.to_extender_score(s)}" for n, s in top) if top else "n/a"
        summary = self._filters.pop(uid, None) if uid else None
        note = f"{summary or 'Filter: n/a'}; bound to {node}; top scores: {scores}; Device: {describe(alloc)}"
        self.events.record(ns, name, uid, "Normal", "GPUAllocated", "Binding", note[:1024])
        self.log.v(2, "bound", pod=key, node=node, devices=describe(alloc))
        return ""

    async def _bound_anyway(self, ns: str, name: str, uid: str, node: str) -> bool:
        """After a failed Binding POST (e.g. a timeout), check whether it took effect."""
        try:
            obj = await self.binder.read_pod(ns, name)
        except binders.BindFailure:
            return False
        if obj is None:
            return False
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        return bool(spec.get("nodeName") == node and (not uid or meta.get("uid") == uid))

    async def _rollback(
        self,
        ns: str,
        name: str,
        uid: str,
        node: str,
        key: str,
        annotations: Mapping[str, str] | None,
        locked: bool,
    ) -> None:
        """Undo a partial bind, best effort for the API parts (the assumption always goes)."""
        self.cache.forget(key)
        if annotations is not None:
            try:
                await self.binder.annotate(ns, name, uid, dict.fromkeys(annotations))
            except binders.BindFailure as err:
                self.metrics.api_errors.labels("annotate").inc()
                self.log.warning("rollback: cannot remove annotations", pod=key, err=str(err))
        if locked:
            try:
                await self.binder.unlock_node(node, ns, name)
            except binders.BindFailure as err:
                self.metrics.api_errors.labels("unlock").inc()
                self.log.warning("rollback: cannot release node lock", node=node, pod=key, err=str(err))
