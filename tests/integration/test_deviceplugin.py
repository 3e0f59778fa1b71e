"""The device plugin process against a real kube-apiserver: HAMi's Allocate handshake end to end.

The plugin runs as ``python -m gpuslice_dev.deviceplugin`` (fake ``a40-2`` cards, a temp
socket dir with no kubelet, temp host dirs) and the test plays kubelet's ``Allocate`` over gRPC on
the plugin's socket. Pods carry what gpuslice writes at bind (``pod_devices.bind_annotations``),
the node lock is taken as the extender takes it (``kube.locks.acquire``) and the pod is bound.

Aspects: the answer (env, mounts, device specs) for each container, init containers first; the
annotation consumed one container at a time, ``bind-phase: success`` and the lock released after
the last; the failure path (card count mismatch: ``failed``, lock released); a lock naming
another pod (that pod is served, not the one merely pending; then the pending one by HAMi's
search); a lock naming a pod that does not exist (an error, nothing written); the Node's
registration and handshake; SIGTERM removes the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpuslice.agent import fake
from gpuslice.codec import keys, pod_devices, registrations
from gpuslice.kube import binding, locks, pods
from gpuslice.kube import client as kclient
from gpuslice.model import allocations
from gpuslice_dev.controlplane import ControlPlane
from gpuslice_dev.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from tests.integration import kubehelpers as h

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

SHAPE = "a40-2"
CARDS = [fake.fake_uuid(SHAPE, i) for i in range(2)]
SPLIT = 4
WAIT_S = 20.0


class PluginProcess:
    """The plugin as a child process, with its directories."""

    def __init__(self, root: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.root = root
        self.proc = proc
        self.log = log
        self.socket = os.path.join(root, "plugins", "nvidia-gpu.sock")
        self.hami = os.path.join(root, "hami")
        self.dev = os.path.join(root, "dev")
        self.lock = os.path.join(root, "lock")

    async def call(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        async with grpc.aio.insecure_channel(f"unix://{self.socket}") as channel:
            return await api_pb2_grpc.DevicePluginStub(channel).Allocate(request, timeout=15)

    def logs(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


@contextlib.asynccontextmanager
async def plugin_process(control_plane: ControlPlane, node: str) -> AsyncIterator[PluginProcess]:
    root = tempfile.mkdtemp(prefix="gs-dpi-", dir="/tmp")  # unix socket paths must stay short
    dev = os.path.join(root, "dev")
    os.makedirs(dev)
    for name in ("nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1"):  # stand-ins: only existence is read
        Path(dev, name).touch()
    log = Path(root, "plugin.log")
    argv = [
        sys.executable,
        "-m",
        "gpuslice_dev.deviceplugin",
        f"--node-name={node}",
        f"--kubeconfig={control_plane.kubeconfig}",
        f"--backend=fake:{SHAPE}",
        f"--split-count={SPLIT}",
        f"--socket-dir={os.path.join(root, 'plugins')}",
        f"--hami-dir={os.path.join(root, 'hami')}",
        f"--dev-dir={dev}",
        f"--lock-dir={os.path.join(root, 'lock')}",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    plugin = PluginProcess(root, proc, log)
    try:
        deadline = time.monotonic() + WAIT_S
        while not os.path.exists(plugin.socket):
            assert proc.poll() is None, plugin.logs()
            assert time.monotonic() < deadline, f"no socket after {WAIT_S}s:\n{plugin.logs()}"
            await asyncio.sleep(0.05)
        yield plugin
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, WAIT_S) == 0, plugin.logs()
        assert not os.path.exists(plugin.socket), "SIGTERM must remove the socket"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def grant(card: int, memory: int, cores: int) -> allocations.DeviceGrant:
    return allocations.DeviceGrant(uuid=CARDS[card], memory_mib=memory, cores=cores)


def containers(names: Sequence[str], env: dict[str, dict[str, str]] | None = None) -> list[dict[str, Any]]:
    env = env or {}
    return [
        {
            "name": n,
            "image": "registry.k8s.io/pause:3.10",
            "env": [{"name": k, "value": v} for k, v in env.get(n, {}).items()],
        }
        for n in names
    ]


async def bound_pod(
    control_plane: ControlPlane,
    kube: kclient.KubeClient,
    namespace: str,
    name: str,
    node: str,
    alloc: Sequence[allocations.ContainerAllocation],
    *,
    init: Sequence[str] = (),
    app: Sequence[str] = ("main",),
    env: dict[str, dict[str, str]] | None = None,
    lock: bool = True,
) -> str:
    """A pod as gpuslice leaves it at bind: annotated, (locked,) bound; returns its UID."""
    body = h.pod_body(name)
    body["spec"]["containers"] = containers(app, env)
    if init:
        body["spec"]["initContainers"] = containers(init, env)
    status, created = control_plane.api_request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    assert status == 201, created
    uid: str = created["metadata"]["uid"]
    placed = allocations.PodAllocation(node=node, containers=tuple(alloc), init_count=len(init))
    if lock:
        await locks.acquire(kube, node, namespace, name)
    await pods.patch_annotations(
        kube,
        namespace,
        name,
        pod_devices.bind_annotations(placed, time.time()),
        labels={keys.VGPU_NODE: node},
        uid=uid,
    )
    await binding.bind(kube, namespace, name, uid, node)
    return uid


def allocate_request(*counts: int, card: int = 0) -> api_pb2.AllocateRequest:
    """kubelet's request: per container, ``count`` replica IDs (of one card: kubelet's choice is ignored)."""
    return api_pb2.AllocateRequest(
        container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=[f"{CARDS[card]}-{i}" for i in range(n)])
            for n in counts
        ]
    )


async def pod_annotations(kube: kclient.KubeClient, namespace: str, name: str) -> dict[str, str]:
    return dict((await pods.get(kube, namespace, name)).metadata.annotations)


async def node_lock(kube: kclient.KubeClient, node: str) -> str | None:
    return (await locks.read_node(kube, node)).metadata.annotations.get(keys.NODE_LOCK)


async def test_allocate_serves_each_container_in_order_then_finishes_the_handshake(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    h.create_node(control_plane, node_name)
    async with plugin_process(control_plane, node_name) as plugin:
        uid = await bound_pod(
            control_plane,
            kube,
            namespace,
            "p",
            node_name,
            [(grant(1, 1000, 30),), (grant(0, 2000, 50), grant(1, 3000, 50)), ()],
            init=("setup",),
            app=("train", "sidecar"),
            env={"train": {"CUDA_DISABLE_CONTROL": "true"}},
        )
        before = (await pod_annotations(kube, namespace, "p"))[keys.DEVICES_TO_ALLOCATE]
        assert before == f"{CARDS[1]},NVIDIA,1000,30:;{CARDS[0]},NVIDIA,2000,50:{CARDS[1]},NVIDIA,3000,50:;;"

        # the init container first
        first = (await plugin.call(allocate_request(1))).container_responses
        assert len(first) == 1
        env = dict(first[0].envs)
        cache = env.pop("CUDA_DEVICE_MEMORY_SHARED_CACHE")
        assert cache.startswith("/usr/local/vgpu/") and cache.endswith(".cache")
        assert env == {
            "NVIDIA_VISIBLE_DEVICES": CARDS[1],
            "CUDA_DEVICE_MEMORY_LIMIT_0": "1000m",
            "CUDA_DEVICE_SM_LIMIT": "30",
            "LIBCUDA_LOG_LEVEL": "1",
        }
        hami = plugin.hami
        assert [(m.container_path, m.host_path, m.read_only) for m in first[0].mounts] == [
            ("/usr/local/vgpu/libvgpu.so", f"{hami}/libvgpu.so", True),
            ("/usr/local/vgpu", f"{hami}/containers/{uid}_setup", False),
            ("/tmp/vgpulock", plugin.lock, False),
            ("/etc/ld.so.preload", f"{hami}/ld.so.preload", True),
        ]
        assert [(d.container_path, d.host_path, d.permissions) for d in first[0].devices] == [
            ("/dev/nvidiactl", f"{plugin.dev}/nvidiactl", "rw"),
            ("/dev/nvidia-uvm", f"{plugin.dev}/nvidia-uvm", "rw"),
            ("/dev/nvidia1", f"{plugin.dev}/nvidia1", "rw"),
        ]
        assert os.path.isdir(f"{hami}/containers/{uid}_setup") and os.path.isfile(f"{hami}/libvgpu.so")
        middle = await pod_annotations(kube, namespace, "p")
        assert middle[keys.DEVICES_TO_ALLOCATE] == f";{CARDS[0]},NVIDIA,2000,50:{CARDS[1]},NVIDIA,3000,50:;;"
        assert middle[keys.BIND_PHASE] == keys.BIND_PHASE_ALLOCATING
        assert await node_lock(kube, node_name) is not None  # held until the last container

        # then the app container with two cards; it disables HAMi-core's preload
        second = await plugin.call(allocate_request(2))
        (answer,) = second.container_responses
        assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == f"{CARDS[0]},{CARDS[1]}"
        assert (answer.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], answer.envs["CUDA_DEVICE_MEMORY_LIMIT_1"]) == (
            "2000m",
            "3000m",
        )
        assert answer.envs["CUDA_DEVICE_SM_LIMIT"] == "50"
        assert "/etc/ld.so.preload" not in [m.container_path for m in answer.mounts]
        assert [d.container_path for d in answer.devices][-2:] == ["/dev/nvidia0", "/dev/nvidia1"]
        done = await pod_annotations(kube, namespace, "p")
        assert done[keys.DEVICES_TO_ALLOCATE] == ";;;"
        assert done[keys.BIND_PHASE] == keys.BIND_PHASE_SUCCESS
        assert done[keys.DEVICES_ALLOCATED] == before  # never erased
        assert await node_lock(kube, node_name) is None

        # the Node carries the plugin's registration and handshake
        node_ann = (await locks.read_node(kube, node_name)).metadata.annotations
        registered = registrations.decode(node_ann[keys.NODE_REGISTER])
        assert [c.uuid for c in registered] == CARDS and {c.split_count for c in registered} == {SPLIT}
        assert node_ann[keys.NODE_HANDSHAKE].startswith("Reported ")

        # nothing is pending any more: the next Allocate finds no pod
        with pytest.raises(grpc.aio.AioRpcError) as nothing:
            await plugin.call(allocate_request(1))
        assert nothing.value.details() == f"no binding pod found on node {node_name}"


async def test_a_card_count_mismatch_fails_the_pod_and_releases_the_lock(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    h.create_node(control_plane, node_name)
    async with plugin_process(control_plane, node_name) as plugin:
        await bound_pod(
            control_plane, kube, namespace, "p", node_name, [(grant(0, 1000, 0), grant(1, 1000, 0))]
        )
        before = (await pod_annotations(kube, namespace, "p"))[keys.DEVICES_TO_ALLOCATE]
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await plugin.call(allocate_request(1))  # the container asked kubelet for one GPU
        assert failed.value.code() is grpc.StatusCode.UNKNOWN
        assert failed.value.details() == f"pod {namespace}/p: device number not matched"
        after = await pod_annotations(kube, namespace, "p")
        assert after[keys.BIND_PHASE] == keys.BIND_PHASE_FAILED
        assert after[keys.DEVICES_TO_ALLOCATE] == before
        assert await node_lock(kube, node_name) is None


async def test_the_lock_names_the_pod_that_is_served(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    h.create_node(control_plane, node_name)
    async with plugin_process(control_plane, node_name) as plugin:
        # "waiting" is annotated and bound without the lock; "holder" holds the lock
        await bound_pod(
            control_plane, kube, namespace, "waiting", node_name, [(grant(0, 1000, 10),)], lock=False
        )
        await bound_pod(control_plane, kube, namespace, "holder", node_name, [(grant(1, 7000, 70),)])
        (answer,) = (await plugin.call(allocate_request(1))).container_responses
        assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == CARDS[1]
        assert answer.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "7000m"
        holder = await pod_annotations(kube, namespace, "holder")
        assert holder[keys.BIND_PHASE] == keys.BIND_PHASE_SUCCESS and holder[keys.DEVICES_TO_ALLOCATE] == ";"
        waiting = await pod_annotations(kube, namespace, "waiting")
        assert waiting[keys.BIND_PHASE] == keys.BIND_PHASE_ALLOCATING
        assert waiting[keys.DEVICES_TO_ALLOCATE] == f"{CARDS[0]},NVIDIA,1000,10:;"
        assert await node_lock(kube, node_name) is None

        # no lock now: HAMi's search finds the pending pod
        (answer,) = (await plugin.call(allocate_request(1))).container_responses
        assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == CARDS[0]
        assert (await pod_annotations(kube, namespace, "waiting"))[keys.BIND_PHASE] == keys.BIND_PHASE_SUCCESS


async def test_a_lock_naming_a_missing_pod_writes_nothing(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    h.create_node(control_plane, node_name)
    async with plugin_process(control_plane, node_name) as plugin:
        await bound_pod(control_plane, kube, namespace, "p", node_name, [(grant(0, 1000, 10),)], lock=False)
        await locks.acquire(kube, node_name, namespace, "ghost")
        lock = await node_lock(kube, node_name)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await plugin.call(allocate_request(1))
        assert failed.value.details() == (
            f"no binding pod found on node {node_name}: "
            f"the node lock names {namespace}/ghost, which does not exist"
        )
        p = await pod_annotations(kube, namespace, "p")
        assert p[keys.BIND_PHASE] == keys.BIND_PHASE_ALLOCATING
        assert p[keys.DEVICES_TO_ALLOCATE] == f"{CARDS[0]},NVIDIA,1000,10:;"
        assert await node_lock(kube, node_name) == lock
