"""The node-side simulator's handshake and the event recorder against a real kube-apiserver.

Aspects: ``make_node`` registers cards and capacity the way HAMi's device plugin would; the
simulator completes the bind handshake (blanked devices, ``success``, lock released, Running)
only for the pod the node lock names; the recorder folds repeats into one Event with a series,
for pods and for Nodes (namespace ``default``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from gpuslice.codec import keys, pod_devices, registrations
from gpuslice.kube import binding, events, locks, pods
from gpuslice.kube import client as kclient
from gpuslice.model import allocations
from gpuslice_dev import nodesim
from gpuslice_dev.controlplane import ControlPlane
from tests.integration import kubehelpers as h

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

WAIT_S = 10.0


async def test_make_node_registers_cards_and_capacity(
    control_plane: ControlPlane, kube: kclient.KubeClient, node_name: str
) -> None:
    node = await nodesim.make_node(kube, node_name, count=4, split_count=5, memory_mib=24576, numa_nodes=2)

    cards = registrations.decode(node.metadata.annotations[keys.NODE_REGISTER])
    assert [c.numa for c in cards] == [0, 0, 1, 1]
    assert {c.memory_mib for c in cards} == {24576}
    assert node.status.allocatable["nvidia.com/gpu"] == "20"  # 4 cards x 5 slots
    assert node.status.capacity["pods"] == "110" and node.metadata.labels["gpu"] == "on"


async def _wait(pred: Any) -> None:
    async def poll() -> None:
        while not await pred():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), WAIT_S)


async def test_nodesim_completes_the_handshake(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    await nodesim.make_node(kube, node_name, count=2)
    card = nodesim.card_uuids(node_name, 2)[0]
    uid = h.create_pod(control_plane, namespace, "p", gpus=1)["metadata"]["uid"]
    alloc = allocations.PodAllocation(
        node=node_name, containers=((allocations.DeviceGrant(uuid=card, memory_mib=4000, cores=30),),)
    )
    # What the extender's bind does: lock, annotate, bind.
    await locks.acquire(kube, node_name, namespace, "p")
    await pods.patch_annotations(
        kube,
        namespace,
        "p",
        pod_devices.bind_annotations(alloc, time.time()),
        labels={keys.VGPU_NODE: node_name},
        uid=uid,
    )
    await binding.bind(kube, namespace, "p", uid, node_name)
    sim = nodesim.NodeSim(kube, [node_name])
    task = asyncio.create_task(sim.run())
    try:

        async def running() -> bool:
            return (await pods.get(kube, namespace, "p")).status.phase == "Running"

        await _wait(running)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    pod = await pods.get(kube, namespace, "p")
    assert pod.metadata.annotations[keys.BIND_PHASE] == keys.BIND_PHASE_SUCCESS
    assert pod.metadata.annotations[keys.DEVICES_TO_ALLOCATE] == ";"
    assert pod.metadata.annotations[keys.DEVICES_ALLOCATED] == f"{card},NVIDIA,4000,30:;"
    assert keys.NODE_LOCK not in (await locks.read_node(kube, node_name)).metadata.annotations
    assert sim.completed == [f"{namespace}/p"]


async def test_nodesim_serves_only_the_lock_owner(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    await nodesim.make_node(kube, node_name, count=1)
    uid = h.create_pod(control_plane, namespace, "p", gpus=1)["metadata"]["uid"]
    h.create_pod(control_plane, namespace, "other")
    await locks.acquire(kube, node_name, namespace, "other")
    await pods.patch_annotations(kube, namespace, "p", {keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING})
    await binding.bind(kube, namespace, "p", uid, node_name)
    sim = nodesim.NodeSim(kube, [node_name])

    done = await sim.allocate(await pods.get(kube, namespace, "p"))

    assert done is False and sim.skipped == 1
    assert (await pods.get(kube, namespace, "p")).metadata.annotations[keys.BIND_PHASE] == "allocating"


def _events(control_plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    status, body = control_plane.api_request("GET", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
    assert status == 200, body
    items: list[dict[str, Any]] = body["items"]
    return items


async def test_recorder_folds_repeats_into_a_series(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str
) -> None:
    uid = h.create_pod(control_plane, namespace, "p")["metadata"]["uid"]
    async with events.Recorder(kube, instance="it-replica-0") as rec:
        for _ in range(3):
            rec.record(namespace, "p", uid, "Warning", "FilterFailed", "Scheduling", "no card fits")
        rec.record(namespace, "p", uid, "Normal", "GPUAllocated", "Binding", "x" * 5000)
        await rec.flush()

    got = sorted(_events(control_plane, namespace), key=lambda e: e["reason"])
    assert [e["reason"] for e in got] == ["FilterFailed", "GPUAllocated"]
    failed, allocated = got
    assert failed["series"]["count"] == 3
    assert failed["regarding"]["uid"] == uid and failed["reportingController"] == events.CONTROLLER
    assert len(allocated["note"]) == 1024 and "series" not in allocated
    # The three repeats were folded while queued: one create carrying the series, no update.
    assert (rec.created, rec.updated, rec.failed) == (2, 0, 0)
    # A repeat after the Event exists updates its series.
    async with events.Recorder(kube, instance="it-replica-0") as rec2:
        rec2.record(namespace, "p", uid, "Warning", "FilterFailed", "Scheduling", "no card fits")
        await rec2.flush()
        rec2.record(namespace, "p", uid, "Warning", "FilterFailed", "Scheduling", "no card fits")
        await rec2.flush()
    assert (rec2.created, rec2.updated) == (1, 1)


async def test_recorder_sends_warnings_before_a_backlog_of_normal_events(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str
) -> None:
    uid = h.create_pod(control_plane, namespace, "p")["metadata"]["uid"]
    rec = events.Recorder(kube, instance="it-replica-0", qps=1000, burst=1000)
    for i in range(50):
        rec.record(namespace, "p", uid, "Normal", "Routine", "Scheduling", f"routine {i}")
    rec.record(namespace, "p", uid, "Warning", "AllocateTimeout", "Recovering", "lock released")
    sent: list[str] = []
    original = rec.send

    async def spy(p: Any, count: int = 1, last: Any = None) -> None:
        sent.append(p.reason)
        await original(p, count, last)

    rec.send = spy  # type: ignore[method-assign]
    async with rec:
        await rec.flush()
    assert sent[0] == "AllocateTimeout" and len(sent) == 51


async def test_node_events_live_in_default(
    control_plane: ControlPlane, kube: kclient.KubeClient, node_name: str
) -> None:
    h.create_node(control_plane, node_name)
    async with events.Recorder(kube, instance="it-replica-0") as rec:
        rec.record_node(node_name, "", "Warning", "NodeRegistrationInvalid", "Registering", "bad")
        await rec.flush()

    mine = [e for e in _events(control_plane, "default") if e["regarding"]["name"] == node_name]
    assert len(mine) == 1 and mine[0]["regarding"]["kind"] == "Node"
    assert rec.failed == 0


async def test_nodesim_failed_allocate_rejects_the_pod(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    await nodesim.make_node(kube, node_name, count=1)
    uid = h.create_pod(control_plane, namespace, "p", gpus=1)["metadata"]["uid"]
    await locks.acquire(kube, node_name, namespace, "p")
    await pods.patch_annotations(kube, namespace, "p", {keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING})
    await binding.bind(kube, namespace, "p", uid, node_name)
    sim = nodesim.NodeSim(kube, [node_name], fail=lambda pod: True)

    assert await sim.allocate(await pods.get(kube, namespace, "p")) is True

    pod = await pods.get(kube, namespace, "p")
    assert (
        pod.status.phase == "Failed" and pod.metadata.annotations[keys.BIND_PHASE] == keys.BIND_PHASE_FAILED
    )
    assert keys.NODE_LOCK not in (await locks.read_node(kube, node_name)).metadata.annotations
    assert sim.failed == [f"{namespace}/p"] and sim.completed == []
