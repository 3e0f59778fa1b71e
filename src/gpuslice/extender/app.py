"""The extender's HTTP app: ``create_app(deps) -> Starlette``, thin handlers, no globals.

Each handler does decode -> ``cache.snapshot()`` -> policy -> encode. Filter and prioritize make no
API call. Malformed input (bad JSON, wrong types, oversized bodies) is a 4xx with a plain message;
scheduling failures go in the response body (``FailedNodes``, ``Error``), never as a 5xx. The
lifespan enters the injected background services (informers, event worker) and stops them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from typing import TypedDict, TypeVar

import msgspec
import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from gpuslice.codec import errors as codec_errors
from gpuslice.codec import resources
from gpuslice.extender import bind as binds
from gpuslice.extender import config, logs, memo, metrics, preempt, scheduling, view, wire
from gpuslice.model import requests, status
from gpuslice.policy import registry

JSON = "application/json"
T = TypeVar("T")
Service = Callable[[], contextlib.AbstractAsyncContextManager[object]]
"""A background service the lifespan runs (entered at startup, exited at shutdown)."""


class BadRequest(Exception):
    """Input we cannot act on; answered with ``status`` and the message as plain text."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclasses.dataclass
class Deps:
    """Everything the app needs, built by ``serve`` (or by tests, with fakes)."""

    settings: config.Settings
    cache: view.Cache
    flow: binds.BindFlow
    policies: scheduling.Policies
    log: logs.Log
    metrics: metrics.Metrics
    events: binds.Events
    ready: Callable[[], bool] = lambda: True
    services: Sequence[Service] = ()
    invalid_nodes: Collection[str] = frozenset()
    """Nodes whose GPU registration does not decode (live view kept by the feed)."""


class State(TypedDict):
    """The lifespan state handed to requests (``request.state.deps``)."""

    deps: Deps


async def _body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"request body larger than {limit} bytes", 413)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"request body larger than {limit} bytes", 413)
        chunks.append(chunk)
    return b"".join(chunks)


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

    Any change to a pod (annotations included) bumps its resourceVersion, so a hit is exact.
    """

    def __init__(self, config_: config.Settings) -> None:
        self._config = config_.request_config
        self._memo = memo.Memo(4096)

    def cached(self, uid: str, resource_version: str) -> requests.PodRequest | str | None:
        """The parse result of this exact pod version, or None when it was not parsed yet."""
        hit = self._memo.get(uid) if uid and resource_version else None
        if hit is not None and hit[0] == resource_version:
            parsed: requests.PodRequest | str = hit[1]
            return parsed
        return None

    def parse(self, pod: wire.Pod) -> requests.PodRequest | str:
        """The pod's GPU request, or the reason it is invalid."""
        meta = pod.metadata
        hit = self._memo.get(meta.uid) if meta.uid and meta.resource_version else None
        if hit is not None and hit[0] == meta.resource_version:
            parsed: requests.PodRequest | str = hit[1]
            return parsed
        try:
            parsed = resources.parse_pod(pod.to_dict(), self._config)
        except codec_errors.DecodeError as err:
            parsed = str(err)
        if meta.uid and meta.resource_version:
            self._memo.put(meta.uid, (meta.resource_version, parsed))
        return parsed


class _Shapes:
    """Requested shapes, handed to the cache's workload histogram at most once a second.

    Each hand-over bumps the cache generation (a snapshot rebuild); batching keeps that off the
    per-request path. The fragmentation-aware policies do not need per-request freshness.
    """

    def __init__(self, cache: view.Cache, period_s: float = 1.0) -> None:
        self._cache = cache
        self._period = period_s
        self._pending: list[registry.Shape] = []
        self._last = time.monotonic()

    def add(self, shape: registry.Shape) -> None:
        self._pending.append(shape)

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._pending and (force or now - self._last >= self._period):
            for shape in self._pending:
                view.observe(self._cache, shape)
            self._pending.clear()
            self._last = now


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


def create_app(deps: Deps) -> Starlette:
    """Build the app around ``deps`` (see the module docstring)."""
    limit = deps.settings.body_limit_bytes
    m = deps.metrics
    log = deps.log
    score_memo = memo.Memo(1024)  # uid -> scheduling.Filtered, for prioritize
    workload = _Shapes(deps.cache)
    parsed = _Requests(deps.settings)
    seen = memo.Memo(20_000)  # pods already counted in the workload histogram
    reason_counts: dict[str, Counter] = {}  # metric children resolved once per label value
    score_counts = _LazyChildren(m.scores)

    def endpoint(
        verb: str, handle: Callable[[bytes], Awaitable[bytes]]
    ) -> Callable[[Request], Awaitable[Response]]:
        latency = m.latency.labels(verb)
        counts: dict[int, Counter] = {}  # status code -> counter child, resolved once

        async def run(request: Request) -> Response:
            start = time.perf_counter()
            try:
                body = await handle(await _body(request, limit))
                response: Response = Response(body, media_type=JSON)
            except BadRequest as err:
                log.v(2, "bad request", verb=verb, status=err.status_code, err=str(err))
                response = PlainTextResponse(str(err), status_code=err.status_code)
            latency.observe(time.perf_counter() - start)
            code = response.status_code
            child = counts.get(code)
            if child is None:
                child = counts[code] = m.requests.labels(verb, str(code))
            child.inc()
            return response

        return run

    async def filter_(data: bytes) -> bytes:
        args = _decode(wire.FILTER_DECODER, data)
        names = args.node_names or []
        pod = parsed.parse(args.pod)
        meta = args.pod.metadata
        if isinstance(pod, str):
            outcome = scheduling.reject_all(names, status.INVALID_REQUEST)
            deps.events.record(
                meta.namespace,
                meta.name,
                meta.uid,
                "Warning",
                "FilteringFailed",
                "Filter",
                f"invalid request: {pod}",
            )
        else:
            workload.flush()
            snap = deps.cache.snapshot()
            if pod.wants_gpu and pod.uid not in seen:
                seen.put(pod.uid, True)
                workload.add(scheduling.shape(snap, pod, names))
            outcome = scheduling.filter_nodes(snap, pod, names, deps.policies, log, deps.invalid_nodes)
            deps.flow.remember(pod)
            if pod.uid and outcome.scores is not None and outcome.feasible:
                filtered = scheduling.Filtered(
                    meta.resource_version, snap.nodes, outcome.feasible, outcome.scores
                )
                score_memo.put(pod.uid, filtered)
            summary = "Filter: " + scheduling.summary(outcome)
            deps.flow.mark_unschedulable(pod.uid, pod.wants_gpu and not outcome.feasible)
            if outcome.feasible:
                # Reported with the bind event (one API write per scheduled pod, not two).
                deps.flow.remember_filter(pod.uid, summary)
            else:
                deps.events.record(
                    meta.namespace, meta.name, meta.uid, "Warning", "FilteringFailed", "Filter", summary
                )
        for reason, n in outcome.reasons.items():  # a few reason codes, not one per node
            reason_child = reason_counts.get(reason)
            if reason_child is None:
                reason_child = reason_counts[reason] = m.filter_nodes.labels(reason)
            reason_child.inc(n)
        if log.enabled(2):
            log.v(2, "filter", pod=args.pod.key, summary=scheduling.summary(outcome))
        result = wire.ExtenderFilterResult(outcome.feasible, outcome.failed, outcome.unresolvable)
        return wire.ENCODER.encode(result)

    async def prioritize(data: bytes) -> bytes:
        # After a filter of the same pod version, only its key and the names are decoded.
        key = _decode(wire.PRIORITIZE_KEY_DECODER, data)
        names = key.node_names or []
        uid, version = key.pod.metadata.uid, key.pod.metadata.resource_version
        filtered: scheduling.Filtered | None = score_memo.get(uid) if uid else None
        pod = parsed.cached(uid, version) if filtered and filtered.resource_version == version else None
        if pod is None:
            filtered = None
            pod = parsed.parse(_decode(wire.PRIORITIZE_DECODER, data).pod)
        if isinstance(pod, str):
            scores = np.zeros(len(names), np.int64)
        else:
            snap = deps.cache.snapshot()
            if filtered is None:
                scores = scheduling.score_nodes(snap, pod, names, deps.policies, log)
            else:
                scores = scheduling.rescore(snap, pod, names, deps.policies, log, filtered)
            deps.flow.remember_scores(pod.uid, names, scores)
            scores = scheduling.candidate_step(deps.policies.node(pod), scores, scheduling.context(snap))
        wire_scores = wire.extender_scores(scores)
        for value, n in enumerate(
            np.bincount(wire_scores, minlength=wire.MAX_EXTENDER_PRIORITY + 1).tolist()
        ):
            if n:
                score_counts[value].inc(n)
        return wire.encode_priorities(names, wire_scores)

    async def bind(data: bytes) -> bytes:
        args = _decode(wire.BIND_DECODER, data)
        if not args.pod_name or not args.node:
            raise BadRequest("invalid request: PodName and Node are required")
        error = await deps.flow.bind(args)
        return wire.ENCODER.encode(wire.ExtenderBindingResult(error=error))

    async def preempt_(data: bytes) -> bytes:
        args = _decode(wire.PREEMPT_DECODER, data)
        pod = parsed.parse(args.pod)
        victims = args.node_name_to_meta_victims or {}
        if isinstance(pod, str):
            kept = preempt.keep_nonempty(victims)
        else:
            kept = preempt.narrow(deps.cache.snapshot(), pod, victims, deps.policies)
        return wire.ENCODER.encode(wire.ExtenderPreemptionResult(kept))

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        ok = deps.ready()
        m.cache_synced.set(1 if ok else 0)
        return PlainTextResponse("ok" if ok else "cache not synced", status_code=200 if ok else 503)

    async def metrics_(request: Request) -> Response:
        return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        async with contextlib.AsyncExitStack() as stack:
            for service in deps.services:
                await stack.enter_async_context(service())
            yield State(deps=deps)

    routes = [
        Route("/filter", endpoint("filter", filter_), methods=["POST"]),
        Route("/prioritize", endpoint("prioritize", prioritize), methods=["POST"]),
        Route("/score", endpoint("prioritize", prioritize), methods=["POST"]),
        Route("/bind", endpoint("bind", bind), methods=["POST"]),
        Route("/preempt", endpoint("preempt", preempt_), methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
