"""``gpuslice serve`` reloads its certificate, key and client CA when the files change.

A real uvicorn server (mTLS on the main listener, the plain metrics listener beside it) serves
from a directory laid out as kubelet mounts a Secret (``pki.publish``: ``..data`` swapped
atomically). New handshakes must present the new certificate after a swap, the expiry gauge must
follow, invalid files must leave the old certificate serving, and a CA added to the bundle must
be trusted. The reloader polls every 0.1 s here (5 s in ``gpuslice serve``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from gpuslice.extender import config, serve
from gpuslice.extender.http import app as apps
from tests import pki
from tests.unit.builders import node
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit

PERIOD_S = 0.1
EXPIRY = "gpuslice_tls_certificate_expiry_timestamp_seconds"
RELOADS = "gpuslice_tls_certificate_reloads_total"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> pki.Pki:
    return pki.make(tmp_path_factory.mktemp("pki"))


def _sample(port: int, name: str, labels: str) -> float | None:
    """One sample of ``/metrics`` on the plain listener, e.g. ``_sample(p, RELOADS, 'result="success"')``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:  # noqa: S310
        text = resp.read().decode()
    prefix = f"{name}{{{labels}}} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return None


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise AssertionError(what)
        await asyncio.sleep(0.05)


def _serve(settings: config.Settings, scenario: Callable[[], Awaitable[None]]) -> int:
    """Run the listeners with the certificate reloader as ``serve.main`` wires it; SIGTERM after."""
    deps = fakes.make_deps(fakes.cluster_cache(node("n").gpus(1)))
    main = serve.QuietServer(
        serve.listener_config(settings, apps.create_app(deps), settings.host, settings.port, main=True)
    )
    side_config = serve.listener_config(
        settings, apps.create_metrics_app(deps), settings.metrics_host, settings.metrics_port, main=False
    )
    side = serve.QuietServer(side_config)
    main.config.load()
    reloader = serve.certificate_reloader(settings, main.config, deps.metrics, period_s=PERIOD_S)
    assert reloader is not None
    deps.services = [*deps.services, reloader.running]

    async def run() -> int:
        task = asyncio.create_task(serve.serve_all(main, side))
        while not (main.started and side.started) and not task.done():
            await asyncio.sleep(0.02)
        failed: AssertionError | OSError | None = None
        if not task.done():
            try:
                await scenario()
            except (AssertionError, OSError) as err:  # stop the servers first, then fail
                failed = err
            os.kill(os.getpid(), signal.SIGTERM)
        code = await task
        if failed is not None:
            raise failed
        return code

    with asyncio.Runner(loop_factory=main.config.get_loop_factory()) as runner:
        return runner.run(run())


def test_a_swapped_certificate_reaches_new_handshakes(certs: pki.Pki, tmp_path: Path) -> None:
    new_cert, new_key = pki.server(certs, "renewed", days=40)  # another serial, a later notAfter
    last_cert, last_key = pki.server(certs, "last", days=90)
    mount = tmp_path / "tls"
    pki.publish(
        mount,
        {
            "tls.crt": certs.server_cert.read_bytes(),
            "tls.key": certs.server_key.read_bytes(),
            "ca.crt": certs.ca.read_bytes(),
        },
    )
    ports = _free_port(), _free_port()
    settings = config.validate(
        {
            "listen": f"127.0.0.1:{ports[0]}",
            "metrics_listen": f"127.0.0.1:{ports[1]}",
            "tls_cert": str(mount / "tls.crt"),
            "tls_key": str(mount / "tls.key"),
            "tls_client_ca": str(mount / "ca.crt"),
        }
    )
    client = (certs.client_cert, certs.client_key)
    stranger = (certs.stranger_cert, certs.stranger_key)
    seen: dict[str, object] = {}

    def presented() -> bytes:
        return pki.peer_certificate(ports[0], certs.ca, client)

    def files(cert: Path, key: Path, ca: bytes | None = None) -> dict[str, bytes]:
        return {
            "tls.crt": cert.read_bytes(),
            "tls.key": key.read_bytes(),
            "ca.crt": ca or certs.ca.read_bytes(),
        }

    async def scenario() -> None:
        assert await asyncio.to_thread(presented) == pki.der(certs.server_cert)
        seen["expiry before"] = await asyncio.to_thread(_sample, ports[1], EXPIRY, 'certificate="serving"')
        seen["ca expiry"] = await asyncio.to_thread(_sample, ports[1], EXPIRY, 'certificate="client_ca"')

        pki.publish(mount, files(new_cert, new_key))
        await _until(lambda: presented() == pki.der(new_cert), "the renewed certificate never served")
        seen["expiry after"] = await asyncio.to_thread(_sample, ports[1], EXPIRY, 'certificate="serving"')
        seen["successes"] = await asyncio.to_thread(_sample, ports[1], RELOADS, 'result="success"')

        # Half written (the PEM cut off), then a key of another certificate: both refused.
        half = new_cert.read_bytes()[:300]
        pki.publish(
            mount, {"tls.crt": half, "tls.key": new_key.read_bytes(), "ca.crt": certs.ca.read_bytes()}
        )
        await _until(
            lambda: _sample(ports[1], RELOADS, 'result="failure"') == 1.0, "the cut-off file was not refused"
        )
        pki.publish(mount, files(last_cert, new_key))
        await _until(
            lambda: _sample(ports[1], RELOADS, 'result="failure"') == 2.0, "the wrong key was not refused"
        )
        await asyncio.sleep(5 * PERIOD_S)  # refused files are not retried while they stay the same
        seen["failures"] = await asyncio.to_thread(_sample, ports[1], RELOADS, 'result="failure"')
        seen["after invalid"] = await asyncio.to_thread(presented)
        seen["expiry after invalid"] = await asyncio.to_thread(
            _sample, ports[1], EXPIRY, 'certificate="serving"'
        )

        # The right pair again: served. A second CA in the bundle: its clients are let in.
        seen["stranger before"] = await asyncio.to_thread(pki.tls_get, ports[0], certs.ca, stranger)
        bundle = certs.ca.read_bytes() + (certs.ca.parent / "other-ca.crt").read_bytes()
        pki.publish(mount, files(last_cert, last_key, bundle))
        await _until(
            lambda: presented() == pki.der(last_cert), "the valid pair after the refusals never served"
        )
        seen["stranger after"] = await asyncio.to_thread(pki.tls_get, ports[0], certs.ca, stranger)
        seen["expiry last"] = await asyncio.to_thread(_sample, ports[1], EXPIRY, 'certificate="serving"')

    assert _serve(settings, scenario) == 0
    assert seen["expiry before"] == pki.not_after(certs.server_cert)
    assert seen["ca expiry"] == pki.not_after(certs.ca)
    assert seen["expiry after"] == pki.not_after(new_cert) != seen["expiry before"]
    assert seen["successes"] == 1.0
    assert seen["failures"] == 2.0
    assert seen["after invalid"] == pki.der(new_cert)  # the old certificate kept serving
    assert seen["expiry after invalid"] == pki.not_after(new_cert)
    assert seen["stranger before"] == b""  # TLS 1.3: closed without an answer
    stranger_after = seen["stranger after"]
    assert isinstance(stranger_after, bytes) and stranger_after.startswith(b"HTTP/1.1 200 ")
    assert seen["expiry last"] == pki.not_after(last_cert)


def test_the_reloader_is_off_without_tls() -> None:
    port = _free_port()
    settings = config.validate({"listen": f"127.0.0.1:{port}"})
    deps = fakes.make_deps(fakes.cluster_cache())
    main_config = serve.listener_config(
        settings, apps.create_app(deps), settings.host, settings.port, main=True
    )
    main_config.load()
    assert serve.certificate_reloader(settings, main_config, deps.metrics) is None
    assert b"gpuslice_tls_certificate_expiry_timestamp_seconds{" not in generate_latest(deps.metrics.registry)
