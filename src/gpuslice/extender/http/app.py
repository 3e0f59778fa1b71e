"""The extender's HTTP app: ``create_app(deps)`` (ASGI), thin handlers, no globals.

Each handler (``Handlers``) does decode -> ``cache.snapshot()`` -> policy -> encode. Filter and
prioritize make no API call. Every POST verb is served on plain ASGI (``_Fast``); Starlette serves
the GET routes (health, readiness, metrics, the cluster view ``/ui`` of ``clusterview``) and runs
the lifespan. Malformed
input (bad JSON, wrong types, oversized bodies) is a 4xx with a plain message;
scheduling failures go in the response body (``FailedNodes``, ``Error``), never as a 5xx. The
lifespan enters the injected background services (informers, event worker) and stops them;
before it stops them, it finishes the bind flow's pending work (``drain_binds``).
``create_metrics_app`` serves the same GET routes alone, for a plain-HTTP listener beside an
mTLS one.

Every body is checked before any decoder sees it: larger than ``body_limit_bytes`` is a 413, nested
deeper than ``max_json_depth`` a 400 (``jsondepth``; msgspec recurses once per level, also over
unknown fields and ``msgspec.Raw``, and would raise ``RecursionError`` on deep input). A
``RecursionError`` from any handler is still answered 400, as a second line of defence. Any other
exception is a bug: answered 500 (``internal error: <type>``) with one error log line naming where.
Neither answer keeps the exception: its traceback holds the handlers' frames, and with them the
request's body, until the garbage collector's next full pass (which an idle server may never run).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from typing import TypedDict, TypeVar

import msgspec
import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gpuslice.cache import cache as caches
from gpuslice.extender import config, holdings, listeners, metrics, parsing, tasks, wire
from gpuslice.extender import preemption as preemptions
from gpuslice.extender.binding import bind as binds
from gpuslice.extender.http import jsondepth, preempt
from gpuslice.extender.ops import clusterview
from gpuslice.extender.ops import shadow as shadows
from gpuslice.framework import cycle as cycles
from gpuslice.framework import explain as explains
from gpuslice.framework import gangs as gang_plans
from gpuslice.framework import logs, memo, nominations, scheduling, view
from gpuslice.framework import pending as pendings
from gpuslice.framework import profile as profiles
from gpuslice.kube import claims, objects
from gpuslice.kube import errors as kerrors
from gpuslice.model import requests, status
from gpuslice.policy import api, batch

JSON = "application/json"
REQUEST_MEMO_ENTRIES, REQUEST_MEMO_BYTES = 4096, 8 << 20
"""Parsed requests kept by pod UID (a pod is filtered, scored and bound within seconds)."""
SPEC_MEMO_ENTRIES, SPEC_MEMO_BYTES = 256, 2 << 20
"""Parsed requests kept by spec digest (one per workload template in flight)."""
SCORE_MEMO_ENTRIES, SCORE_MEMO_BYTES = 1024, 32 << 20
"""Filter results kept for prioritize (popped by it; pods kube-scheduler does not score stay)."""
SEEN_MEMO_ENTRIES, SEEN_MEMO_BYTES = 20_000, 4 << 20
"""UIDs of pods already counted in the learned workload."""
_NOTHING_BUSY: frozenset[str] = frozenset()
"""``Handlers._busy`` when the lock margin is off."""
NOT_SYNCED = "gpuslice cache not synced yet (first list or relist in progress); retry"
DRAIN_BINDS_S = 10.0
"""Longest wait at shutdown for the bind flow's unfinished work (``drain_binds``); with the
``serve.BEFORE_EXIT_S`` before it, well inside the pod's default 30 s termination grace period."""
T = TypeVar("T")
Service = Callable[[], contextlib.AbstractAsyncContextManager[object]]
"""A background service the lifespan runs (entered at startup, exited at shutdown)."""


class BadRequest(Exception):
    """Input we cannot act on; answered with ``status`` and the message as plain text."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclasses.dataclass(kw_only=True)
class Deps:
    """Everything the app needs, built by ``serve`` (or by tests, with fakes).

    The safety settings (``synced``, ``follower``, ``follower_ready``, ``excluded``) have no
    defaults: a composition that forgets one fails here, at construction, instead of answering
    from a partial cache or as a leader it is not.
    """

    settings: config.Settings
    cache: caches.ClusterCache
    flow: binds.BindFlow
    profile: profiles.Profile
    log: logs.Log
    metrics: metrics.Metrics
    events: binds.Events
    follower: Callable[[], bool]
    """True while this replica follows where only the leader should get calls (``lease`` mode):
    every verb's answer then carries ``Connection: close``."""
    follower_ready: bool
    """``/readyz`` of a synced follower: 200 ``ok (follower)`` when the Service finds the leader by
    its pod label (``extender.leaderlabel``), else 503 ``not leader`` (readiness is the only way)."""
    before_exit: Callable[[], Awaitable[None]] | None = None
    """Run on SIGTERM before the listeners close (the leader's pod label is removed); None: nothing."""
    synced: Callable[[], bool]
    """Every watched kind listed and healthy: filter and prioritize answer only then."""
    services: Sequence[Service] = ()
    """Background services the lifespan enters in order and leaves in reverse (``BindFlow.drain``
    runs first, within ``DRAIN_BINDS_S``, while they still run)."""
    invalid_nodes: Collection[str] = frozenset()
    """Nodes whose GPU registration does not decode (live view kept by the feed)."""
    excluded: Mapping[str, str]
    """Registered nodes not to place on now -> reason code (stale handshake, held lock)."""
    pending: pendings.PendingPods = dataclasses.field(default_factory=lambda: pendings.PendingPods(time.time))
    """GPU pods the filter found no node for (``extender.pending``); ``/explain`` and the UI read it."""
    read_pod: Callable[[str, str], Awaitable[objects.Pod | None]] | None = None
    """``(namespace, name)`` -> the pod (None: no such pod), for ``/explain`` of a pod not pending."""
    shadow: shadows.Shadow | None = None
    """Shadow mode (``--shadow-policy``): told what each filter judged; None when off."""
    preemption: preemptions.Preemption | None = None
    """GPU-aware preemption (``extender.preemption``): told of GPU pods no node fits; None when off."""
    nominator: nominations.Nominator | None = None
    """The preemptors' nominations the cache applies (shown by the cluster view); None: not shown."""
    gangs: gang_plans.Gangs | None = None
    """Gang plans (``framework.gangs``): a gang member's filter answers its planned node; None: off."""
    locks: Callable[[str], Collection[str]] | None = None
    """Pod ``namespace/name`` -> the nodes whose HAMi lock it would find busy
    (``lockview.LockView.busy``), for the lock margin; None: no lock state (the margin has no effect)."""


@dataclasses.dataclass(frozen=True, slots=True)
class FilterDone:
    """One filter's verdict, as its listeners get it (``Handlers.on_filtered``).

    Attributes:
        pod: the pod's request.
        meta: the pod's metadata as kube-scheduler sent it.
        priority: the pod's priority (for preemption).
        preemption_policy: the pod's preemption policy.
        snap: the snapshot the pod was judged on.
        names: the candidate nodes kube-scheduler sent.
        busy: the nodes whose HAMi lock the pod would find busy (``_NOTHING_BUSY``: not looked at).
        outcome: the verdict.
        summary: ``Filter: 2/3 nodes feasible, ...`` for events and the pending registry.
    """

    pod: requests.PodRequest
    meta: wire.ObjectMeta
    priority: int | None
    preemption_policy: str | None
    snap: view.Snapshot
    names: Sequence[str]
    busy: Collection[str]
    outcome: scheduling.FilterOutcome
    summary: str


class State(TypedDict):
    """The lifespan state handed to requests (``request.state.deps``)."""

    deps: Deps


def _bad(err: BadRequest | RecursionError) -> BadRequest:
    """``err`` as a BadRequest: a RecursionError (input nested past a decoder's reach) is a 400."""
    if isinstance(err, BadRequest):
        return err
    return BadRequest("request nested too deeply to decode")


def _decode(decoder: msgspec.json.Decoder[T], data: bytes) -> T:
    if not data:
        raise BadRequest("empty request body; expected JSON")
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as err:
        raise BadRequest(f"invalid request: {err}") from None
    except msgspec.DecodeError as err:
        raise BadRequest(f"malformed JSON: {err}") from None


class _Requests:
    """Parsed pod requests by UID and resourceVersion: a pod is parsed once, not on every verb.

    Any change to a pod (annotations included) bumps its resourceVersion, so a hit is exact. Pods
    of one workload share their spec, so the parse is also kept by a digest of the decoded parts
    it reads (containers, init containers, and the annotations in ``objects.POD_ANNOTATIONS``),
    and only the pod's own parts are filled in per pod: its identity, its controller owner and the
    value of the job label. Whatever else the pod carries (other annotations and labels) is
    neither kept nor encoded, and both memos have a byte budget (``memo.Memo``).
    """

    def __init__(self, config_: config.Settings) -> None:
        self._config = config_.request_config
        self._job_label = config_.job_label
        self._memo = memo.Memo(REQUEST_MEMO_ENTRIES, REQUEST_MEMO_BYTES, _weigh_parsed)
        self._by_spec = memo.Memo(SPEC_MEMO_ENTRIES, SPEC_MEMO_BYTES, _weigh_parsed)

    def cached(self, uid: str, resource_version: str) -> parsing.Parsed | None:
        """The parse result of this exact pod version, or None when it was not parsed yet."""
        hit = self._memo.get(uid) if uid and resource_version else None
        if hit is not None and hit[0] == resource_version:
            parsed: parsing.Parsed = hit[1]
            return parsed
        return None

    def _labels(self, labels: Mapping[str, str] | None) -> dict[str, str]:
        """The labels scheduling reads: the job label's, when configured and carried."""
        value = labels.get(self._job_label) if labels and self._job_label else None
        return {self._job_label: value} if value is not None else {}

    def parse(self, pod: wire.Pod) -> parsing.Parsed:
        """The pod's GPU request, or why it is invalid (``status.invalid_request``)."""
        meta = pod.metadata
        hit = self.cached(meta.uid, meta.resource_version)
        if hit is not None:
            return hit
        annotations = objects.gpu_annotations(meta.annotations)
        spec = wire.ENCODER.encode((pod.spec.containers, pod.spec.init_containers, annotations))
        spec_key = hashlib.blake2b(spec, digest_size=16).digest()
        template: parsing.Parsed | None = self._by_spec.get(spec_key)
        parsed: parsing.Parsed
        labels = self._labels(meta.labels)
        gang = parsing.gang_of(
            meta.namespace, meta.labels, meta.annotations, pod.spec.scheduling_group, pod.spec.workload_ref
        )
        if isinstance(gang, status.Status):
            parsed = gang
        elif template is None:
            kept = msgspec.structs.replace(
                pod, metadata=msgspec.structs.replace(meta, annotations=annotations, labels=labels)
            )
            parsed = parsing.parse_pod(kept.to_dict(), self._config)
            self._by_spec.put(spec_key, parsed)
            if not isinstance(parsed, status.Status):
                parsed = msgspec.structs.replace(parsed, gang=gang)
        elif isinstance(template, status.Status):
            parsed = template
        else:
            parsed = msgspec.structs.replace(
                template,
                namespace=meta.namespace or "default",
                name=meta.name,
                uid=meta.uid,
                owner=next((o.uid for o in meta.owner_references or () if o.controller is True), ""),
                labels=tuple(labels.items()),
                gang=gang,
            )
        if meta.uid and meta.resource_version:
            self._memo.put(meta.uid, (meta.resource_version, parsed))
        return parsed


def _key(pod: requests.PodRequest) -> str:
    """``namespace/name``."""
    return f"{pod.namespace}/{pod.name}"


def _weigh_parsed(value: object) -> int:
    """Bytes a memo entry of ``_Requests`` holds: a request, a refusal, or a (version, either) pair."""
    if isinstance(value, tuple):
        return len(value[0]) + _weigh_parsed(value[1])
    if isinstance(value, status.Status):
        return len(value.message)
    assert isinstance(value, requests.PodRequest)
    return requests.footprint(value)


class _Shapes:
    """Requested shapes, handed to the cache's workload histogram at most once per period.

    Each hand-over bumps the cache generation (a snapshot rebuild); batching (the default period
    is a second) keeps that off the per-request path, as the fragmentation-aware policies do not
    need per-request freshness. Period 0 hands each shape over before its pod is scored, as the
    simulator's online workload does. The histogram applies its rules (``workload_*`` settings,
    docs/workload.md) request by request either way; the policies see its snapshot, which changes
    only when the learned weights drift by ``workload_drift``.
    """

    def __init__(self, cache: view.Cache, period_s: float = 1.0) -> None:
        self._cache = cache
        self._period = period_s
        self._pending: list[api.Shape] = []
        self._last = time.monotonic()

    def add(self, shape: api.Shape) -> None:
        self._pending.append(shape)

    def flush(self) -> bool:
        """Hand the pending shapes over when the period has passed; True when it did."""
        if not self._pending:
            return False
        now = time.monotonic()
        if now - self._last < self._period:
            return False
        for shape in self._pending:
            view.observe(self._cache, shape)
        self._pending.clear()
        self._last = now
        return True


class _Fast:
    """The app: every POST verb straight on ASGI, the GET routes and the lifespan through Starlette.

    kube-scheduler calls filter and prioritize once each per pod, serially; skipping Starlette's
    middleware, routing and Request/Response objects saves a good part of the per-request cost.
    While this replica should not get calls (caches not synced, or a follower in ``lease`` mode),
    answers carry ``Connection: close``: a Service only sends *new* connections to the ready
    replica it selects (the leader's pod label), so a kube-scheduler keep-alive connection to a
    deposed leader must not outlive the answer.
    """

    def __init__(
        self,
        inner: Starlette,
        routes: Mapping[str, Callable[[bytes], Awaitable[tuple[int, bytes, bytes]]]],
        limit: int,
        ready: Callable[[], bool],
    ) -> None:
        self.inner = inner
        self._routes = routes
        self._limit = limit
        self._ready = ready

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection scope."""
        route = self._routes.get(scope["path"]) if scope["type"] == "http" else None
        if route is None or scope["method"] != "POST":
            await self.inner(scope, receive, send)
            return
        try:
            body = await self._read(scope, receive)
        except BadRequest as err:
            status_code, content_type, out = err.status_code, _TEXT, str(err).encode()
        else:
            status_code, content_type, out = await route(body)
        headers = [(b"content-type", content_type), (b"content-length", str(len(out)).encode())]
        if not self._ready():
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status_code, "headers": headers})
        await send({"type": "http.response.body", "body": out})

    async def _read(self, scope: Scope, receive: Receive) -> bytes:
        for key, value in scope["headers"]:
            if key == b"content-length" and value.isdigit() and int(value) > self._limit:
                raise BadRequest(f"request body larger than {self._limit} bytes", 413)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise BadRequest("client disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._limit:
                raise BadRequest(f"request body larger than {self._limit} bytes", 413)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_TEXT = b"text/plain; charset=utf-8"
_JSON = JSON.encode()

Verb = Callable[[bytes], Awaitable[bytes]]
Endpoint = Callable[[bytes], Awaitable[tuple[int, bytes, bytes]]]


class _LazyChildren:
    """A counter's children for the labels ``"0"``..``"10"``, resolved on first use."""

    def __init__(self, counter: Counter) -> None:
        self._counter = counter
        self._children: dict[int, Counter] = {}

    def __getitem__(self, value: int) -> Counter:
        child = self._children.get(value)
        if child is None:
            child = self._children[value] = self._counter.labels(str(value))
        return child


class Handlers:
    """The verbs: each takes the request body and returns the answer's bytes (or raises BadRequest).

    Args:
        deps: everything the handlers need.
    """

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.m = deps.metrics
        self.log = deps.log
        self._depth = deps.settings.max_json_depth
        self._too_deep = f"JSON nested deeper than {self._depth} levels"
        self._score_memo = memo.Memo(SCORE_MEMO_ENTRIES, SCORE_MEMO_BYTES, scheduling.Filtered.weigh)
        self._workload = _Shapes(deps.cache, deps.settings.workload_period_s)
        self._parsed = _Requests(deps.settings)
        self._seen = memo.Memo(SEEN_MEMO_ENTRIES, SEEN_MEMO_BYTES)  # pods counted in the learned workload
        self._reason_counts: dict[str, Counter] = {}  # metric children resolved once per label value
        self._score_counts = _LazyChildren(self.m.scores)
        self.on_filtered = self._filter_listeners()
        """The filter's verdict for each pod goes to these (``_filter_listeners``)."""

    def endpoint(self, verb: str, handle: Verb) -> Endpoint:
        """``handle`` with the depth check, 4xx answers for bad input, latency and status metrics."""
        latency = self.m.latency.labels(verb)
        counts: dict[int, Counter] = {}  # status code -> counter child, resolved once

        async def run(body: bytes) -> tuple[int, bytes, bytes]:
            start = time.perf_counter()
            try:
                if jsondepth.too_deep(body, self._depth):
                    raise BadRequest(self._too_deep)
                answer: tuple[int, bytes, bytes] = (200, _JSON, await handle(body))
            except (BadRequest, RecursionError) as caught:
                err = _bad(caught)
                self.log.v(2, "bad request", verb=verb, status=err.status_code, err=str(err))
                answer = (err.status_code, _TEXT, str(err).encode())
                # The exception's traceback holds this frame, whose ``err`` holds the exception: a
                # cycle that would keep the request's body (and every frame's locals) until the
                # garbage collector's next full pass, which an idle server may never run.
                del err
            except Exception as exc:  # noqa: BLE001 - a bug: answered 500, logged, and nothing kept
                frames = traceback.extract_tb(exc.__traceback__)
                stack = " <- ".join(
                    f"{f.name}@{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in reversed(frames)
                )
                self.log.error("internal error", verb=verb, err=repr(exc)[:500], stack=stack)
                answer = (500, _TEXT, f"internal error: {type(exc).__name__}".encode())
            latency.observe(time.perf_counter() - start)
            child = counts.get(answer[0])
            if child is None:
                child = counts[answer[0]] = self.m.requests.labels(verb, str(answer[0]))
            child.inc()
            return answer

        return run

    async def _wait_synced(self) -> bool:
        """Wait (at most ``sync_wait_s``) until the caches are synced; never decide from a partial one."""
        return await tasks.wait_until(self.deps.synced, self.deps.settings.sync_wait_s, time.monotonic)

    async def filter(self, data: bytes) -> bytes:
        """``/filter``: feasible nodes, and a reason code for every other one."""
        deps = self.deps
        args = _decode(wire.FILTER_DECODER, data)
        names = args.node_names or []
        if not deps.synced() and not await self._wait_synced():
            self.m.not_synced.labels("filter").inc()
            return wire.ENCODER.encode(wire.ExtenderFilterResult([], {}, {}, NOT_SYNCED))
        pod = self._parsed.parse(args.pod)
        meta = args.pod.metadata
        if isinstance(pod, status.Status):
            outcome = scheduling.reject_all(names, status.INVALID_REQUEST)
            deps.events.record(
                meta.namespace,
                meta.name,
                meta.uid,
                "Warning",
                "FilteringFailed",
                "Filter",
                f"invalid request: {pod.message}",
            )
            self._count(outcome)
            result = wire.ExtenderFilterResult(outcome.feasible, outcome.failed, outcome.unresolvable)
            return wire.ENCODER.encode(result)
        # Another scheduler's claim on the pod, judged now, before the snapshot (a claim that just
        # turned stale leaves the cache here): while that scheduler may still act on it, the pod
        # waits (kube.claims).
        claim = deps.flow.held_claim(_key(pod)) if pod.wants_gpu else None
        snap = self._snapshot(pod)
        if pod.wants_gpu and pod.uid not in self._seen:
            self._seen.put(pod.uid, True)
            self._workload.add(scheduling.shape(snap, pod, names))
            for problem in deps.profile.ignored(pod):  # HAMi ignores such overrides; say so once
                deps.events.record(
                    meta.namespace, meta.name, meta.uid, "Warning", "PolicyIgnored", "Filter", problem
                )
        if self._workload.flush():
            snap = self._snapshot(pod)  # the workload changed: score against the new one
        busy = self._busy(pod)
        verdict = gang_plans.NOT_GATED
        if claim is None and pod.gang is not None and deps.gangs is not None:
            verdict = deps.gangs.admit(pod, snap, names, deps.flow.clock(), deps.excluded)
        if claim is not None:  # the pod waits for the claim; preemption cannot help: unresolvable
            outcome = scheduling.reject_all(names, status.FOREIGN_CLAIM_HELD)
        elif verdict.gated:  # all or nothing: the gang's plan decides (framework.gangs)
            if verdict.node is None:
                outcome = scheduling.reject_all(names, verdict.reason)
            else:
                outcome = scheduling.planned(names, verdict.node, status.GANG_PLANNED_ELSEWHERE)
                if verdict.planned:
                    # Members refused before this plan wait in kube-scheduler's unschedulable
                    # queue for a cluster event; the requeue nudge gives them one, so they reach
                    # the barrier before it gives up.
                    deps.flow.capacity_freed(verdict.node)
        else:
            cyc = cycles.Cycle.of(deps.profile, snap, pod)
            outcome = scheduling.filter_nodes(cyc, names, self.log, deps.invalid_nodes, deps.excluded, busy)
        feasible_json = wire.ENCODER.encode(outcome.feasible)
        if pod.uid and outcome.scores is not None and outcome.feasible:
            filtered = scheduling.Filtered(
                meta.resource_version, snap.nodes, outcome.feasible, outcome.scores, feasible_json
            )
            self._score_memo.put(pod.uid, filtered)
        summary = "Filter: " + scheduling.summary(outcome)
        if claim is not None:
            summary += "; " + claims.waiting_note(_key(pod), claim, deps.flow.clock())
        if verdict.message:
            summary += "; " + verdict.message
        spec = args.pod.spec
        self.on_filtered.emit(
            FilterDone(pod, meta, spec.priority, spec.preemption_policy, snap, names, busy, outcome, summary)
        )
        if self.log.enabled(2):
            self.log.v(2, "filter", pod=args.pod.key, summary=scheduling.summary(outcome))
        # ExtenderFilterResult's bytes, reusing the names array encoded for the prioritize memo.
        return b"".join(
            (
                b'{"NodeNames":',
                feasible_json,
                b',"FailedNodes":',
                wire.ENCODER.encode(outcome.failed),
                b',"FailedAndUnresolvableNodes":',
                wire.ENCODER.encode(outcome.unresolvable),
                b',"Error":""}',
            )
        )

    def _filter_listeners(self) -> listeners.Listeners[[FilterDone]]:
        """Every consumer of a filter's verdict, in the order they run (the one place to add one)."""
        deps = self.deps
        out: listeners.Listeners[[FilterDone]] = listeners.Listeners()
        out.add(self._bind_flow_learns)
        if deps.shadow is not None:
            out.add(self._shadow_judges)
        out.add(self._pending_notes)
        out.add(self._failure_reported)
        if deps.preemption is not None:
            out.add(self._preemption_considers)
        out.add(lambda done: self._count(done.outcome))
        return out

    def _bind_flow_learns(self, done: FilterDone) -> None:
        """The bind flow's memos: the pod, the extender's choice (claimed until its bind), the verdict."""
        flow, pod, outcome = self.deps.flow, done.pod, done.outcome
        if outcome.candidates is not None:  # no prioritize follows a single feasible node
            flow.remember_scores(pod.uid, *outcome.candidates)
        flow.remember(pod)
        if (
            done.busy is not _NOTHING_BUSY
            and self.deps.profile.extender_decides
            and len(outcome.feasible) == 1
        ):
            flow.claim(_key(pod), outcome.feasible[0])  # taken until its bind arrives
            if outcome.lock_moved:
                self.m.lock_moves.labels("filter").inc()
        flow.mark_unschedulable(pod.uid, pod.wants_gpu and not outcome.feasible)
        if outcome.feasible:
            flow.remember_filter(pod.uid, done.summary)  # reported with the bind event: one write per pod

    def _shadow_judges(self, done: FilterDone) -> None:
        """Shadow mode judges the same pod on the same snapshot with its own policies."""
        shadow = self.deps.shadow
        if shadow is not None and done.pod.wants_gpu and done.outcome.feasible:
            shadow.seen(done.snap, done.pod, done.names, self.deps.excluded)

    def _pending_notes(self, done: FilterDone) -> None:
        """The pending registry keeps a GPU pod only while nothing fits it (``/explain``, the UI)."""
        if done.pod.wants_gpu:
            self.deps.pending.note(done.pod, bool(done.outcome.feasible), done.summary)

    def _failure_reported(self, done: FilterDone) -> None:
        """A pod no node fits gets a ``FilteringFailed`` event with the summary."""
        if not done.outcome.feasible:
            meta = done.meta
            self.deps.events.record(
                meta.namespace, meta.name, meta.uid, "Warning", "FilteringFailed", "Filter", done.summary
            )

    def _preemption_considers(self, done: FilterDone) -> None:
        """GPU-aware preemption may evict for a GPU pod no node fits (the leader, off this path)."""
        preemption = self.deps.preemption
        if preemption is not None and done.pod.wants_gpu and not done.outcome.feasible:
            preemption.consider(done.pod, done.priority, done.preemption_policy, done.outcome)

    def _busy(self, pod: requests.PodRequest) -> Collection[str]:
        """The nodes whose lock the pod would find busy, when the lock margin is on and can tell.

        ``_NOTHING_BUSY`` itself when it is off (margin 0, no lock view, a pod without GPUs).
        """
        locks = self.deps.locks
        if locks is None or not pod.wants_gpu or not self.deps.profile.lock_margin > 0:
            return _NOTHING_BUSY
        return locks(_key(pod))

    def _snapshot(self, pod: requests.PodRequest) -> view.Snapshot:
        """The snapshot the pod's filter judges: a preemptor sees its nominated cards free."""
        pre = self.deps.preemption
        return self.deps.cache.snapshot() if pre is None else pre.snapshot(pod)

    def _count(self, outcome: scheduling.FilterOutcome) -> None:
        for reason, n in outcome.reasons.items():  # a few reason codes, not one per node
            child = self._reason_counts.get(reason)
            if child is None:
                child = self._reason_counts[reason] = self.m.filter_nodes.labels(reason)
            child.inc(n)

    async def prioritize(self, data: bytes) -> bytes:
        """``/prioritize``: a 0..10 score per node (ranks, or scaled scores under ``blend``).

        After a filter of the same pod version, only the pod's key is decoded and the raw
        NodeNames are compared with the filter's answer; no Pod and no name string is built.
        """
        deps = self.deps
        key = _decode(wire.PRIORITIZE_KEY_DECODER, data)
        if not deps.synced() and not await self._wait_synced():
            # kube-scheduler ignores a failed prioritize (no score from us); the filter gate
            # already refused to place anything from a partial cache.
            self.m.not_synced.labels("prioritize").inc()
            raise BadRequest(NOT_SYNCED, 503)
        uid, version = key.pod.metadata.uid, key.pod.metadata.resource_version
        raw_names = bytes(key.node_names)
        filtered: scheduling.Filtered | None = self._score_memo.pop(uid, None) if uid else None
        pod = self._parsed.cached(uid, version) if filtered and filtered.resource_version == version else None
        if pod is not None and filtered is not None and raw_names == filtered.names_json:
            names: list[str] = filtered.names
        elif pod is not None:
            decoded: list[str] | None = _decode(wire.NAMES_DECODER, raw_names)
            names = decoded or []
        else:
            filtered = None
            args = _decode(wire.PRIORITIZE_DECODER, data)
            names = args.node_names or []
            pod = self._parsed.parse(args.pod)
        ranks = False
        if isinstance(pod, status.Status):
            scores = np.zeros(len(names), np.int64)
        else:
            ranks = deps.profile.ranks and pod.wants_gpu
            cyc = cycles.Cycle.of(deps.profile, deps.cache.snapshot(), pod)
            if filtered is None:
                scores = scheduling.score_nodes(cyc, names, self.log)
            else:
                scores = scheduling.rescore(cyc, names, self.log, filtered)
            deps.flow.remember_scores(pod.uid, names, scores)
            scores = cyc.stepped(scores)
            busy = self._busy(pod)
            if busy:
                keyed = scheduling.lock_aware(names, scores, busy, deps.profile)
                if keyed is not scores and next(batch.best_first(names, keyed)) != next(
                    batch.best_first(names, scores)
                ):
                    self.m.lock_moves.labels("prioritize").inc()
                scores = keyed
        if ranks:
            wire_scores = scheduling.rank_scores(names, scores, wire.MAX_EXTENDER_PRIORITY)
        else:
            wire_scores = wire.extender_scores(scores)
        for value, n in enumerate(
            np.bincount(wire_scores, minlength=wire.MAX_EXTENDER_PRIORITY + 1).tolist()
        ):
            if n:
                self._score_counts[value].inc(n)
        if filtered is not None and names is filtered.names and wire.plain_names(raw_names):
            return wire.encode_priorities_raw(raw_names, wire_scores)
        return wire.encode_priorities(names, wire_scores)

    async def bind(self, data: bytes) -> bytes:
        """``/bind``: see ``extender.bind``; the outcome's error text is the wire ``Error``."""
        args = _decode(wire.BIND_DECODER, data)
        if not args.pod_name or not args.node:
            raise BadRequest("invalid request: PodName and Node are required")
        self.deps.pending.drop(args.pod_uid)
        if self.deps.preemption is not None:  # a preemptor's nominated cards go to its bind
            self.deps.preemption.binding(f"{args.pod_namespace}/{args.pod_name}", args.pod_uid, args.node)
        outcome = await self.deps.flow.bind(args)
        return wire.ENCODER.encode(wire.ExtenderBindingResult(error=outcome.error))

    async def preempt(self, data: bytes) -> bytes:
        """``/preempt``: narrow kube-scheduler's candidates to nodes where eviction frees cards."""
        args = _decode(wire.PREEMPT_DECODER, data)
        pod = self._parsed.parse(args.pod)
        victims = args.node_name_to_meta_victims or {}
        if isinstance(pod, status.Status):
            kept = preempt.keep_nonempty(victims)
        else:
            snap, gangs = self.deps.cache.snapshot(), self.deps.gangs
            if gangs is None:
                kept = preempt.narrow(snap, pod, victims, self.deps.profile)
            else:
                kept = preempt.narrow(snap, pod, victims, self.deps.profile, gangs.directory.has_uid)
        return wire.ENCODER.encode(wire.ExtenderPreemptionResult(kept))

    async def healthz(self, request: Request) -> Response:
        """Liveness."""
        return PlainTextResponse("ok")

    async def readyz(self, request: Request) -> Response:
        """Readiness: synced; a ``lease`` follower is ready too when the leader's pod is labelled."""
        synced = self.deps.synced()
        self.m.cache_synced.set(1 if synced else 0)
        if not synced:
            return PlainTextResponse("cache not synced", status_code=503)
        if not self.deps.follower():
            return PlainTextResponse("ok")
        if self.deps.follower_ready:
            return PlainTextResponse("ok (follower)")
        return PlainTextResponse("not leader", status_code=503)

    async def metrics(self, request: Request) -> Response:
        """Prometheus metrics."""
        return Response(generate_latest(self.m.registry), media_type=CONTENT_TYPE_LATEST)

    async def explain(self, request: Request) -> Response:
        """``GET /explain?pod=NAMESPACE/NAME``: ``extender.explain``'s document for the pod (docs/explain.md).

        The pod's request comes from the pending registry, else from ``deps.read_pod``. A pod the
        cache holds (bound) is judged with its own charge released (``extender.holdings``). 400 for a
        malformed argument, 404 for an unknown pod, 422 for an invalid GPU request, 503 while the
        cache is not synced or the pod cannot be read.
        """
        deps = self.deps
        arg = request.query_params.get("pod", "")
        namespace, _, name = arg.partition("/")
        if not namespace or not name or "/" in name:
            return PlainTextResponse(f"expected ?pod=NAMESPACE/NAME, got {arg!r}", status_code=400)
        if not deps.synced():
            return PlainTextResponse(NOT_SYNCED, status_code=503)
        entry = deps.pending.get(arg)
        pod: parsing.Parsed | None = None if entry is None else entry.request
        if pod is None and deps.read_pod is not None:
            try:
                found = await deps.read_pod(namespace, name)
            except kerrors.ApiError as err:
                return PlainTextResponse(f"cannot read pod {arg}: {err}", status_code=503)
            if found is not None:
                pod = parsing.request_of(found, deps.settings.request_config)
        if pod is None:
            return PlainTextResponse(f"pod {arg} not found", status_code=404)
        if isinstance(pod, status.Status):
            return PlainTextResponse(f"pod {arg}: invalid GPU request: {pod.message}", status_code=422)
        held = holdings.held(deps.cache, arg, pod.uid)
        snap = deps.cache.snapshot()
        doc = explains.explain(snap, pod, deps.profile, deps.invalid_nodes, deps.excluded, held=held)
        if deps.gangs is not None and pod.gang is not None:
            note = "" if entry is None else entry.summary
            gang = explains.gang_part(pod, deps.gangs, deps.flow.clock(), note)
            doc = msgspec.structs.replace(doc, gang=gang)
        return Response(explains.encode(doc), media_type=JSON)


def _probe_routes(h: Handlers) -> list[Route]:
    """The GET routes: liveness, readiness and metrics."""
    return [
        Route("/healthz", h.healthz, methods=["GET"]),
        Route("/readyz", h.readyz, methods=["GET"]),
        Route("/metrics", h.metrics, methods=["GET"]),
    ]


def create_metrics_app(deps: Deps) -> Starlette:
    """The plain-HTTP metrics listener's app: ``/healthz``, ``/readyz``, ``/metrics`` and the view.

    The same handlers and answers as on the main app, over the same ``deps``; no lifespan (the
    main app's runs the services, once). The read-only cluster view (``/ui``, ``/ui/state``) is
    served here too: in the chart this is the port the Service exposes (docs/ui.md).
    """
    return Starlette(routes=_probe_routes(Handlers(deps)) + clusterview.routes(deps))


async def drain_binds(flow: binds.BindFlow, log: logs.Log) -> None:
    """At shutdown: ``flow.drain()`` (pending pod labels, ambiguous binds), for at most ``DRAIN_BINDS_S``.

    The listeners have closed and answered their last calls by then. What is still unfinished when
    the time is up is cancelled and logged: a pod left without its label keeps its devices (only
    HAMi's vGPU monitor misses it), and a lock left by an ambiguous bind is the next leader's
    orphan to release.
    """
    try:
        await asyncio.wait_for(flow.drain(), DRAIN_BINDS_S)
    except TimeoutError:
        log.warning("shutdown: binds left unfinished", after_s=f"{DRAIN_BINDS_S:g}")


def create_app(deps: Deps) -> _Fast:
    """Build the app around ``deps`` (see the module docstring)."""
    h = Handlers(deps)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        async with contextlib.AsyncExitStack() as stack:
            for service in deps.services:
                await stack.enter_async_context(service())
            yield State(deps=deps)
            await drain_binds(deps.flow, deps.log)  # the services (the API client) still run

    routes = _probe_routes(h) + clusterview.routes(deps)  # GET /ui, /ui/state: the cluster view
    routes += shadows.routes(deps.shadow)  # GET /shadow, /shadow/decisions (docs/shadow.md)
    routes.append(Route("/explain", h.explain, methods=["GET"]))  # docs/explain.md
    prioritize = h.endpoint("prioritize", h.prioritize)
    verbs = {
        "/filter": h.endpoint("filter", h.filter),
        "/prioritize": prioritize,
        "/score": prioritize,
        "/bind": h.endpoint("bind", h.bind),
        "/preempt": h.endpoint("preempt", h.preempt),
    }
    follower = deps.follower

    def serving_calls() -> bool:
        return deps.synced() and not follower()

    return _Fast(
        Starlette(routes=routes, lifespan=lifespan), verbs, deps.settings.body_limit_bytes, serving_calls
    )
