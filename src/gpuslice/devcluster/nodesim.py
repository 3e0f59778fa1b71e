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
        workers: handshake queues; each node always goes to the same one, so handshakes on
            different nodes run concurrently (as real nodes each run their own device plugin)
            while one pod watch and one node watch serve them all.
    """

    def __init__(
        self,
        kube: kclient.KubeClient,
        nodes: Iterable[str] | None = None,
        clock: Callable[[], float] = time.time,
        fail: Callable[[objects.Pod], bool] | None = None,
        workers: int = 1,
    ):
        self.kube = kube
        self.fail = fail
        self.nodes = None if nodes is None else frozenset(nodes)
        self._clock = clock
        self._queues: list[asyncio.Queue[objects.Pod]] = [asyncio.Queue() for _ in range(max(1, workers))]
        self._queue_of: dict[str, asyncio.Queue[objects.Pod]] = {}
        self.informer = informer.Informer(kube, kinds.PODS, self._on_event, field_selector="spec.nodeName!=")
        self.node_informer = informer.Informer(kube, kinds.NODES, self._on_node)
        """Nodes as watched: the lock owner is usually known without a read (one GET less per pod)."""
        self._nodes: dict[str, objects.Node] = {}
        self.completed: list[str] = []
        """Keys of pods whose handshake finished, in order."""
        self.failed: list[str] = []
        """Keys of pods whose ``Allocate`` was made to fail, in order."""
        self.skipped = 0
        """Times a pod was not served because the lock named another pod."""
        self.on_bound: Callable[[objects.Pod], None] | None = None
        """Called with every pod the pod watch shows on a served node (e.g. to time binds)."""
        self._served: set[str] = set()
        """UIDs whose handshake this simulator finished (repeated watch events are ignored)."""

    def serves(self, node: str) -> bool:
        """True when this simulator plays the given node."""
        return bool(node) and (self.nodes is None or node in self.nodes)

    def _queue(self, node: str) -> asyncio.Queue[objects.Pod]:
        queue = self._queue_of.get(node)
        if queue is None:  # round robin in order of first use
            queue = self._queue_of[node] = self._queues[len(self._queue_of) % len(self._queues)]
        return queue

    def _on_node(self, event: informer.Event[objects.Node]) -> None:
        node = event.obj
        if node is None or not self.serves(node.metadata.name):
            return
        if event.type is informer.EventType.DELETED:
            self._nodes.pop(node.metadata.name, None)
        else:
            self._nodes[node.metadata.name] = node

    async def _locked_node(self, node: str, namespace: str, name: str) -> tuple[objects.Node, str | None]:
        """The node and its lock value: from the watch when it already names the pod, else read."""
        watched = self._nodes.get(node)
        if watched is not None:
            lock = watched.metadata.annotations.get(keys.NODE_LOCK)
            if lock is not None and lockcodec.is_owner(lock, namespace, name):
                return watched, lock
        current = await locks.read_node(self.kube, node)  # the watch may lag the lock write
        return current, current.metadata.annotations.get(keys.NODE_LOCK)

    def _on_event(self, event: informer.Event[objects.Pod]) -> None:
        pod = event.obj
        if event.type in (informer.EventType.ADDED, informer.EventType.MODIFIED) and pod is not None:
            if self.on_bound is not None and self.serves(pod.spec.node_name):
                self.on_bound(pod)
            if self.serves(pod.spec.node_name) and pod.metadata.annotations.get(keys.BIND_PHASE) == (
                keys.BIND_PHASE_ALLOCATING
            ):
                self._queue(pod.spec.node_name).put_nowait(pod)

    async def allocate(self, pod: objects.Pod) -> bool:
        """Finish the handshake for one bound pod; False when it is not this pod's turn.

        Usually three API calls per pod: patch the pod's annotations, release the lock, patch the
        pod's status. The node lock must name the pod: the watched node is trusted when it does
        (only the owner removes its lock), else the node is read. The pod is the watched object; the
        annotation patch is a compare-and-swap on its resourceVersion (and UID), so a pod that
        moved on since is read again and re-checked, and a recreated pod is never served. The lock
        release is a compare-and-swap on the node as read, falling back to the owner-checked
        ``locks.release`` when the node changed meanwhile.
        """
        meta = pod.metadata
        node = pod.spec.node_name
        if meta.uid in self._served or meta.annotations.get(keys.BIND_PHASE) != keys.BIND_PHASE_ALLOCATING:
            return False
        current, lock = await self._locked_node(node, meta.namespace, meta.name)
        if lock is None or not lockcodec.is_owner(lock, meta.namespace, meta.name):
            self.skipped += 1
            log.info("nodesim: %s on %s: the node lock names %r, not this pod", pod.key, node, lock)
            return False
        started = dt.datetime.fromtimestamp(self._clock(), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if self.fail is not None and self.fail(pod):
            phase = {keys.BIND_PHASE: keys.BIND_PHASE_FAILED}
        else:
            to_allocate = meta.annotations.get(keys.DEVICES_TO_ALLOCATE, "")
            phase = {
                keys.DEVICES_TO_ALLOCATE: blank_entries(to_allocate),
                keys.BIND_PHASE: keys.BIND_PHASE_SUCCESS,
            }
        try:
            await pods.patch_annotations(
                self.kube,
                meta.namespace,
                meta.name,
                phase,
                resource_version=meta.resource_version,
                uid=meta.uid,
            )
        except errors.Conflict:
            fresh = await pods.get(self.kube, meta.namespace, meta.name)
            if fresh.metadata.uid != meta.uid:
                return False
            return await self.allocate(fresh)  # re-checked against the current pod and node
        self._served.add(meta.uid)
        await self._release(current, node, meta.namespace, meta.name)
        if phase[keys.BIND_PHASE] == keys.BIND_PHASE_FAILED:
            await self._mark_failed(pod, node, started)
            return True
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

    async def _release(self, read: objects.Node, node: str, namespace: str, name: str) -> None:
        """Remove the lock this pod holds: CAS on the node as read, else the owner-checked release."""
        body = {
            "metadata": {
                "annotations": {keys.NODE_LOCK: None},
                "resourceVersion": read.metadata.resource_version,
            }
        }
        try:
            await self.kube.request(
                "PATCH", locks.node_path(node), body=body, content_type=kclient.MERGE_PATCH
            )
        except errors.Conflict:
            await locks.release(self.kube, node, namespace, name)

    async def _mark_failed(self, pod: objects.Pod, node: str, now: str) -> None:
        meta = pod.metadata
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

    async def _work(self, queue: asyncio.Queue[objects.Pod]) -> None:
        while True:
            pod = await queue.get()
            try:
                await self.allocate(pod)
            except errors.NotFound:
                pass  # deleted meanwhile
            except errors.ApiError as exc:
                log.warning("nodesim: %s: %s", pod.key, exc)

    async def run(self) -> None:
        """Watch and serve until cancelled."""
        tasks = [asyncio.create_task(self._work(q)) for q in self._queues]
        tasks.append(asyncio.create_task(self.node_informer.run()))
        try:
            await self.informer.run()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
