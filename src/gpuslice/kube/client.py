"""One connection to the Kubernetes API: config, auth, TLS, timeouts and a QPS/burst limiter.

lightkube reads the kubeconfig (or the in-cluster service account) and supplies authentication and
the TLS context; every request then goes out through one shared, rate-limited httpx2 transport.
gpuslice talks raw JSON through ``KubeClient.request`` / ``KubeClient.stream`` (typed decoding is
done by the callers with msgspec Structs holding only the fields they read) because typed clients
mis-decode some answers (``pods/binding``) and cannot ask for watch bookmarks. A lightkube
``AsyncClient`` on the same transport is available as ``KubeClient.lightkube`` for typed calls.

Every failure leaves this module as a ``gpuslice.kube.errors.ApiError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from os import PathLike
from typing import Any, NamedTuple

import httpcore2
import httpx2
import lightkube
import msgspec
from lightkube.config import client_adapter
from lightkube.config.kubeconfig import KubeConfig, SingleConfig

from gpuslice.kube import errors

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

DEFAULT_QPS = 50.0
DEFAULT_BURST = 100
DEFAULT_TIMEOUT = 10.0
USER_AGENT = "gpuslice"

Params = Mapping[str, str | int | bool]
Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class TokenBucket:
    """QPS/burst limiter by reservation (as client-go's ``tokenBucketRateLimiter``).

    ``reserve(now)`` takes one token, possibly going into debt, and returns how long the caller
    must wait; concurrent callers therefore queue in arrival order without a lock.

    Args:
        qps: sustained requests per second (<= 0 disables limiting).
        burst: bucket size (requests allowed back to back after an idle period).
        clock: monotonic seconds.
        sleep: async sleep used by ``acquire``.
    """

    def __init__(self, qps: float, burst: int, clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep):
        self.qps = qps
        self.burst = max(1, burst)
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(self.burst)
        self._last: float | None = None

    def reserve(self, now: float) -> float:
        """Take a token at time ``now`` and return the seconds to wait before using it."""
        if self.qps <= 0:
            return 0.0
        if self._last is not None:
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    async def acquire(self) -> None:
        """Wait until the caller may send one request."""
        delay = self.reserve(self._clock())
        if delay > 0:
            await self._sleep(delay)


class _LimitedTransport(httpx2.AsyncBaseTransport):
    """Waits for the token bucket before every request, then delegates."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, bucket: TokenBucket):
        self._inner = inner
        self._bucket = bucket

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        await self._bucket.acquire()
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _HandshakeClosingStream(httpcore2.AsyncNetworkStream):
    """A new TCP connection that is closed when its TLS handshake does not complete.

    httpcore2 closes the TCP stream when ``start_tls`` raises an ``Exception``, but not when the
    handshake is cancelled (the task that opens a connection for its request is cancelled, e.g. a
    simulator or informer stopped at that moment): the stream is then dropped with its socket open.
    While the event loop runs, the selector keeps that socket (a leaked descriptor); once the loop
    is closed, garbage collection finds an ``unclosed transport`` and warns. Closing on any
    ``BaseException`` covers both (a second close after httpcore2's own is harmless).
    """

    def __init__(self, inner: httpcore2.AsyncNetworkStream):
        self._inner = inner

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore2.AsyncNetworkStream:
        try:
            return await self._inner.start_tls(ssl_context, server_hostname, timeout)
        except BaseException:
            await self._inner.aclose()  # anyio closes the transport before its first await
            raise

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _HandshakeClosingBackend(httpcore2.AsyncNetworkBackend):
    """httpcore2's network backend, with connections closed on a failed or cancelled handshake."""

    def __init__(self, inner: httpcore2.AsyncNetworkBackend):
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )
        return _HandshakeClosingStream(stream)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self._inner.connect_unix_socket(path, timeout=timeout, socket_options=socket_options)
        return _HandshakeClosingStream(stream)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _http_transport(verify: ssl.SSLContext | str | bool) -> httpx2.AsyncHTTPTransport:
    """httpx2's transport, its connection pool on ``_HandshakeClosingBackend``.

    httpx2 takes no network backend, so the pool's is wrapped in place (httpcore2 is pinned by
    httpx2; ``tests/unit/kube/test_client_handshake.py`` fails if these attributes move).
    """
    transport = httpx2.AsyncHTTPTransport(verify=verify, trust_env=False)
    pool = transport._pool
    pool._network_backend = _HandshakeClosingBackend(pool._network_backend)
    return transport


class Response(NamedTuple):
    """A read, successful answer."""

    status: int
    content: bytes


def encode(body: object) -> bytes:
    """JSON-encode a request body (bytes pass through)."""
    return body if isinstance(body, bytes) else msgspec.json.encode(body)


class KubeClient:
    """An authenticated, rate-limited connection to one apiserver.

    Args:
        config: one kubeconfig context (see ``from_kubeconfig`` / ``auto``).
        qps: sustained request rate (<= 0: unlimited).
        burst: requests allowed back to back.
        timeout: connect/read/write timeout for ordinary requests, seconds.
        transport: replaces the HTTP transport (tests); TLS settings of ``config`` are then unused.
        clock: monotonic clock for the limiter.
    """

    def __init__(
        self,
        config: SingleConfig,
        *,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx2.AsyncBaseTransport | None = None,
        clock: Clock = time.monotonic,
    ):
        self.config = config
        self.timeout = timeout
        self.bucket = TokenBucket(qps, burst, clock)
        if transport is None:
            assert config.user is not None, "kubeconfig context without a user"
            verify = client_adapter.verify_cluster(
                config.cluster, config.user, config.abs_file, trust_env=False
            )
            transport = _http_transport(verify)
        self._transport = _LimitedTransport(transport, self.bucket)
        params = client_adapter.ConnectionParams(
            timeout=httpx2.Timeout(timeout),
            trust_env=False,
            transport=self._transport,  # type: ignore[arg-type]  # lightkube annotates the sync base
        )
        self.http: httpx2.AsyncClient = client_adapter.AsyncClient(config, params)
        self.http.headers["User-Agent"] = USER_AGENT
        self._lightkube: lightkube.AsyncClient | None = None

    @classmethod
    def from_kubeconfig(
        cls,
        path: str | PathLike[str],
        context: str | None = None,
        *,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> KubeClient:
        """A client for a context (default: the current one) of a kubeconfig file."""
        config = KubeConfig.from_file(path).get(context_name=context)
        assert config is not None
        return cls(config, qps=qps, burst=burst, timeout=timeout)

    @classmethod
    def auto(
        cls,
        kubeconfig: str | PathLike[str] | None = None,
        *,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> KubeClient:
        """The given kubeconfig, else in-cluster config, else ``$KUBECONFIG`` / ``~/.kube/config``."""
        if kubeconfig is not None:
            return cls.from_kubeconfig(kubeconfig, qps=qps, burst=burst, timeout=timeout)
        config = KubeConfig.from_env().get()
        assert config is not None
        return cls(config, qps=qps, burst=burst, timeout=timeout)

    @property
    def lightkube(self) -> lightkube.AsyncClient:
        """A typed lightkube client sharing this client's transport and limiter."""
        if self._lightkube is None:
            self._lightkube = lightkube.AsyncClient(
                self.config,
                timeout=httpx2.Timeout(self.timeout),
                trust_env=False,
                transport=self._transport,
                field_manager=USER_AGENT,
            )
        return self._lightkube

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: object = None,
        content_type: str = JSON,
        timeout: float | None = None,
    ) -> Response:
        """Send one request and return the successful answer.

        Args:
            method: HTTP method.
            path: absolute API path, e.g. ``/api/v1/nodes/n1``.
            params: query parameters.
            body: JSON body (any msgspec-encodable value, or bytes), or None.
            content_type: body content type (``MERGE_PATCH`` for merge patches).
            timeout: overrides the client's timeout.

        Returns:
            The status code and body of a 2xx answer.

        Raises:
            errors.ApiError: a non-2xx answer (by status class) or no answer (``ApiUnavailable``).
        """
        what = f"{method} {path}"
        headers = {"Accept": JSON}
        content = None
        if body is not None:
            content = encode(body)
            headers["Content-Type"] = content_type
        try:
            resp = await self.http.request(
                method,
                path,
                params=dict(params) if params else None,
                content=content,
                headers=headers,
                timeout=httpx2.Timeout(timeout) if timeout is not None else httpx2.USE_CLIENT_DEFAULT,
            )
        except httpx2.HTTPError as exc:
            raise errors.wrap(exc, what) from exc
        if resp.status_code >= 400:
            raise errors.from_response(resp, what)
        return Response(resp.status_code, resp.content)

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, params: Params | None = None, read_timeout: float | None = None
    ) -> AsyncIterator[httpx2.Response]:
        """Open a streaming GET (a watch) and yield the response once its status is 2xx.

        Args:
            path: absolute API path.
            params: query parameters.
            read_timeout: seconds without a byte before the stream fails (None: no limit).

        Raises:
            errors.ApiError: a non-2xx answer or a transport failure while opening.
        """
        what = f"GET {path}"
        timeout = httpx2.Timeout(self.timeout, read=read_timeout)
        try:
            async with self.http.stream(
                "GET",
                path,
                params=dict(params) if params else None,
                headers={"Accept": JSON},
                timeout=timeout,
            ) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    raise errors.from_response(resp, what)
                yield resp
        except httpx2.HTTPError as exc:
            raise errors.wrap(exc, what) from exc

    async def aclose(self) -> None:
        """Close connections."""
        await self.http.aclose()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
