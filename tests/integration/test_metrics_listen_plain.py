"""``gpuslice serve --metrics-listen`` without TLS: metrics and probes on their own port.

The deployment the chart renders (``--metrics-listen=0.0.0.0:<metricsPort>`` beside the extender
port) in its plain-HTTP form, as a real process against a real kube-apiserver: the metrics port
serves ``/metrics``, ``/healthz`` and ``/readyz`` and none of the extender verbs; the main port
keeps the verbs. The process is stopped by its own pid with SIGTERM and exits 0.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpuslice_dev.controlplane import ControlPlane

pytestmark = pytest.mark.integration

START_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get(url: str, data: bytes | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, data=data, timeout=5) as resp:  # noqa: S310 - loopback
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_plain_metrics_listener(control_plane: ControlPlane, tmp_path: Path) -> None:
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
        "--leader-elect",
        "none",
        "--events",
        "false",
    ]
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_S
        ready = (0, "")
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                ready = _get(f"http://127.0.0.1:{side}/readyz")
            except OSError:
                ready = (0, "")
            if ready == (200, "ok"):
                break
            time.sleep(0.1)
        assert ready == (200, "ok"), (tmp_path / "serve.log").read_text()
        status, text = _get(f"http://127.0.0.1:{side}/metrics")
        assert status == 200 and "gpuslice_cache_synced 1.0" in text
        assert _get(f"http://127.0.0.1:{side}/healthz") == (200, "ok")
        assert _get(f"http://127.0.0.1:{side}/filter", data=b"{}")[0] == 404  # the verbs are not there
        assert _get(f"http://127.0.0.1:{main}/healthz") == (200, "ok")
        assert _get(f"http://127.0.0.1:{main}/filter", data=b"{}")[0] == 400  # ... but on the main port
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=30)
        log.close()
    assert code == 0
