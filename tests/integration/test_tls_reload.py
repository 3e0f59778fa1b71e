"""``gpuslice serve`` and ``gpuslice webhook`` as processes pick up a renewed certificate.

Each command runs against a real kube-apiserver with its certificate in a directory laid out as
kubelet mounts a Secret (``pki.publish``). The files are swapped for a certificate with another
serial and notAfter; within a few of the 5 s polls, new handshakes present it and the expiry gauge
on ``/metrics`` follows. Each process is stopped by its own pid with SIGTERM.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuslice_dev.controlplane import ControlPlane
from tests import pki

pytestmark = pytest.mark.integration

START_S = 60.0
RELOAD_S = 20.0
"""Four polls of 5 s."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _metrics(url: str, context: ssl.SSLContext | None = None) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as resp:  # noqa: S310 - loopback
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError):
        return ""


def _expiry(text: str) -> float | None:
    found = re.search(
        r'^gpuslice_tls_certificate_expiry_timestamp_seconds\{certificate="serving"\} (\S+)$', text, re.M
    )
    return float(found.group(1)) if found else None


def _presented(port: int, ca: Path, client: tuple[Path, Path] | None) -> bytes:
    try:
        return pki.peer_certificate(port, ca, client)
    except OSError:
        return b""


def _wait(condition: Callable[[], bool], timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} after {timeout_s} s\n{log.read_text()[-4000:]}")
        time.sleep(0.2)


def _run(argv: list[str], log: Path, scenario: Callable[[], None], exits: tuple[int, ...] = (0,)) -> None:
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)  # noqa: S603 - our CLI
        try:
            scenario()
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            code = proc.wait(timeout=30)
    assert code in exits, log.read_text()[-4000:]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> pki.Pki:
    return pki.make(tmp_path_factory.mktemp("pki"))


def _mount(certs: pki.Pki, directory: Path, ca: bool = False) -> None:
    files = {"tls.crt": certs.server_cert.read_bytes(), "tls.key": certs.server_key.read_bytes()}
    if ca:
        files["ca.crt"] = certs.ca.read_bytes()
    pki.publish(directory, files)


def test_serve_reloads_its_certificate(control_plane: ControlPlane, certs: pki.Pki, tmp_path: Path) -> None:
    renewed = pki.server(certs, "serve-renewed", days=50)
    mount = tmp_path / "tls"
    _mount(certs, mount, ca=True)
    main, side = _free_port(), _free_port()
    argv = [
        sys.executable,
        "-m",
        "gpuslice",
        "serve",
        "--kubeconfig",
        str(control_plane.kubeconfig),
        "--listen",
        f"127.0.0.1:{main}",
        "--metrics-listen",
        f"127.0.0.1:{side}",
        "--tls-cert",
        str(mount / "tls.crt"),
        "--tls-key",
        str(mount / "tls.key"),
        "--tls-client-ca",
        str(mount / "ca.crt"),
        "--leader-elect",
        "none",
        "--events",
        "false",
    ]
    log = tmp_path / "serve.log"
    client = (certs.client_cert, certs.client_key)
    metrics_url = f"http://127.0.0.1:{side}/metrics"

    def scenario() -> None:
        _wait(lambda: _presented(main, certs.ca, client) != b"", START_S, "serve never listened", log)
        assert _presented(main, certs.ca, client) == pki.der(certs.server_cert)
        _wait(lambda: _expiry(_metrics(metrics_url)) is not None, 10, "no expiry gauge", log)
        assert _expiry(_metrics(metrics_url)) == pki.not_after(certs.server_cert)
        files = {"tls.crt": renewed[0].read_bytes(), "tls.key": renewed[1].read_bytes()}
        pki.publish(mount, {**files, "ca.crt": certs.ca.read_bytes()})
        _wait(
            lambda: _presented(main, certs.ca, client) == pki.der(renewed[0]),
            RELOAD_S,
            "the renewed certificate never served",
            log,
        )
        assert _expiry(_metrics(metrics_url)) == pki.not_after(renewed[0])
        assert 'gpuslice_tls_certificate_reloads_total{result="success"} 1.0' in _metrics(metrics_url)

    _run(argv, log, scenario)
    assert "tls: reloaded serving certificate serial=" in log.read_text()


def test_webhook_reloads_its_certificate(control_plane: ControlPlane, certs: pki.Pki, tmp_path: Path) -> None:
    renewed = pki.server(certs, "webhook-renewed-process", days=60)
    mount = tmp_path / "tls"
    _mount(certs, mount)
    port = _free_port()
    argv = [
        sys.executable,
        "-m",
        "gpuslice",
        "webhook",
        "--kubeconfig",
        str(control_plane.kubeconfig),
        "--listen",
        f"127.0.0.1:{port}",
        "--tls-cert",
        str(mount / "tls.crt"),
        "--tls-key",
        str(mount / "tls.key"),
    ]
    log = tmp_path / "webhook.log"
    context = ssl.create_default_context(cafile=str(certs.ca))
    metrics_url = f"https://127.0.0.1:{port}/metrics"

    def scenario() -> None:
        _wait(lambda: _presented(port, certs.ca, None) != b"", START_S, "the webhook never listened", log)
        assert _presented(port, certs.ca, None) == pki.der(certs.server_cert)
        assert _expiry(_metrics(metrics_url, context)) == pki.not_after(certs.server_cert)
        pki.publish(mount, {"tls.crt": renewed[0].read_bytes(), "tls.key": renewed[1].read_bytes()})
        _wait(
            lambda: _presented(port, certs.ca, None) == pki.der(renewed[0]),
            RELOAD_S,
            "the renewed certificate never served",
            log,
        )
        assert _expiry(_metrics(metrics_url, context)) == pki.not_after(renewed[0])

    # uvicorn's own signal handling raises SIGTERM again after its graceful shutdown.
    _run(argv, log, scenario, exits=(0, -signal.SIGTERM))
