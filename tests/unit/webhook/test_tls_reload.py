"""``gpuslice webhook`` reloads its serving certificate when the files change.

A real uvicorn server built as ``webhook.serve.main`` builds it, serving from a directory laid
out as kubelet mounts a Secret (``pki.publish``). After a swap, new handshakes must present the
new certificate and ``/metrics`` the new notAfter; a key that does not match keeps the old one.
The reloader polls every 0.1 s here (5 s in ``gpuslice webhook``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvicorn

from gpuslice.webhook import app as apps
from gpuslice.webhook import config, metrics, mutate, serve, validate
from tests import pki

pytestmark = pytest.mark.unit

EXPIRY = "gpuslice_tls_certificate_expiry_timestamp_seconds"
RELOADS = "gpuslice_tls_certificate_reloads_total"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> pki.Pki:
    return pki.make(tmp_path_factory.mktemp("pki"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def _serving(settings: config.Settings) -> Iterator[apps.Deps]:
    """The webhook's server, wired as ``serve.main`` does, in a thread until the block ends."""
    deps = apps.Deps(
        mutate_options=mutate.Options(),
        validate_options=validate.Options(),
        metrics=metrics.Metrics(),
        log=logging.getLogger("test.webhook"),
    )
    server_config = serve.listener_config(settings, deps)
    server_config.load()
    reloader = serve.certificate_reloader(settings, server_config, deps.metrics, period_s=0.1)
    assert reloader is not None
    deps.services = [*deps.services, reloader.running]
    server = uvicorn.Server(server_config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign, assignment]
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the webhook did not start"
            time.sleep(0.02)
        yield deps
    finally:
        server.should_exit = True
        thread.join(10)


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_the_webhook_serves_a_renewed_certificate(certs: pki.Pki, tmp_path: Path) -> None:
    renewed = pki.server(certs, "webhook-renewed", days=45)
    mount = tmp_path / "tls"
    pki.publish(mount, {"tls.crt": certs.server_cert.read_bytes(), "tls.key": certs.server_key.read_bytes()})
    port = _free_port()
    settings = config.validate(
        {"listen": f"127.0.0.1:{port}", "tls_cert": str(mount / "tls.crt"), "tls_key": str(mount / "tls.key")}
    )

    def presented() -> bytes:
        return pki.peer_certificate(port, certs.ca, None)

    def expiry() -> float | None:
        context = ssl.create_default_context(cafile=str(certs.ca))
        url = f"https://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, context=context, timeout=5) as resp:  # noqa: S310 - loopback
            text = resp.read().decode()
        prefix = f'{EXPIRY}{{certificate="serving"}} '
        return next(
            (float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)), None
        )

    with _serving(settings) as deps:

        def failures() -> float | None:
            return deps.metrics.registry.get_sample_value(RELOADS, {"result": "failure"})

        assert presented() == pki.der(certs.server_cert)
        assert expiry() == pki.not_after(certs.server_cert)
        # A key of another certificate: refused, the first certificate keeps serving.
        pki.publish(mount, {"tls.crt": renewed[0].read_bytes(), "tls.key": certs.server_key.read_bytes()})
        _until(lambda: failures() == 1.0, "the mismatched pair was not refused")
        assert presented() == pki.der(certs.server_cert)
        assert expiry() == pki.not_after(certs.server_cert)
        pki.publish(mount, {"tls.crt": renewed[0].read_bytes(), "tls.key": renewed[1].read_bytes()})
        _until(lambda: presented() == pki.der(renewed[0]), "the renewed certificate never served")
        assert expiry() == pki.not_after(renewed[0]) != pki.not_after(certs.server_cert)
        assert deps.metrics.registry.get_sample_value(RELOADS, {"result": "success"}) == 1.0
