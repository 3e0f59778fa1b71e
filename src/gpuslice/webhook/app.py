"""The webhook's HTTP app: ``create_app(deps)`` (starlette), thin handlers, no globals.

Routes: ``POST /webhook`` (mutating), ``POST /validate`` (validating), ``GET /healthz``
(liveness), ``GET /readyz`` (200 once the node informer has listed), ``GET /metrics``.

A body that is not an AdmissionReview is answered HTTP 400 with a plain message, one larger than
``BODY_LIMIT`` HTTP 413; everything about the pod itself goes into the review's response
(``allowed: false`` with ``status.message``), never into a 5xx. The lifespan enters the
injected background services (the node informer) and stops them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from gpuslice.webhook import metrics, mutate, review, validate

BODY_LIMIT = 1 << 20
"""Largest accepted review body (1 MiB); the apiserver's own request limit is 3 MiB, but a pod
object is far below this."""
JSON = "application/json"
Service = Callable[[], contextlib.AbstractAsyncContextManager[object]]
"""A background service the lifespan runs (entered at startup, exited at shutdown)."""


class TooLarge(Exception):
    """A body over ``BODY_LIMIT``."""


@dataclasses.dataclass
class Deps:
    """Everything the app needs, built by ``serve`` (or by tests)."""

    mutate_options: mutate.Options
    validate_options: validate.Options
    metrics: metrics.Metrics
    log: logging.Logger
    verbosity: int = 0
    max_cards: Callable[[], int | None] = lambda: None
    """The most cards a registered node has; None = unknown (capacity check skipped)."""
    ready: Callable[[], bool] = lambda: True
    """``/readyz``: the node informer has listed."""
    services: Sequence[Service] = ()


async def read_body(request: Request, limit: int = BODY_LIMIT) -> bytes:
    """The request body, refusing more than ``limit`` bytes before reading it all.

    Raises:
        TooLarge: the declared or actual length exceeds ``limit``.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge
    size = 0
    chunks: list[bytes] = []
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _kv(**kv: object) -> str:
    """``k=v`` pairs for a log line; values with spaces, quotes or '=' are JSON-quoted."""
    out: list[str] = []
    for key, value in kv.items():
        text = str(value)
        if not text or any(ch in text for ch in ' "=\n'):
            text = json.dumps(text)
        out.append(f"{key}={text}")
    return " ".join(out)


def create_app(deps: Deps) -> Starlette:
    """The ASGI app."""

    async def handle(
        request: Request, operation: str, decide: Callable[[review.AdmissionRequest], review.Decision]
    ) -> Response:
        started = time.perf_counter()
        try:
            try:
                body = await read_body(request)
                parsed = review.parse(body)
            except TooLarge:
                deps.metrics.requests.labels(operation, "error").inc()
                return PlainTextResponse(f"request body larger than {BODY_LIMIT} bytes", 413)
            except review.BadReview as err:
                deps.metrics.requests.labels(operation, "error").inc()
                deps.log.warning("bad review %s", _kv(operation=operation, error=str(err)))
                return PlainTextResponse(str(err), 400)
            assert parsed.request is not None
            try:
                decision = decide(parsed.request)
            except RecursionError:
                decision = review.undecodable("cannot decode the pod: nested too deeply")
            except Exception:
                # A bug, not the pod's fault: a 500, which the apiserver handles by failurePolicy.
                deps.metrics.requests.labels(operation, "error").inc()
                deps.log.exception("review failed %s", _kv(operation=operation, uid=parsed.request.uid))
                raise
            req = parsed.request
            deps.metrics.requests.labels(operation, decision.result).inc()
            where = f"{req.namespace}/{req.name or '<generated>'}"
            if not decision.allowed:
                deps.log.info("refused %s", _kv(operation=operation, pod=where, message=decision.message))
            elif decision.patch and deps.verbosity >= 2:
                paths = ",".join(op.path for op in decision.patch)
                deps.log.info("patched %s", _kv(operation=operation, pod=where, paths=paths))
            elif deps.verbosity >= 4:
                deps.log.info("allowed %s", _kv(operation=operation, pod=where, why=decision.message))
            return Response(review.answer(parsed, decision), 200, media_type=JSON)
        finally:
            deps.metrics.duration.labels(operation).observe(time.perf_counter() - started)

    async def webhook(request: Request) -> Response:
        return await handle(request, "mutate", lambda r: mutate.admit(r, deps.mutate_options))

    async def validating(request: Request) -> Response:
        def decide(r: review.AdmissionRequest) -> review.Decision:
            return validate.admit(r, deps.validate_options, deps.max_cards())

        return await handle(request, "validate", decide)

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(_: Request) -> Response:
        if deps.ready():
            return PlainTextResponse("ok")
        return PlainTextResponse("node informer has not listed yet", 503)

    async def metrics_route(_: Request) -> Response:
        deps.metrics.max_cards.set(deps.max_cards() or 0)
        return Response(deps.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for service in deps.services:
                await stack.enter_async_context(service())
            yield

    return Starlette(
        routes=[
            Route("/webhook", webhook, methods=["POST"]),
            Route("/validate", validating, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics_route, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
