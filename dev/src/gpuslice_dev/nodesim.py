"""Fake GPU nodes, and a stand-in for HAMi's device plugin and the kubelet on them.

``make_node`` creates a Node object with HAMi's registration annotation and a capacity set
through ``/status`` (control-plane.md section 5). ``NodeSim`` watches pods bound to the nodes it
serves and, for each pod in ``hami.io/bind-phase: allocating``, does what the device plugin's
``Allocate`` and the kubelet would (docs/hami-compat.md section 8):

1. serve only the pod the node lock names (HAMi PR #3095); anything else waits;
2. blank every container entry of ``hami.io/vgpu-devices-to-allocate`` (``a:;b:;`` -> ``;;``)
   and set ``hami.io/bind-phase: success``; a pod holding MIG instances
   (``hami.io/vgpu-mig-allocations``) gets every record's ``migUUID``, ``gpuInstanceID`` and
   ``computeInstanceID`` in the same patch (HAMi's ``annotateMigRuntimeInfo``, ``migsim``); a
   value that does not decode fails the ``Allocate``, as in HAMi;
3. release the node lock (owner-checked, compare-and-swap);
4. mark the pod Running through ``pods/status``.

Like the kubelet, it also finishes the deletion of pods on its nodes that carry a
``deletionTimestamp`` (an eviction or a graceful delete): once their containers would have
stopped, it deletes them with ``gracePeriodSeconds: 0`` (UID precondition), so evicted pods go
away as on a real node.

A ``fail`` predicate plays a failed ``Allocate``: ``bind-phase: failed``, lock released, and the
pod Failed with reason ``UnexpectedAdmissionError``, as the kubelet rejects it.

Like HAMi's device plugin up to v2.7, every ``report_period_s`` it writes the node handshake
``hami.io/node-handshake: Reported <Go time.Now().String()>`` on each node it serves (the real
plugin also re-writes the registration then; the simulator leaves it alone, so a test can corrupt
it). A failed API call is retried after a short pause, so an apiserver outage delays handshakes
but loses none; a pod whose annotations were cleared or that was deleted meanwhile is dropped.

Per-node faults, driven by tests: ``stop_node`` (the device plugin died: no reports, no
``Allocate``, and, as kubelet does when the plugin's socket goes away, allocatable
``nvidia.com/gpu`` set to 0), ``mute_node`` (the plugin hangs: no reports, no ``Allocate``, while
kubelet keeps advertising the GPUs) and ``start_node`` (back to normal: allocatable restored, a
report at once, and pending ``allocating`` pods served when the node lock names them).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import msgspec

from gpuslice.codec import errors as codec_errors
from gpuslice.codec import handshake, keys, node_inventory, registrations
from gpuslice.codec import locks as lockcodec
from gpuslice.kube import client as kclient
from gpuslice.kube import errors, informer, kinds, locks, objects, pods
from gpuslice.model import devices, mig
from gpuslice_dev import migsim

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
    mig_cards: Collection[int] = (),
    mig_profiles: Sequence[mig.Profile] = migsim.A100_40GB,
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
        mig_cards: indexes of the cards in MIG mode (``migsim.mig_card``: ``mig_profiles``,
            100 cores, count = the largest instance count); the others are ``hami-core``.
        mig_profiles: the GPU-instance profiles of the MIG cards.
    """
    layout = list(numa) if numa is not None else [i * numa_nodes // max(1, count) for i in range(count)]
    out = tuple(
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
    return tuple(migsim.mig_card(c, mig_profiles) if c.index in mig_cards else c for c in out)


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
    taints: Sequence[Mapping[str, str]] = (),
    mig_cards: Collection[int] = (),
    mig_profiles: Sequence[mig.Profile] = migsim.A100_40GB,
) -> objects.Node:
    """Create a fake GPU node: registration annotation, labels, capacity through ``/status``.

    ``nvidia.com/gpu`` capacity is the sum of the cards' counts (cards x split count without MIG
    cards), as HAMi's device plugin advertises it. ``mig_cards`` and ``mig_profiles``: see ``cards``.
    Extra ``annotations`` override the generated ones (e.g. a malformed registration). ``taints``
    (``{"key", "value", "effect"}``) are set when the node is created, so no pod without the
    matching toleration lands on it (a test's own node in a shared cluster).
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
        mig_cards=mig_cards,
        mig_profiles=mig_profiles,
    )
    meta = {
        "name": name,
        "labels": {**GPU_LABEL, **(labels or {})},
        "annotations": {keys.NODE_REGISTER: registrations.encode_json(registered), **(annotations or {})},
    }
    body: dict[str, object] = {"apiVersion": "v1", "kind": "Node", "metadata": meta}
    if taints:
        body["spec"] = {"taints": [dict(t) for t in taints]}
    await kube.request("POST", "/api/v1/nodes", body=body)
    resources = {
        "cpu": cpu,
        "memory": memory,
        "pods": max_pods,
        "nvidia.com/gpu": str(sum(c.split_count for c in registered)),
    }
    resp = await kube.request(
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        body={"status": {"capacity": resources, "allocatable": resources}},
        content_type=kclient.MERGE_PATCH,
    )
    return objects.decode_node(resp.content)


def go_time_string(wall_ns: int, monotonic_ns: int | None = None) -> str:
    """Go's ``time.Now().String()`` in UTC, as HAMi's device plugin puts it in its handshake.

    ``2026-12-01 15:04:05.123456789 +0000 UTC m=+12.300000000``: the fraction with trailing zeros
    trimmed (none at all for a whole second), then the monotonic reading in seconds with nine
    decimals.

    Args:
        wall_ns: Unix time in nanoseconds.
        monotonic_ns: nanoseconds since the process started; no ``m=`` part when None.
    """
    seconds, nanos = divmod(wall_ns, 1_000_000_000)
    text = dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    if nanos:
        text += "." + f"{nanos:09d}".rstrip("0")
    text += " +0000 UTC"
    if monotonic_ns is not None:
        sign = "-" if monotonic_ns < 0 else "+"
        whole, frac = divmod(abs(monotonic_ns), 1_000_000_000)
        text += f" m={sign}{whole}.{frac:09d}"
    return text


def reported_value(wall_ns: int, monotonic_ns: int | None = None) -> str:
    """The handshake value HAMi's device plugin (<= v2.7) writes: ``Reported <Go time>``."""
    return f"{handshake.REPORTED} {go_time_string(wall_ns, monotonic_ns)}"


def mig_runtime(pod: objects.Pod, node: objects.Node) -> str | None:
    """The pod's ``hami.io/vgpu-mig-allocations`` with every instance's runtime identity, or None.

    None when the pod holds no MIG instance or every record already has its identity. The card's
    memory slices come from the node's registration (8 when it does not decode or lacks the card).

    Raises:
        codec.errors.DecodeError: the pod's value does not decode.
    """
    value = pod.metadata.annotations.get(keys.MIG_ALLOCATIONS, "")
    if not value:
        return None
    try:
        registered = node_inventory.decode_node(node.metadata.name, node.metadata.annotations).devices
    except codec_errors.DecodeError:
        registered = ()
    slices = migsim.card_slices(registered)
    return migsim.realised_value(value, lambda u: slices.get(u, migsim.A100_40GB_SLICES))


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
        report_period_s: period of the ``Reported`` handshake on each served node (HAMi: 30 s;
            0 = never).
        retry_s: pause before a handshake is retried after a failed API call.
    """

    def __init__(
        self,
        kube: kclient.KubeClient,
        nodes: Iterable[str] | None = None,
        clock: Callable[[], float] = time.time,
        fail: Callable[[objects.Pod], bool] | None = None,
        workers: int = 1,
        report_period_s: float = 30.0,
        retry_s: float = 0.5,
    ):
        self.kube = kube
        self.fail = fail
        self.nodes = None if nodes is None else frozenset(nodes)
        self.report_period_s = report_period_s
        self.retry_s = retry_s
        self._clock = clock
        self._started_ns = time.monotonic_ns()
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
        self.retries = 0
        """Handshakes retried after a failed API call."""
        self.reports = 0
        """``Reported`` handshakes written."""
        self.on_bound: Callable[[objects.Pod], None] | None = None
        """Called with every pod the pod watch shows on a served node (e.g. to time binds)."""
        self.stopped: set[str] = set()
        """Nodes whose device plugin is gone (``stop_node``)."""
        self.muted: set[str] = set()
        """Nodes whose device plugin never answers (``mute_node``)."""
        self._served: set[str] = set()
        """UIDs whose handshake this simulator finished (repeated watch events are ignored)."""
        self._answered: dict[str, bool] = {}
        """UID -> failed?, for pods whose annotations were answered but lock or status are pending."""
        self._attempts: dict[str, int] = {}
        self._deferred: dict[str, dict[str, objects.Pod]] = {}
        """Node -> UID -> allocating pods that arrived while the node's plugin was stopped or muted."""
        self.finished: list[str] = []
        """Keys of terminating pods whose deletion this simulator finished (as the kubelet), in order."""
        self._finishing: dict[str, asyncio.Task[None]] = {}

    def serves(self, node: str) -> bool:
        """True when this simulator plays the given node."""
        return bool(node) and (self.nodes is None or node in self.nodes)

    def answering(self, node: str) -> bool:
        """True when the node's device plugin answers (neither stopped nor muted)."""
        return node not in self.stopped and node not in self.muted

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
        if event.type is informer.EventType.DELETED and pod is not None:
            for pending in self._deferred.values():
                pending.pop(pod.metadata.uid, None)
            return
        if event.type in (informer.EventType.ADDED, informer.EventType.MODIFIED) and pod is not None:
            if pod.metadata.deletion_timestamp and self.serves(pod.spec.node_name):
                self._finish_deletion(pod)
                return
            if self.on_bound is not None and self.serves(pod.spec.node_name):
                self.on_bound(pod)
            if self.serves(pod.spec.node_name) and pod.metadata.annotations.get(keys.BIND_PHASE) == (
                keys.BIND_PHASE_ALLOCATING
            ):
                self._submit(pod)

    def _finish_deletion(self, pod: objects.Pod) -> None:
        """Delete a terminating pod for good, once (the kubelet's part of a graceful deletion)."""
        uid = pod.metadata.uid
        if uid in self._finishing:
            return
        task = asyncio.get_running_loop().create_task(self._delete_now(pod), name=f"nodesim-delete-{pod.key}")
        self._finishing[uid] = task
        task.add_done_callback(lambda _: self._finishing.pop(uid, None))

    async def _delete_now(self, pod: objects.Pod) -> None:
        path = f"/api/v1/namespaces/{pod.metadata.namespace}/pods/{pod.metadata.name}"
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": pod.metadata.uid}}
        for attempt in range(5):
            try:
                await self.kube.request("DELETE", path, body=body)
            except (errors.NotFound, errors.Conflict):
                return  # gone already, or another pod now holds the name
            except errors.ApiError as exc:
                log.warning("nodesim: finishing the deletion of %s: %s; retrying", pod.key, exc)
                await asyncio.sleep(self.retry_s * (attempt + 1))
                continue
            self.finished.append(pod.key)
            return

    def _submit(self, pod: objects.Pod) -> None:
        """Queue a pod for its node's worker, or keep it aside while the node's plugin is down."""
        node = pod.spec.node_name
        if self.answering(node):
            self._queue(node).put_nowait(pod)
        else:
            self._deferred.setdefault(node, {})[pod.metadata.uid] = pod

    async def allocate(self, pod: objects.Pod) -> bool:
        """Finish the handshake for one bound pod; False when it is not this pod's turn.

        Usually three API calls per pod: patch the pod's annotations, release the lock, patch the
        pod's status. The node lock must name the pod: the watched node is trusted when it does
        (only the owner removes its lock), else the node is read. The pod is the watched object; the
        annotation patch is a compare-and-swap on its resourceVersion (and UID), so a pod that
        moved on since (its annotations cleared, say) is read again and re-checked, and a recreated
        pod is never served. The lock release is a compare-and-swap on the node as read, falling
        back to the owner-checked ``locks.release`` when the node changed meanwhile. When a call
        fails after the annotations were answered, calling again resumes with the lock release.

        Raises:
            errors.ApiError: an API call failed (the caller may call again with the same pod).
        """
        meta = pod.metadata
        node = pod.spec.node_name
        if meta.uid in self._served:
            return False
        if not self.answering(node):
            self._deferred.setdefault(node, {})[meta.uid] = pod
            return False
        started = dt.datetime.fromtimestamp(self._clock(), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        answered = self._answered.get(meta.uid)
        if answered is not None:  # annotations answered before a failed call: finish the rest
            await locks.release(self.kube, node, meta.namespace, meta.name)
            await self._finish(pod, node, answered, started)
            return True
        if meta.annotations.get(keys.BIND_PHASE) != keys.BIND_PHASE_ALLOCATING:
            return False
        current, lock = await self._locked_node(node, meta.namespace, meta.name)
        if lock is None or not lockcodec.is_owner(lock, meta.namespace, meta.name):
            self.skipped += 1
            log.info("nodesim: %s on %s: the node lock names %r, not this pod", pod.key, node, lock)
            return False
        failed = self.fail is not None and self.fail(pod)
        realised: str | None = None
        if not failed:
            try:
                realised = mig_runtime(pod, current)
            except codec_errors.DecodeError as exc:
                log.warning("nodesim: %s: %s; Allocate fails", pod.key, exc)
                failed = True
        if failed:
            phase = {keys.BIND_PHASE: keys.BIND_PHASE_FAILED}
        else:
            to_allocate = meta.annotations.get(keys.DEVICES_TO_ALLOCATE, "")
            phase = {
                keys.DEVICES_TO_ALLOCATE: blank_entries(to_allocate),
                keys.BIND_PHASE: keys.BIND_PHASE_SUCCESS,
            }
            if realised is not None:
                phase[keys.MIG_ALLOCATIONS] = realised
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
        self._answered[meta.uid] = failed
        await self._release(current, node, meta.namespace, meta.name)
        await self._finish(pod, node, failed, started)
        return True

    async def _finish(self, pod: objects.Pod, node: str, failed: bool, started: str) -> None:
        """The kubelet's part: the pod Running (or Failed, after a failed ``Allocate``)."""
        meta = pod.metadata
        if failed:
            await self._mark_failed(pod, node, started)
        else:
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
        self._served.add(meta.uid)
        self._answered.pop(meta.uid, None)

    async def _release(self, read: objects.Node, node: str, namespace: str, name: str) -> None:
        """Remove the lock this pod holds: CAS on the node as read, else the owner-checked release."""
        if not await locks.clear_as_read(self.kube, node, read.metadata.resource_version):
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

    def _retry_later(self, pod: objects.Pod, queue: asyncio.Queue[objects.Pod]) -> None:
        self.retries += 1
        attempt = self._attempts[pod.metadata.uid] = self._attempts.get(pod.metadata.uid, 0) + 1
        delay = min(self.retry_s * attempt, 5.0)
        asyncio.get_running_loop().call_later(delay, queue.put_nowait, pod)

    async def _work(self, queue: asyncio.Queue[objects.Pod]) -> None:
        while True:
            pod = await queue.get()
            try:
                await self.allocate(pod)
            except errors.NotFound:
                self._answered.pop(pod.metadata.uid, None)  # deleted meanwhile
            except errors.ApiError as exc:
                if isinstance(exc, errors.PermanentError) and self._attempts.get(pod.metadata.uid, 0) >= 5:
                    log.warning("nodesim: %s: %s; giving up", pod.key, exc)
                    continue
                log.warning("nodesim: %s: %s; retrying", pod.key, exc)
                self._retry_later(pod, queue)
            except Exception:  # noqa: BLE001 - a simulator bug must not stop every later handshake
                log.exception("nodesim: %s: handshake failed", pod.key)
                if self._attempts.get(pod.metadata.uid, 0) < 5:
                    self._retry_later(pod, queue)
            else:
                self._attempts.pop(pod.metadata.uid, None)

    # ----- the handshake annotation and per-node faults

    def _report_targets(self) -> list[str]:
        """Served nodes whose plugin answers (every watched GPU node when ``nodes`` is None)."""
        if self.nodes is not None:
            names: Iterable[str] = self.nodes
        else:
            names = [n for n, obj in self._nodes.items() if keys.NODE_REGISTER in obj.metadata.annotations]
        return sorted(n for n in names if self.answering(n))

    async def report(self, node: str) -> None:
        """Write ``hami.io/node-handshake: Reported <Go time>`` on one node, as the plugin does."""
        value = reported_value(time.time_ns(), time.monotonic_ns() - self._started_ns)
        await self.kube.request(
            "PATCH",
            locks.node_path(node),
            body={"metadata": {"annotations": {keys.NODE_HANDSHAKE: value}}},
            content_type=kclient.MERGE_PATCH,
        )
        self.reports += 1

    async def _report_loop(self) -> None:
        if self.report_period_s <= 0:
            return
        while True:
            for node in self._report_targets():
                try:
                    await self.report(node)
                except errors.NotFound:
                    pass
                except errors.ApiError as exc:
                    log.warning("nodesim: handshake report on %s: %s", node, exc)
            await asyncio.sleep(self.report_period_s)

    async def _set_allocatable(self, node: str, value: str | None) -> None:
        """Patch allocatable ``nvidia.com/gpu`` through ``/status``; None = restore the capacity."""
        if value is None:
            current = await locks.read_node(self.kube, node)
            value = current.status.capacity.get(handshake.GPU_RESOURCE, "0")
        await self.kube.request(
            "PATCH",
            f"/api/v1/nodes/{node}/status",
            body={"status": {"allocatable": {handshake.GPU_RESOURCE: value}}},
            content_type=kclient.MERGE_PATCH,
        )

    async def stop_node(self, node: str) -> None:
        """The node's device plugin dies: no reports, no ``Allocate``, allocatable GPUs 0."""
        self.muted.discard(node)
        self.stopped.add(node)
        await self._set_allocatable(node, "0")

    async def mute_node(self, node: str) -> None:
        """The node's device plugin hangs: no reports, no ``Allocate``; kubelet still advertises GPUs."""
        was_stopped = node in self.stopped
        self.stopped.discard(node)
        self.muted.add(node)
        if was_stopped:
            await self._set_allocatable(node, None)

    async def start_node(self, node: str) -> None:
        """The node's device plugin is back: allocatable restored, a report, pending pods served."""
        self.stopped.discard(node)
        self.muted.discard(node)
        await self._set_allocatable(node, None)
        if self.report_period_s > 0:
            await self.report(node)
        pending = self._deferred.pop(node, {})
        listed = await self.kube.request(
            "GET", "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"}
        )
        for pod in msgspec.json.decode(listed.content, type=objects.ObjectList[objects.Pod]).items:
            if pod.metadata.annotations.get(keys.BIND_PHASE) == keys.BIND_PHASE_ALLOCATING:
                pending[pod.metadata.uid] = pod
        for pod in pending.values():
            self._submit(pod)

    async def run(self) -> None:
        """Watch and serve until cancelled."""
        tasks = [asyncio.create_task(self._work(q)) for q in self._queues]
        tasks.append(asyncio.create_task(self.node_informer.run()))
        tasks.append(asyncio.create_task(self._report_loop()))
        try:
            await self.informer.run()
        finally:
            tasks.extend(self._finishing.values())
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
