"""Fake GPU nodes, and a stand-in for HAMi's device plugin and the kubelet on them.

``make_node`` creates a Node object with HAMi's registration annotation and a capacity set
through ``/status`` (control-plane.md section 5). ``NodeSim`` watches pods bound to the nodes it
serves and, for each pod in ``hami.io/bind-phase: allocating``, does what the device plugin's
``Allocate`` and the kubelet would (hami-protocol.md section 8):

1. serve only the pod the node lock names (HAMi PR #3095); anything else waits;
2. blank every container entry of ``hami.io/vgpu-devices-to-allocate`` (``a:;b:;`` -> ``;;``)
   and set ``hami.io/bind-phase: success``;
3. release the node lock (owner-checked, compare-and-swap);
4. mark the pod Running through ``pods/status``.

A ``fail`` predicate plays a failed ``Allocate``: ``bind-phase: failed``, lock released, and the
pod Failed with reason ``UnexpectedAdmissionError``, as the kubelet rejects it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

from gpuslice.codec import keys, registrations
from gpuslice.codec import locks as lockcodec
from gpuslice.kube import client as kclient
from gpuslice.kube import errors, informer, kinds, locks, objects, pods
from gpuslice.model import devices

log = logging.getLogger(__name__)

DEFAULT_MODEL = "NVIDIA A100-SXM4-80GB"
GPU_LABEL = {"gpu": "on"}
"""The label HAMi's chart selects GPU nodes by."""
_UUID_NS = uuid.UUID("6f1c1d2e-2a51-4d7e-9a0c-9d9a6f0b1c11")


def card_uuids(node: str, count: int) -> list[str]:
    """Stable, unique GPU UUIDs for a fake node's cards."""
    return [f"GPU-{uuid.uuid5(_UUID_NS, f'{node}/{i}')}" for i in range(count)]


def cards(
    node: str,
    *,
    model: str = DEFAULT_MODEL,
    count: int = 8,
    memory_mib: int = 81920,
    split_count: int = 10,
    cores: int = devices.FULL_CORES,
    numa: Sequence[int] | None = None,
    numa_nodes: int = 1,
) -> tuple[devices.GpuDevice, ...]:
    """The registered cards of a fake node.

    Args:
        node: node name (UUIDs derive from it).
        model: card type.
        count: number of cards.
        memory_mib: memory per card.
        split_count: slots per card.
        cores: core capacity per card.
        numa: NUMA node per card; by default cards are spread evenly over ``numa_nodes`` nodes in
            index order (8 cards, 2 NUMA nodes: 0,0,0,0,1,1,1,1).
        numa_nodes: NUMA nodes when ``numa`` is not given.
    """
    layout = list(numa) if numa is not None else [i * numa_nodes // max(1, count) for i in range(count)]
    return tuple(
        devices.GpuDevice(
            uuid=u,
            index=i,
            type=model,
            memory_mib=memory_mib,
            cores=cores,
            split_count=split_count,
            numa=layout[i],
        )
        for i, u in enumerate(card_uuids(node, count))
    )


async def make_node(
    kube: kclient.KubeClient,
    name: str,
    *,
    model: str = DEFAULT_MODEL,
    count: int = 8,
    memory_mib: int = 81920,
    split_count: int = 10,
    cores: int = devices.FULL_CORES,
    numa: Sequence[int] | None = None,
    numa_nodes: int = 1,
    cpu: str = "96",
    memory: str = "384Gi",
    max_pods: str = "110",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> objects.Node:
    """Create a fake GPU node: registration annotation, labels, capacity through ``/status``.

    ``nvidia.com/gpu`` capacity is cards x split count, as HAMi's device plugin advertises it.
    Extra ``annotations`` override the generated ones (e.g. a malformed registration).
    """
    registered = cards(
        name,
        model=model,
        count=count,
        memory_mib=memory_mib,
        split_count=split_count,
        cores=cores,
        numa=numa,
        numa_nodes=numa_nodes,
    )
    meta = {
        "name": name,
        "labels": {**GPU_LABEL, **(labels or {})},
        "annotations": {keys.NODE_REGISTER: registrations.encode_json(registered), **(annotations or {})},
    }
    await kube.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": meta})
    resources = {"cpu": cpu, "memory": memory, "pods": max_pods, "nvidia.com/gpu": str(count * split_count)}
    resp = await kube.request(
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        body={"status": {"capacity": resources, "allocatable": resources}},
        content_type=kclient.MERGE_PATCH,
    )
    return objects.decode_node(resp.content)


def blank_entries(value: str) -> str:
    """``vgpu-devices-to-allocate`` after every container got its devices: entries kept, emptied."""
    return ";" * value.count(";")


class NodeSim:
    """Plays the device plugin and the kubelet for bound pods.

    Args:
        kube: the API client.
        nodes: node names served; None serves every node.
        clock: wall clock for the pod's start time.
        fail: pods for which ``Allocate`` fails (None: it always succeeds).
    """

    def __init__(
        self,
        kube: kclient.KubeClient,
        nodes: Iterable[str] | None = None,
        clock: Callable[[], float] = time.time,
        fail: Callable[[objects.Pod], bool] | None = None,
    ):
        self.kube = kube
        self.fail = fail
        self.nodes = None if nodes is None else frozenset(nodes)
        self._clock = clock
        self._queue: asyncio.Queue[objects.Pod] = asyncio.Queue()
        self.informer = informer.Informer(kube, kinds.PODS, self._on_event, field_selector="spec.nodeName!=")
        self.completed: list[str] = []
        """Keys of pods whose handshake finished, in order."""
        self.failed: list[str] = []
        """Keys of pods whose ``Allocate`` was made to fail, in order."""
        self.skipped = 0
        """Times a pod was not served because the lock named another pod."""

    def serves(self, node: str) -> bool:
        """True when this simulator plays the given node."""
        return bool(node) and (self.nodes is None or node in self.nodes)

    def _on_event(self, event: informer.Event[objects.Pod]) -> None:
        pod = event.obj
        if event.type in (informer.EventType.ADDED, informer.EventType.MODIFIED) and pod is not None:
            if self.serves(pod.spec.node_name) and pod.metadata.annotations.get(keys.BIND_PHASE) == (
                keys.BIND_PHASE_ALLOCATING
            ):
                self._queue.put_nowait(pod)

    async def allocate(self, pod: objects.Pod) -> bool:
        """Finish the handshake for one bound pod; False when it is not this pod's turn."""
        meta = pod.metadata
        node = pod.spec.node_name
        current = await pods.get(self.kube, meta.namespace, meta.name)
        if current.metadata.uid != meta.uid or current.metadata.annotations.get(keys.BIND_PHASE) != (
            keys.BIND_PHASE_ALLOCATING
        ):
            return False
        lock = (await locks.read_node(self.kube, node)).metadata.annotations.get(keys.NODE_LOCK)
        if lock is None or not lockcodec.is_owner(lock, meta.namespace, meta.name):
            self.skipped += 1
            log.info("nodesim: %s on %s: the node lock names %r, not this pod", pod.key, node, lock)
            return False
        started = dt.datetime.fromtimestamp(self._clock(), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if self.fail is not None and self.fail(current):
            await self._reject(current, node, started)
            return True
        to_allocate = current.metadata.annotations.get(keys.DEVICES_TO_ALLOCATE, "")
        await pods.patch_annotations(
            self.kube,
            meta.namespace,
            meta.name,
            {keys.DEVICES_TO_ALLOCATE: blank_entries(to_allocate), keys.BIND_PHASE: keys.BIND_PHASE_SUCCESS},
        )
        await locks.release(self.kube, node, meta.namespace, meta.name)
        await pods.patch_status(
            self.kube,
            meta.namespace,
            meta.name,
            {
                "phase": "Running",
                "startTime": started,
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": started}],
            },
        )
        self.completed.append(pod.key)
        return True

    async def _reject(self, pod: objects.Pod, node: str, now: str) -> None:
        meta = pod.metadata
        await pods.patch_annotations(
            self.kube, meta.namespace, meta.name, {keys.BIND_PHASE: keys.BIND_PHASE_FAILED}
        )
        await locks.release(self.kube, node, meta.namespace, meta.name)
        await pods.patch_status(
            self.kube,
            meta.namespace,
            meta.name,
            {
                "phase": "Failed",
                "reason": "UnexpectedAdmissionError",
                "message": f"Allocate failed due to no binding pod found on node {node} (nodesim)",
                "startTime": now,
            },
        )
        self.failed.append(pod.key)

    async def _work(self) -> None:
        while True:
            pod = await self._queue.get()
            try:
                await self.allocate(pod)
            except errors.NotFound:
                pass  # deleted meanwhile
            except errors.ApiError as exc:
                log.warning("nodesim: %s: %s", pod.key, exc)

    async def run(self) -> None:
        """Watch and serve until cancelled."""
        worker = asyncio.create_task(self._work())
        try:
            await self.informer.run()
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
