"""The chaos tier's fault tooling, checked on its own.

Aspects: ``ControlPlane`` freezes, thaws and restarts kube-apiserver (same etcd, URL, tokens);
``ServiceProxy`` forwards new connections only to ready backends; ``nodesim`` writes HAMi's
``Reported`` handshake, and ``stop_node`` / ``mute_node`` / ``start_node`` switch a node's device
plugin off and on; the Allocate stand-in survives a pod whose annotations were cleared under it;
``devcluster.Extender`` passes extra environment variables, is SIGKILLed and restarted on its port.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import re
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from gpuslice.codec import keys, pod_devices
from gpuslice.kube import binding, locks, pods
from gpuslice.kube import client as kclient
from gpuslice.model import allocations
from gpuslice_dev import devcluster, nodesim
from gpuslice_dev.controlplane import ControlPlane
from tests.integration import kubehelpers as h

pytestmark = pytest.mark.integration
async_test = pytest.mark.asyncio(loop_scope="session")

WAIT_S = 10.0
GO_TIME = re.compile(r"Reported \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d*[1-9])? \+0000 UTC m=\+\d+\.\d{9}")


async def _wait(pred: Callable[[], Awaitable[bool]], timeout: float = WAIT_S) -> None:
    async def poll() -> None:
        while not await pred():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), timeout)


def test_go_time_string_matches_go() -> None:
    # time.Unix(1796137445, 123456700).UTC() printed by Go, with a monotonic reading of 12.3 s.
    wall = 1796137445 * 1_000_000_000 + 123_456_700
    assert (
        nodesim.go_time_string(wall, 12_300_000_000)
        == "2026-12-01 15:04:05.1234567 +0000 UTC m=+12.300000000"
    )
    assert nodesim.go_time_string(1796137445 * 1_000_000_000) == "2026-12-01 15:04:05 +0000 UTC"
    assert nodesim.reported_value(wall, 5).endswith(" m=+0.000000005")
    assert GO_TIME.fullmatch(nodesim.reported_value(wall, 12_300_000_000))


def test_freeze_thaw_and_restart_apiserver(control_plane: ControlPlane, namespace: str) -> None:
    server, pid = control_plane.server, control_plane.apiserver_pid
    control_plane.freeze_apiserver()
    try:
        status, _ = control_plane.api_request("GET", f"/api/v1/namespaces/{namespace}", timeout=1.0)
        assert status == 0  # accepted by the kernel, never answered
    finally:
        control_plane.thaw_apiserver()
    assert control_plane.api_request("GET", f"/api/v1/namespaces/{namespace}")[0] == 200

    new_pid = control_plane.restart_apiserver()

    assert new_pid != pid and control_plane.server == server
    # Same etcd (the namespace is still there), same tokens (admin and the plain user).
    assert control_plane.api_request("GET", f"/api/v1/namespaces/{namespace}")[0] == 200
    status, _ = control_plane.api_request("GET", "/api/v1/nodes", token=control_plane.user_token)
    assert status == 403  # authenticated (not 401), just not authorized


def test_stop_works_on_a_frozen_or_killed_apiserver() -> None:
    for fault in ("freeze", "kill"):
        plane = ControlPlane().start()
        pid = plane.apiserver_pid
        if fault == "freeze":
            plane.freeze_apiserver()
        else:
            plane.kill_apiserver()
        started = time.monotonic()
        plane.stop()
        assert time.monotonic() - started < 8.0, f"stop() after {fault} waited for the SIGKILL fallback"
        assert not Path(f"/proc/{pid}").exists()  # stopped and reaped


class _Backend:
    """A tiny HTTP server answering ``/readyz`` (200 or 503) and ``/who`` (its name)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready = True
        backend = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path == "/readyz":
                    code, body = (200, b"ok") if backend.ready else (503, b"not leader")
                else:
                    code, body = 200, backend.name.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def backends() -> Iterator[tuple[_Backend, _Backend]]:
    a, b = _Backend("a"), _Backend("b")
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _who(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url + "/who", timeout=2) as resp:  # noqa: S310 - loopback
            text: str = resp.read().decode()
            return text
    except OSError:
        return None


def _until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_service_proxy_forwards_to_ready_backends_only(backends: tuple[_Backend, _Backend]) -> None:
    a, b = backends
    b.ready = False
    with devcluster.ServiceProxy([a.url, b.url], poll_s=0.05) as proxy:
        _until(lambda: proxy.ready_backends() == [a.url])
        assert {_who(proxy.url) for _ in range(6)} == {"a"}

        a.ready, b.ready = False, True
        _until(lambda: proxy.ready_backends() == [b.url])
        assert {_who(proxy.url) for _ in range(6)} == {"b"}

        a.ready = True
        _until(lambda: len(proxy.ready_backends()) == 2)
        assert {_who(proxy.url) for _ in range(6)} == {"a", "b"}  # round robin

        a.ready = b.ready = False
        _until(lambda: not proxy.ready_backends())
        refused = proxy.refused
        assert _who(proxy.url) is None  # closed at once: nobody is ready
        assert proxy.refused == refused + 1
        assert proxy.forwarded[a.url] >= 3 and proxy.forwarded[b.url] >= 3


@async_test
async def test_nodesim_reports_and_node_faults(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    await nodesim.make_node(kube, node_name, count=2)
    card = nodesim.card_uuids(node_name, 2)[0]
    sim = nodesim.NodeSim(kube, [node_name], report_period_s=0.2)
    task = asyncio.create_task(sim.run())

    async def handshake() -> str:
        node = await locks.read_node(kube, node_name)
        return node.metadata.annotations.get(keys.NODE_HANDSHAKE, "")

    async def allocatable() -> str:
        return (await locks.read_node(kube, node_name)).status.allocatable.get("nvidia.com/gpu", "")

    async def phase(name: str) -> str:
        return (await pods.get(kube, namespace, name)).metadata.annotations.get(keys.BIND_PHASE, "")

    async def running(name: str) -> str:
        return (await pods.get(kube, namespace, name)).status.phase

    async def bind_allocating(name: str) -> None:
        uid = h.create_pod(control_plane, namespace, name, gpus=1)["metadata"]["uid"]
        alloc = allocations.PodAllocation(
            node=node_name, containers=((allocations.DeviceGrant(uuid=card, memory_mib=1000, cores=10),),)
        )
        await locks.acquire(kube, node_name, namespace, name)
        await pods.patch_annotations(
            kube,
            namespace,
            name,
            pod_devices.bind_annotations(alloc, time.time()),
            labels={keys.VGPU_NODE: node_name},
            uid=uid,
        )
        await binding.bind(kube, namespace, name, uid, node_name)

    try:
        first = ""

        async def reported() -> bool:
            nonlocal first
            first = await handshake()
            return first.startswith("Reported ")

        await _wait(reported)
        assert GO_TIME.fullmatch(first), first

        await sim.stop_node(node_name)
        assert await allocatable() == "0"
        await asyncio.sleep(0.3)
        frozen = await handshake()
        await bind_allocating("while-stopped")
        await asyncio.sleep(0.6)
        assert await handshake() == frozen  # no reports from a dead plugin
        assert await phase("while-stopped") == keys.BIND_PHASE_ALLOCATING  # no Allocate either

        await sim.start_node(node_name)
        assert await allocatable() == "20"  # 2 cards x 10 slots, from the capacity
        await _wait(lambda: _eq(running("while-stopped"), "Running"))  # the handshake's last step
        assert await phase("while-stopped") == keys.BIND_PHASE_SUCCESS
        assert keys.NODE_LOCK not in (await locks.read_node(kube, node_name)).metadata.annotations
        assert await handshake() != frozen

        await sim.mute_node(node_name)
        assert await allocatable() == "20"  # kubelet still advertises the GPUs
        await bind_allocating("while-muted")
        await asyncio.sleep(0.6)
        assert await phase("while-muted") == keys.BIND_PHASE_ALLOCATING
        assert (await locks.read_node(kube, node_name)).metadata.annotations.get(keys.NODE_LOCK)
        await sim.start_node(node_name)
        await _wait(lambda: _eq(running("while-muted"), "Running"))
        assert await phase("while-muted") == keys.BIND_PHASE_SUCCESS
        assert sim.completed == [f"{namespace}/while-stopped", f"{namespace}/while-muted"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _eq(value: Awaitable[str], expected: str) -> bool:
    return await value == expected


@async_test
async def test_allocate_survives_annotations_cleared_under_it(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    await nodesim.make_node(kube, node_name, count=1)
    uid = h.create_pod(control_plane, namespace, "p", gpus=1)["metadata"]["uid"]
    await locks.acquire(kube, node_name, namespace, "p")
    await pods.patch_annotations(kube, namespace, "p", {keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING})
    await binding.bind(kube, namespace, "p", uid, node_name)
    stale = await pods.get(kube, namespace, "p")
    # A recovery clears the pod's bind annotations while the plugin holds the watched copy.
    await pods.patch_annotations(kube, namespace, "p", {keys.BIND_PHASE: None})
    sim = nodesim.NodeSim(kube, [node_name])

    assert await sim.allocate(stale) is False

    pod = await pods.get(kube, namespace, "p")
    assert keys.BIND_PHASE not in pod.metadata.annotations and pod.status.phase != "Running"
    assert sim.completed == []


def test_extender_env_kill_and_restart(control_plane: ControlPlane, tmp_path: Path) -> None:
    ext = devcluster.Extender(
        control_plane.kubeconfig,
        tmp_path / "ext.log",
        extra_args=["--leader-elect", "none"],
        env={"GPUSLICE_CHAOS_MARKER": "42"},
    )
    try:
        ext.start(wait_ready=False)
        pid, port = ext.pid, ext.port
        assert pid is not None
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert b"GPUSLICE_CHAOS_MARKER=42" in environ
        assert ext.kill() == -9 and not ext.running()
        assert devcluster.http_status(ext.url + "/healthz") == 0
        ext.restart()
        assert ext.port == port and ext.pid != pid and ext.running()
        assert devcluster.http_status(ext.url + "/readyz") == 200
    finally:
        ext.stop()
