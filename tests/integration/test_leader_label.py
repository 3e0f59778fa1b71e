"""``gpuslice serve --leader-elect lease`` with pods: the leader's pod carries ``gpuslice.io/leader``.

Two real ``gpuslice serve`` processes against a real kube-apiserver campaign for one Lease (short
timings: 2 / 1.5 / 0.2 s), each told its own Pod object (one by flags, one by the downward-API
variables ``POD_NAME`` / ``POD_NAMESPACE`` the chart sets). Both are ready; only the leader's pod
carries the label. The label moves when the leader loses its Lease (frozen with SIGSTOP until the
Lease expires, then resumed: it steps down and removes its label) and when it shuts down (SIGTERM:
the label is removed, the Lease given up, the other replica labels its own pod). Each process is
stopped by its own pid.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from gpuslice.extender.binding import leaderlabel
from gpuslice_dev.controlplane import ControlPlane
from tests.integration import kubehelpers

pytestmark = pytest.mark.integration

START_S = 60.0
LABEL = leaderlabel.LEADER_LABEL


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return 0, ""


class Replica:
    """One ``gpuslice serve`` process and its log."""

    def __init__(self, cp: ControlPlane, namespace: str, identity: str, pod: str, log_dir: Path) -> None:
        self.identity = identity
        self.pod = pod
        self.port = _free_port()
        self.log_path = log_dir / f"{identity}.log"
        argv = [
            sys.executable,
            "-m",
            "gpuslice",
            "serve",
            "--kubeconfig",
            str(cp.kubeconfig),
            "--listen",
            f"127.0.0.1:{self.port}",
            "--leader-elect",
            "lease",
            "--lease-namespace",
            namespace,
            "--lease-name",
            "gpuslice-label",
            "--leader-identity",
            identity,
            "--lease-duration-s",
            "2",
            "--renew-deadline-s",
            "1.5",
            "--retry-period-s",
            "0.2",
            "--events",
            "false",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSLICE_", "POD_"))}
        if identity == "a":  # the chart's way: the downward API's variables
            env |= {"POD_NAME": pod, "POD_NAMESPACE": namespace}
        else:
            argv += ["--pod-name", pod, "--pod-namespace", namespace]
        self._log: IO[str] = self.log_path.open("w")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def readyz(self) -> tuple[int, str]:
        return _get(f"http://127.0.0.1:{self.port}/readyz")

    def stop(self) -> int:
        """SIGTERM (SIGCONT first, in case it is frozen) and wait; the exit status."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text()


def _labels(cp: ControlPlane, namespace: str, pod: str) -> dict[str, str]:
    status, body = cp.api_request("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}")
    assert status == 200, body
    labels: dict[str, str] = body["metadata"].get("labels") or {}
    return labels


def _wait(condition: Callable[[], bool], timeout_s: float, what: str, *replicas: Replica) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {r.identity}\n{r.log()[-3000:]}" for r in replicas)
            pytest.fail(f"{what} (after {timeout_s} s)\n{logs}")
        time.sleep(0.1)


@pytest.fixture
def replicas(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for replica in started:
        replica.stop()


def test_the_label_follows_the_lease(
    control_plane: ControlPlane, namespace: str, tmp_path: Path, replicas: list[Replica]
) -> None:
    cp = control_plane
    for pod in ("gs-a", "gs-b"):
        kubehelpers.create_pod(cp, namespace, pod)
    # gs-b carries the label from an earlier container that led: its new one must remove it.
    status, body = cp.api_request(
        "PATCH", f"/api/v1/namespaces/{namespace}/pods/gs-b", {"metadata": {"labels": {LABEL: "true"}}}
    )
    assert status == 200, body

    def labelled(pod: str) -> bool:
        return _labels(cp, namespace, pod).get(LABEL) == "true"

    a = Replica(cp, namespace, "a", "gs-a", tmp_path)
    replicas.append(a)
    _wait(lambda: a.readyz() == (200, "ok"), START_S, "a never led", a)
    _wait(lambda: labelled("gs-a"), 10, "the leader's pod was not labelled", a)

    b = Replica(cp, namespace, "b", "gs-b", tmp_path)
    replicas.append(b)
    _wait(lambda: b.readyz() == (200, "ok (follower)"), START_S, "the follower never got ready", a, b)
    _wait(lambda: not labelled("gs-b"), 10, "the follower kept the stale label", a, b)
    time.sleep(1.0)  # a few renewals: nothing moves
    assert a.readyz() == (200, "ok") and b.readyz() == (200, "ok (follower)")
    assert labelled("gs-a") and not labelled("gs-b")

    # a loses its Lease: frozen past the lease duration, b takes over and labels its pod.
    os.kill(a.proc.pid, signal.SIGSTOP)
    _wait(lambda: b.readyz() == (200, "ok"), 15, "b did not take the expired Lease", a, b)
    _wait(lambda: labelled("gs-b"), 10, "the new leader's pod was not labelled", a, b)
    assert labelled("gs-a")  # the frozen replica could not remove its label yet
    os.kill(a.proc.pid, signal.SIGCONT)  # it wakes past its renew deadline: steps down
    _wait(lambda: not labelled("gs-a"), 10, "the deposed leader kept its label", a, b)
    assert a.readyz() == (200, "ok (follower)") and b.readyz() == (200, "ok")
    assert "leader label: removed gpuslice.io/leader on pod" in a.log()

    # b shuts down: its label goes, it gives the Lease up, a labels its pod again.
    assert b.stop() == 0
    assert not labelled("gs-b")
    _wait(lambda: a.readyz() == (200, "ok"), 10, "a did not take the released Lease", a, b)
    _wait(lambda: labelled("gs-a"), 10, "the label did not move back to gs-a", a, b)
