"""Helpers of the e2e tests that run the chart's rendered pods as local processes (``podrun``)."""

from __future__ import annotations

import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from gpuslice_dev import podrun


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports on 127.0.0.1 (every rendered pod shares this machine's network)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    """GET without proxies: the status and body, or 0 and the error when nothing answers."""
    handler: urllib.request.BaseHandler = (
        urllib.request.HTTPSHandler(context=context) if context else urllib.request.HTTPHandler()
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), handler)
    try:
        with opener.open(url, timeout=5) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except (urllib.error.URLError, OSError) as err:
        return 0, str(err)


def logs(pods: Sequence[podrun.RunningPod]) -> str:
    """The tail of every process log of the rendered pods."""
    parts = []
    for pod in pods:
        for name in pod.processes:
            parts.append(f"--- {pod.pod.name}/{name} ---\n" + pod.log_text(name)[-3000:])
    return "\n".join(parts)


def wait(pods: Sequence[podrun.RunningPod], what: Callable[[], Any], timeout: float, message: str) -> Any:
    """Poll ``what`` until truthy; fails at once when a pod's process exits, with the logs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        for pod in pods:
            for name, proc in pod.processes.items():
                assert proc.poll() is None, f"{pod.pod.name}/{name} exited {proc.returncode}\n{logs(pods)}"
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:.0f} s: {message}\n{logs(pods)}")
