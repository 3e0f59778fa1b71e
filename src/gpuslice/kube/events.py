"""An ``events.k8s.io/v1`` recorder: fire-and-forget, de-duplicated, rate-limited.

``record`` never blocks and never raises: it puts the event on a bounded queue (dropping it,
and counting the drop, when the queue is full) and a single worker task sends it. An event
equal to one sent within ``dedup_window_s`` (same object, type, reason, action and note) is not
created again; the existing Event's ``series`` (count, lastObservedTime) is patched instead, as
client-go's events broadcaster does for isomorphic events.

Repeats are folded while they wait, too: an event equal to one already queued only bumps that
entry's count, so a pod that kube-scheduler re-filters ten times a second costs one queue entry,
not ten, and one API write. Warnings are sent before Normal events, so an operator-facing
Warning (a released lock, a cleared orphan) is never stuck behind a backlog of routine events.

Validation rules of the Events API (extender-protocol.md section 11) are applied when building
the object: reason/action <= 128 chars, note <= 1024, ``reportingController`` a qualified name,
``reportingInstance`` <= 128, type Normal/Warning, and Events about cluster-scoped objects (Nodes)
in namespace ``default``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

from gpuslice.kube import client as kclient
from gpuslice.kube import errors

log = logging.getLogger(__name__)

CONTROLLER = "gpuslice.io/extender"
NODE_EVENT_NAMESPACE = "default"
NORMAL = "Normal"
WARNING = "Warning"
MAX_REASON = 128
MAX_NOTE = 1024
MAX_INSTANCE = 128
DEFAULT_QUEUE = 1000
DEFAULT_WINDOW_S = 600.0
DEFAULT_QPS = 5.0
DEFAULT_BURST = 25
_DEDUP_MAX = 4096


class Ref(NamedTuple):
    """The object an event is about (``regarding``); namespace '' for cluster-scoped kinds."""

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = "v1"


class _Pending(NamedTuple):
    ref: Ref
    type: str
    reason: str
    action: str
    note: str
    when: dt.datetime


class _Queued(msgspec.Struct):
    pending: _Pending
    count: int
    last: dt.datetime


class _Sent(msgspec.Struct):
    namespace: str
    name: str
    count: int
    last: float


def micro_time(when: dt.datetime) -> str:
    """A MicroTime: RFC 3339 UTC with microseconds."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_namespace(ref: Ref) -> str:
    """Where an Event about ``ref`` lives: its namespace, or ``default`` for cluster-scoped objects."""
    return ref.namespace or NODE_EVENT_NAMESPACE


def dedup_key(ref: Ref, type_: str, reason: str, action: str, note: str) -> tuple[str, ...]:
    """Events with equal keys are the same event repeating (one Event with a series)."""
    return (ref.api_version, ref.kind, ref.namespace, ref.name, ref.uid, type_, reason, action, note)


def build(
    ref: Ref,
    type_: str,
    reason: str,
    action: str,
    note: str,
    when: dt.datetime,
    controller: str,
    instance: str,
) -> dict[str, Any]:
    """The Event object, truncated and normalised to pass the apiserver's validation."""
    regarding: dict[str, str] = {"apiVersion": ref.api_version, "kind": ref.kind, "name": ref.name}
    if ref.namespace:
        regarding["namespace"] = ref.namespace
    if ref.uid:
        regarding["uid"] = ref.uid
    stamp = int(when.timestamp() * 1e9)
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": f"{ref.name[:200]}.{stamp:x}", "namespace": event_namespace(ref)},
        "eventTime": micro_time(when),
        "reportingController": controller,
        "reportingInstance": instance[:MAX_INSTANCE],
        "action": (action or "Unknown")[:MAX_REASON],
        "reason": (reason or "Unknown")[:MAX_REASON],
        "type": type_ if type_ in (NORMAL, WARNING) else NORMAL,
        "note": note[:MAX_NOTE],
        "regarding": regarding,
    }


class Recorder:
    """Sends Events from a background worker (start it with ``run`` or ``async with``).

    Args:
        kube: the API client.
        instance: ``reportingInstance`` (e.g. the pod name of this replica).
        controller: ``reportingController``.
        queue_size: pending events kept before new ones are dropped.
        dedup_window_s: a repeat within this window updates the series instead of creating.
        qps: sustained API writes per second of the recorder.
        burst: writes allowed back to back.
        clock: wall clock (unix seconds) for event times.
    """

    def __init__(
        self,
        kube: kclient.KubeClient,
        *,
        instance: str,
        controller: str = CONTROLLER,
        queue_size: int = DEFAULT_QUEUE,
        dedup_window_s: float = DEFAULT_WINDOW_S,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        clock: Callable[[], float] = time.time,
    ):
        self.kube = kube
        self.instance = instance
        self.controller = controller
        self.window = dedup_window_s
        self._clock = clock
        self._queue_size = queue_size
        self._queued: dict[tuple[str, ...], _Queued] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._bucket = kclient.TokenBucket(qps, burst)
        self._sent: dict[tuple[str, ...], _Sent] = {}
        self._task: asyncio.Task[None] | None = None
        self.created = 0
        self.updated = 0
        self.dropped = 0
        self.failed = 0

    def emit(self, ref: Ref, type_: str, reason: str, action: str, note: str) -> None:
        """Queue an event about ``ref`` (never blocks; drops when the queue is full)."""
        when = dt.datetime.fromtimestamp(self._clock(), dt.UTC)
        # Cut to what the Event can carry before it keys the queue and the de-duplication map:
        # a note built from a request's value must not be kept whole.
        reason, action, note = reason[:MAX_REASON], action[:MAX_REASON], note[:MAX_NOTE]
        key = dedup_key(ref, type_, reason, action, note)
        queued = self._queued.get(key)
        if queued is not None:
            queued.count += 1
            queued.last = when
            return
        if len(self._queued) >= self._queue_size:
            self.dropped += 1
            return
        self._queued[key] = _Queued(_Pending(ref, type_, reason, action, note, when), 1, when)
        self._idle.clear()
        self._wake.set()

    def record(
        self, namespace: str, name: str, uid: str, type_: str, reason: str, action: str, note: str
    ) -> None:
        """Queue an event about a pod (the extender's ``Events`` protocol)."""
        self.emit(Ref("Pod", name, namespace, uid), type_, reason, action, note)

    def record_node(self, name: str, uid: str, type_: str, reason: str, action: str, note: str) -> None:
        """Queue an event about a node (it lives in namespace ``default``)."""
        self.emit(Ref("Node", name, "", uid), type_, reason, action, note)

    async def _create(self, p: _Pending, count: int, last: dt.datetime) -> _Sent:
        body = build(p.ref, p.type, p.reason, p.action, p.note, p.when, self.controller, self.instance)
        if count > 1:
            body["series"] = {"count": count, "lastObservedTime": micro_time(last)}
        ns = body["metadata"]["namespace"]
        await self.kube.request("POST", f"/apis/events.k8s.io/v1/namespaces/{ns}/events", body=body)
        self.created += 1
        return _Sent(ns, body["metadata"]["name"], count, last.timestamp())

    async def _repeat(self, sent: _Sent, count: int, last: dt.datetime) -> None:
        patch = {"series": {"count": sent.count + count, "lastObservedTime": micro_time(last)}}
        await self.kube.request(
            "PATCH",
            f"/apis/events.k8s.io/v1/namespaces/{sent.namespace}/events/{sent.name}",
            body=patch,
            content_type=kclient.MERGE_PATCH,
        )
        sent.count += count
        sent.last = last.timestamp()
        self.updated += 1

    async def send(self, p: _Pending, count: int = 1, last: dt.datetime | None = None) -> None:
        """Create or update the Event for ``count`` occurrences (errors are logged, not raised)."""
        await self._bucket.acquire()
        last = last or p.when
        key = dedup_key(p.ref, p.type, p.reason, p.action, p.note)
        sent = self._sent.get(key)
        try:
            if sent is not None and p.when.timestamp() - sent.last <= self.window:
                try:
                    await self._repeat(sent, count, last)
                    return
                except errors.NotFound:
                    pass  # the Event expired (TTL): create a new one
            if len(self._sent) >= _DEDUP_MAX:
                self._sent.pop(next(iter(self._sent)))
            self._sent[key] = await self._create(p, count, last)
        except errors.ApiError as exc:
            self.failed += 1
            log.warning(
                "event %s on %s %s/%s not recorded: %s",
                p.reason,
                p.ref.kind,
                p.ref.namespace,
                p.ref.name,
                exc,
            )

    def _next(self) -> _Queued:
        """The oldest queued Warning, else the oldest queued event (removed from the queue)."""
        key = next((k for k, q in self._queued.items() if q.pending.type == WARNING), None)
        return self._queued.pop(key if key is not None else next(iter(self._queued)))

    async def run(self) -> None:
        """The worker loop: send queued events until cancelled."""
        while True:
            if not self._queued:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            queued = self._next()
            await self.send(queued.pending, queued.count, queued.last)

    async def flush(self) -> None:
        """Wait until every queued event has been sent (tests and shutdown)."""
        await self._idle.wait()

    async def __aenter__(self) -> Recorder:
        self._task = asyncio.create_task(self.run(), name="gpuslice-events")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.flush(), 5.0)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
