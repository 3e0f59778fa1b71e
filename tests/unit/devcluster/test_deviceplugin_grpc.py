"""The device plugin against an in-process fake kubelet (gRPC on unix sockets in a temp dir).

The fake kubelet serves ``v1beta1.Registration`` on ``<dir>/kubelet.sock`` and, like kubelet's
device manager, on each ``Register`` dials the plugin's endpoint back, asks
``GetDevicePluginOptions`` and follows ``ListAndWatch``. "Restarting" it removes every socket in
the directory and serves a new ``kubelet.sock``, as kubelet does. The API server is the scripted
fake of ``tests.unit.kube.fakeapi`` (the plugin patches its Node, and reads the node lock and pod
for ``GetPreferredAllocation``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
import pytest

from gpuslice.agent import backend, discover, fake
from gpuslice.codec import keys
from gpuslice_dev.deviceplugin import allocator, plugin, responses, service
from gpuslice_dev.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from tests.unit.kube import fakeapi

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

NODE = "gpu-node-1"
WAIT_S = 10.0


class FakeKubelet(api_pb2_grpc.RegistrationServicer):
    """kubelet's registration side: records requests, connects back, keeps every device list."""

    def __init__(self, socket_dir: str) -> None:
        self.socket_dir = socket_dir
        self.requests: list[api_pb2.RegisterRequest] = []
        self.options: list[api_pb2.DevicePluginOptions] = []
        self.lists: list[list[api_pb2.Device]] = []
        self.changed = asyncio.Event()
        self._server: grpc.aio.Server | None = None
        self._channels: list[grpc.aio.Channel] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def Register(self, request: api_pb2.RegisterRequest, context: Any) -> api_pb2.Empty:
        self.requests.append(request)
        channel = grpc.aio.insecure_channel(f"unix://{os.path.join(self.socket_dir, request.endpoint)}")
        self._channels.append(channel)
        stub = api_pb2_grpc.DevicePluginStub(channel)
        self.options.append(await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5))
        self._tasks.append(asyncio.create_task(self._follow(stub)))
        return api_pb2.Empty()

    async def _follow(self, stub: api_pb2_grpc.DevicePluginAsyncStub) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for response in stub.ListAndWatch(api_pb2.Empty()):
                self.lists.append(list(response.devices))
                self.changed.set()

    async def start(self) -> None:
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{os.path.join(self.socket_dir, plugin.KUBELET_SOCKET)}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for channel in self._channels:
            await channel.close()
        if self._server is not None:
            await self._server.stop(0)

    async def next_list(self, after: int) -> list[api_pb2.Device]:
        """The first list received after ``after`` lists."""

        async def wait() -> list[api_pb2.Device]:
            while len(self.lists) <= after:
                self.changed.clear()
                await self.changed.wait()
            return self.lists[after]

        return await asyncio.wait_for(wait(), WAIT_S)


def restart_kubelet_dir(socket_dir: str) -> None:
    """What a starting kubelet does first: remove every socket (file) in the directory."""
    for name in os.listdir(socket_dir):
        path = os.path.join(socket_dir, name)
        if not os.path.isdir(path):
            os.remove(path)


async def until(pred: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not pred():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), WAIT_S)


@pytest.fixture
def tmp() -> Iterator[str]:
    """A short temp dir (unix socket paths are limited to 107 bytes)."""
    path = tempfile.mkdtemp(prefix="gs-dp-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def api_handler(state: dict[str, Any]) -> fakeapi.Handler:
    """The Node (annotations patched by the plugin), and an optional locked pod."""

    def handle(req: fakeapi.Request) -> fakeapi.Reply:
        if req.path == f"/api/v1/nodes/{NODE}":
            if req.method == "PATCH":
                state["node_annotations"].update(req.json()["metadata"]["annotations"])
            return fakeapi.Reply(200, fakeapi.node(NODE, "1", state["node_annotations"]))
        pod = state.get("pod")
        if pod is not None and req.method == "GET" and req.path.endswith(f"/pods/{pod['metadata']['name']}"):
            return fakeapi.Reply(200, pod)
        if req.path == "/api/v1/pods":
            return fakeapi.Reply(200, {"kind": "PodList", "metadata": {}, "items": []})
        return fakeapi.error(404, "NotFound")

    return handle


class Running:
    """A started ``service.Service`` with its fake backend and fake API state."""

    def __init__(
        self, svc: service.Service, nvml: fake.FakeBackend, state: dict[str, Any], api: fakeapi.FakeApi
    ):
        self.svc = svc
        self.nvml = nvml
        self.state = state
        self.api = api

    @property
    def plugin(self) -> plugin.Plugin:
        assert self.svc.plugin is not None
        return self.svc.plugin


@contextlib.asynccontextmanager
async def running_plugin(socket_dir: str, shape: str = "a40-2", split: int = 3) -> AsyncIterator[Running]:
    state: dict[str, Any] = {"node_annotations": {}}
    nvml = fake.FakeBackend(fake.shape(shape))
    hami = os.path.join(socket_dir, "hami")
    settings = service.Settings(
        endpoint=plugin.Endpoint(socket_dir=socket_dir),
        registration=discover.RegistrationConfig(split_count=split),
        allocate=allocator.Settings(
            node=NODE,
            paths=responses.Paths(hami_dir=hami, dev_dir=hami, lock_dir=os.path.join(hami, "lock")),
        ),
        quiet_period_s=0.3,
        report_period_s=30.0,
        poll_s=0.05,
        retry_s=0.1,
        health_poll_s=0.05,
    )
    async with fakeapi.serving(api_handler(state)) as (api, kube):

        def open_backend() -> backend.Backend:
            return nvml

        svc = service.Service(settings, open_backend, kube)
        stop = asyncio.Event()
        task = asyncio.create_task(svc.run(stop))
        try:
            await asyncio.wait_for(svc.ready.wait(), WAIT_S)
            yield Running(svc, nvml, state, api)
        finally:
            stop.set()
            await asyncio.wait_for(task, WAIT_S)


@contextlib.asynccontextmanager
async def kubelet(socket_dir: str) -> AsyncIterator[FakeKubelet]:
    k = FakeKubelet(socket_dir)
    await k.start()
    try:
        yield k
    finally:
        await k.stop()


async def test_registers_with_hamis_request_and_kubelet_sees_the_replicas(tmp: str) -> None:
    async with kubelet(tmp) as k, running_plugin(tmp) as r:
        await until(lambda: len(k.lists) >= 1)
        req = k.requests[0]
        assert (req.version, req.endpoint, req.resource_name) == (
            "v1beta1",
            "nvidia-gpu.sock",
            "nvidia.com/gpu",
        )
        assert not req.options.pre_start_required and not req.options.get_preferred_allocation_available
        assert k.options[0].get_preferred_allocation_available and not k.options[0].pre_start_required
        cards = [g.uuid for g in r.nvml.machine.gpus]
        assert [d.ID for d in k.lists[0]] == [f"{u}-{i}" for u in cards for i in range(3)]
        assert {d.health for d in k.lists[0]} == {"Healthy"}
        assert {d.topology.nodes[0].ID for d in k.lists[0]} == {0}  # a40-2: one socket
        assert os.path.exists(os.path.join(tmp, "nvidia-gpu.sock"))
    # stopping removes the socket
    assert not os.path.exists(os.path.join(tmp, "nvidia-gpu.sock"))


async def test_node_annotations_are_written_at_start(tmp: str) -> None:
    async with running_plugin(tmp) as r:
        await until(lambda: keys.NODE_HANDSHAKE in r.state["node_annotations"])
        ann = r.state["node_annotations"]
        assert (
            ann[keys.NODE_HANDSHAKE].startswith("Reported ") and " +0000 UTC m=+" in ann[keys.NODE_HANDSHAKE]
        )
        assert ann[keys.NODE_REGISTER].count('"count":3') == 2


async def test_registration_is_retried_until_kubelet_sock_exists(tmp: str) -> None:
    async with running_plugin(tmp) as r:
        await asyncio.sleep(0.3)
        assert r.plugin.registrations == 0
        async with kubelet(tmp) as k:
            await until(lambda: len(k.lists) >= 1 and r.plugin.registrations == 1)
            assert len(k.requests) == 1


async def test_reregisters_after_kubelet_removes_the_sockets(tmp: str) -> None:
    async with running_plugin(tmp) as r:
        async with kubelet(tmp) as first:
            await until(lambda: len(first.lists) >= 1)
        restart_kubelet_dir(tmp)  # kubelet restarting: its old socket and ours are gone
        async with kubelet(tmp) as second:
            await until(lambda: len(second.lists) >= 1 and r.plugin.registrations == 2)
            assert r.plugin.starts == 2
            assert second.requests[0].endpoint == "nvidia-gpu.sock"
            assert os.path.exists(os.path.join(tmp, "nvidia-gpu.sock"))
            assert [d.ID for d in second.lists[0]] == [d.ID for d in first.lists[0]]


async def test_reregisters_when_only_kubelet_sock_is_recreated(tmp: str) -> None:
    async with running_plugin(tmp) as r:
        async with kubelet(tmp) as first:
            await until(lambda: len(first.lists) >= 1)
        with contextlib.suppress(FileNotFoundError):  # gRPC unlinks it when the server stops
            os.remove(os.path.join(tmp, plugin.KUBELET_SOCKET))
        async with kubelet(tmp) as second:
            await until(lambda: r.plugin.registrations == 2)
            assert r.plugin.starts == 1 and len(second.requests) == 1


async def test_an_unhealthy_card_resends_the_list_and_the_registration(tmp: str) -> None:
    async with kubelet(tmp) as k, running_plugin(tmp, split=2) as r:
        first = await k.next_list(0)
        assert {d.health for d in first} == {"Healthy"}
        r.nvml.inject_xid(1, 79)  # GPU fell off the bus
        second = await k.next_list(1)
        assert [d.health for d in second] == ["Healthy", "Healthy", "Unhealthy", "Unhealthy"]
        await until(lambda: r.state["node_annotations"][keys.NODE_REGISTER].count('"health":true') == 1)
        # healthy again after the quiet period
        third = await k.next_list(2)
        assert {d.health for d in third} == {"Healthy"}


async def test_application_xids_change_nothing(tmp: str) -> None:
    async with kubelet(tmp) as k, running_plugin(tmp) as r:
        await k.next_list(0)
        r.nvml.inject_xid(0, 43)
        await asyncio.sleep(0.3)
        assert len(k.lists) == 1


async def call_plugin(
    socket_dir: str, fn: Callable[[api_pb2_grpc.DevicePluginAsyncStub], Awaitable[Any]]
) -> Any:
    async with grpc.aio.insecure_channel(f"unix://{os.path.join(socket_dir, 'nvidia-gpu.sock')}") as channel:
        return await fn(api_pb2_grpc.DevicePluginStub(channel))


async def test_preferred_allocation_follows_the_locked_pods_annotation(tmp: str) -> None:
    async with running_plugin(tmp, shape="a100-8-2numa", split=2) as r:
        cards = [g.uuid for g in r.nvml.machine.gpus]
        want = cards[5]
        r.state["node_annotations"][keys.NODE_LOCK] = "2026-01-01T00:00:00Z,ns,p"
        r.state["pod"] = {
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "uid": "u1",
                "annotations": {
                    keys.VGPU_NODE: NODE,
                    keys.DEVICES_TO_ALLOCATE: f";{want},NVIDIA,1000,10:;",
                },
            },
            "spec": {"nodeName": NODE, "containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Pending"},
        }
        available = [f"{u}-{i}" for u in cards for i in range(2)]
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=1)
            ]
        )
        resp = await call_plugin(tmp, lambda stub: stub.GetPreferredAllocation(request, timeout=5))
        assert list(resp.container_responses[0].deviceIDs) == [f"{want}-0"]
        # no pod being allocated: spread over distinct cards in NVML order
        del r.state["node_annotations"][keys.NODE_LOCK]
        request.container_requests[0].allocation_size = 2
        resp = await call_plugin(tmp, lambda stub: stub.GetPreferredAllocation(request, timeout=5))
        assert list(resp.container_responses[0].deviceIDs) == [f"{cards[0]}-0", f"{cards[1]}-0"]


async def test_options_prestart_and_allocate_without_a_pod(tmp: str) -> None:
    async with running_plugin(tmp) as r:
        options = await call_plugin(tmp, lambda stub: stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5))
        assert options.get_preferred_allocation_available and not options.pre_start_required
        pre = await call_plugin(
            tmp,
            lambda stub: stub.PreStartContainer(
                api_pb2.PreStartContainerRequest(devices_ids=["x"]), timeout=5
            ),
        )
        assert pre == api_pb2.PreStartContainerResponse()
        card = r.nvml.machine.gpus[0].uuid
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{card}-0"])]
        )
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await call_plugin(tmp, lambda stub: stub.Allocate(request, timeout=5))
        assert failed.value.code() is grpc.StatusCode.UNKNOWN
        assert failed.value.details() == f"no binding pod found on node {NODE}"
        assert not any(req.method == "PATCH" and "/pods/" in req.path for req in r.api.requests)
