"""A request cancelled during its new connection's TLS handshake leaves no socket open.

httpcore2 closes the TCP stream when ``start_tls`` fails but drops it open when the handshake is
cancelled; ``KubeClient`` closes it (``client._HandshakeClosingStream``). Without that, the socket
stays registered with the running loop, and once the loop is closed garbage collection warns
``unclosed transport`` in whatever test is running then (an e2e test after a ``NodeSimThread`` was
stopped mid-handshake). The server here accepts TCP and never answers the ClientHello, so the
request is inside ``start_tls`` when it is cancelled; the server must then read EOF at once.
"""

from __future__ import annotations

import asyncio

import httpx2
import pytest
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User

from gpuslice.kube import client as kclient

pytestmark = pytest.mark.unit


async def test_a_request_cancelled_during_the_tls_handshake_closes_its_connection() -> None:
    hello = asyncio.Event()
    closed = asyncio.Event()

    async def silent_tls_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):  # the ClientHello, never answered; b"" once the client closed
            hello.set()
        closed.set()
        writer.close()

    server = await asyncio.start_server(silent_tls_server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cluster = Cluster(server=f"https://127.0.0.1:{port}", insecure=True)
    config = KubeConfig.from_one(cluster=cluster, user=User(token="t")).get()
    assert config is not None
    kube = kclient.KubeClient(config, timeout=30.0)
    try:
        request = asyncio.create_task(kube.request("GET", "/api/v1/nodes"))
        await asyncio.wait_for(hello.wait(), 10)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        await asyncio.wait_for(closed.wait(), 5)
    finally:
        await kube.aclose()
        server.close()
        await server.wait_closed()


async def test_the_kube_client_transport_wraps_the_pools_network_backend() -> None:
    """httpx2 takes no network backend: the wrapper is put on its pool's private attribute."""
    config = KubeConfig.from_one(
        cluster=Cluster(server="https://127.0.0.1:9", insecure=True), user=User(token="t")
    ).get()
    assert config is not None
    async with kclient.KubeClient(config) as kube:
        inner = kube._transport._inner
        assert isinstance(inner, httpx2.AsyncHTTPTransport)
        assert isinstance(inner._pool._network_backend, kclient._HandshakeClosingBackend)
