"""The API of the bind path faked in memory, and helpers around the real ``ClusterCache``.

The extender tests run on the real ``gpuslice.cache.cache.ClusterCache``: it refuses an assumption
that no longer fits, exactly as in production, so no test can pass on capacity that does not
exist. Only the API is faked: ``FakeBinder`` records every call and injects the failures a real
apiserver cannot produce on demand (definite 4xx; ambiguous timeouts whose write may have landed).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuslice.cache import cache as caches
from gpuslice.cache import shapes
from gpuslice.codec import keys, pod_devices
from gpuslice.extender import config, metrics
from gpuslice.extender.binding import bind as binds
from gpuslice.extender.binding import binder as binders
from gpuslice.extender.binding import failpoints
from gpuslice.extender.http import app as apps
from gpuslice.framework import logs, nominations, profile, view
from gpuslice.kube import objects
from gpuslice.model import allocations, nodes
from tests.unit import builders

CLOCK = 1_700_000_000.0
"""The wall clock of ``make_deps`` flows (bind annotations carry it)."""


# ----------------------------------------------------------------------------- the cache


def cluster_cache(
    *registered: nodes.NodeInventory | nodes.NodeState | builders.NodeBuilder,
    histogram: shapes.ShapeHistogram | None = None,
    nominator: caches.Nominations | None = None,
) -> caches.ClusterCache:
    """A real cache with these nodes registered (``upsert_node``), on ``nominator`` (a new one by default).

    A ``NodeState`` or builder must show no usage: usage comes from pods (``charge``), never from
    a state the cache would not have computed itself.
    """
    cache = caches.ClusterCache(
        histogram, nominator=nominations.Nominator() if nominator is None else nominator
    )
    for item in registered:
        if isinstance(item, builders.NodeBuilder):
            item = item.state()
        if isinstance(item, nodes.NodeState):
            if any(u != nodes.EMPTY_CARD for u in item.usage) or item.cpu_used_milli or item.memory_used_mib:
                raise ValueError(f"node {item.name}: charge usage with pods, not with the state")
            item = item.inventory
        cache.upsert_node(item)
    return cache


def charge(
    cache: caches.ClusterCache,
    key: str,
    node_name: str,
    *grants: tuple[int, int, int],
    uid: str | None = None,
) -> allocations.PodAllocation:
    """Charge a pod that already runs (as the pod watch would): one container, ``(card, MiB, cores)``."""
    alloc = builders.alloc(node_name, tuple((builders.uuid(node_name, i), m, c) for i, m, c in grants))
    cache.add_pod(key, uid or f"uid-{key.replace('/', '-')}", alloc)
    return alloc


def usage(cache: caches.ClusterCache, node_name: str) -> list[tuple[int, int, int]]:
    """Per card of the node: (slots, MiB, cores) as the cache's snapshot shows them."""
    state = cache.snapshot().nodes[node_name]
    return [(u.slots, u.memory_mib, u.cores) for u in state.usage]


def overcommitted(cache: caches.ClusterCache) -> list[str]:
    """Cards whose charged usage exceeds their memory, cores or slots in the cache's snapshot."""
    bad = []
    for state in cache.snapshot().nodes.values():
        for i, dev in enumerate(state.inventory.devices):
            u = state.usage[i]
            if u.memory_mib > dev.memory_mib or u.cores > dev.cores or u.slots > dev.split_count:
                bad.append(dev.uuid)
    return bad


def claim(
    name: str, alloc: allocations.PodAllocation, namespace: str = "other", bound: bool = True
) -> objects.Pod:
    """A pod of another writer claiming ``alloc`` (label, device annotations; bound or not)."""
    return objects.Pod(
        metadata=objects.ObjectMeta(
            name=name,
            namespace=namespace,
            uid=f"uid-{namespace}-{name}",
            labels={keys.VGPU_NODE: alloc.node},
            annotations=pod_devices.bind_annotations(alloc, CLOCK),
        ),
        spec=objects.PodSpec(
            node_name=alloc.node if bound else "",
            containers=[objects.Container(name=f"c{i}") for i in range(len(alloc.containers))],
        ),
    )


def claimed_allocation(pod: objects.Pod) -> allocations.PodAllocation:
    """The allocation a claimed pod's device annotations name."""
    init = len(pod.spec.init_containers)
    alloc = pod_devices.allocation_from_annotations(
        pod.metadata.annotations, init_count=init, container_count=init + len(pod.spec.containers)
    )
    if alloc is None:
        raise ValueError(f"pod {pod.key} claims no devices")
    return alloc


# ----------------------------------------------------------------------------- the API


@dataclasses.dataclass
class Fault:
    """A failure ``FakeBinder`` raises for an operation.

    Attributes:
        message: the failure's text.
        ambiguous: a timeout / lost reply / 5xx (``BindFailure.ambiguous``) instead of a 4xx.
        times: how many calls fail; None for every call.
        applied: (ambiguous only) the write landed before the reply was lost.
        reason: ``BindFailure.reason``.
    """

    message: str = "injected"
    ambiguous: bool = False
    times: int | None = None
    applied: bool = False
    reason: str = "Injected"

    def error(self, op: str) -> binders.BindFailure:
        return binders.BindFailure(op, self.message, self.reason, ambiguous=self.ambiguous)


class FakeBinder:
    """The ``Binder`` protocol in memory.

    Records calls in ``calls``; ``fail`` maps an operation (``read``, ``lock``, ``unlock``,
    ``bind``, ``label``, ``claimed``, ``touch``) to a failure for every pod (a plain string is a definite
    failure on every call), ``fail_pod`` maps ``(operation, "ns/name")`` to a failure for one pod.
    ``delay`` (or, when set, ``delays`` taken in turn) yields to other tasks in every call.
    ``pods`` are the pod objects ``read_pod`` returns (a Binding sets their ``nodeName`` and
    merges its annotations, in one step, as the apiserver does); ``claimed`` are other writers'
    pods ``claimed_pods`` lists with the pods bound here.
    """

    def __init__(self, pods: Mapping[str, dict[str, Any]] | None = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.fail: dict[str, str | Fault] = {}
        self.fail_pod: dict[tuple[str, str], Fault] = {}
        self.delay = 0.0
        self.delays: list[float] = []
        self._delay_at = itertools.count()
        self.pods: dict[str, dict[str, Any]] = {k: copy.deepcopy(v) for k, v in (pods or {}).items()}
        self.annotations: dict[str, dict[str, str]] = {}
        self.uids: dict[str, str] = {}
        self.locks: dict[str, str] = {}
        self.bound: dict[str, str] = {}
        self.labels: dict[str, str] = {}
        """Pod key -> the ``hami.io/vgpu-node`` label ``label`` set."""
        self.claimed: list[objects.Pod] = []
        self.timeouts: list[tuple[str, float | None]] = []
        self.plugin_releases_lock = False
        self.on_release: Callable[[str, bool], None] | None = None
        self.touched: list[tuple[str, dict[str, str]]] = []
        self.version = 100

    # ----- fault injection

    def _fault(self, op: str, key: str) -> Fault | None:
        fault = self.fail_pod.get((op, key))
        where: dict[Any, Any] = self.fail_pod
        where_key: Any = (op, key)
        if fault is None:
            found = self.fail.get(op)
            fault = Fault(found) if isinstance(found, str) else found
            where, where_key = self.fail, op
        if fault is None:
            return None
        if fault.times is not None:
            fault.times -= 1
            if fault.times <= 0:
                del where[where_key]
        return fault

    async def _step(self, op: str, key: str, *args: str) -> Fault | None:
        """Record the call, yield, then fail; an applied ambiguous failure is returned instead (the
        caller writes, then raises it with ``_landed``)."""
        self.calls.append((op, *args))
        delay = self.delays[next(self._delay_at) % len(self.delays)] if self.delays else self.delay
        if delay:
            await asyncio.sleep(delay)
        fault = self._fault(op, key)
        if fault is not None and not (fault.ambiguous and fault.applied):
            raise fault.error(op)
        return fault

    @staticmethod
    def _landed(op: str, fault: Fault | None) -> None:
        if fault is not None:
            raise fault.error(op)

    # ----- the protocol

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        key = f"{namespace}/{name}"
        await self._step("read", key, namespace, name)
        pod = self.pods.get(key)
        return None if pod is None else copy.deepcopy(pod)

    async def lock_node(self, node: str, namespace: str, name: str) -> str:
        key = f"{namespace}/{name}"
        fault = await self._step("lock", key, node, namespace, name)
        holder = self.locks.get(node)
        if holder is not None and holder != key:
            raise binders.BindFailure("lock", f"node {node} locked by {holder}", binders.CONTENTION)
        self.locks[node] = key
        self.version += 1
        self._landed("lock", fault)
        return str(self.version)

    async def unlock_node(self, node: str, namespace: str, name: str) -> None:
        key = f"{namespace}/{name}"
        fault = await self._step("unlock", key, node, namespace, name)
        if self.locks.get(node) == key:
            self.release(node)
        self._landed("unlock", fault)

    def annotate(self, key: str, annotations: Mapping[str, str]) -> None:
        """Merge annotations into pod ``key`` as the apiserver's Binding (or another writer) does."""
        self.annotations.setdefault(key, {}).update(annotations)
        if key in self.pods:
            self.pods[key].setdefault("metadata", {})["annotations"] = dict(self.annotations[key])

    async def bind(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        annotations: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> bool:
        key = f"{namespace}/{name}"
        self.timeouts.append(("bind", timeout))
        fault = await self._step("bind", key, namespace, name, node)
        bound = self.bound.get(key)
        if bound is not None:  # the apiserver refuses (409); KubeBinder then reads the pod
            if bound != node:
                raise binders.BindFailure("bind", f"pod {key} is already bound to {bound}", "Conflict")
            self._landed("bind", fault)
            return binders.carries(self.annotations.get(key, {}), annotations)
        self.bound[key] = node
        if annotations:
            self.annotate(key, annotations)
            self.uids[key] = uid
        self.version += 1
        if key in self.pods:
            self.pods[key].setdefault("spec", {})["nodeName"] = node
        if self.plugin_releases_lock and self.locks.get(node) == key:  # the device plugin's Allocate
            self.release(node)
        self._landed("bind", fault)
        return True

    async def label(self, namespace: str, name: str, uid: str, node: str) -> None:
        key = f"{namespace}/{name}"
        fault = await self._step("label", key, namespace, name, node)
        self.labels[key] = node
        self._landed("label", fault)

    async def claimed_pods(self, node: str) -> list[objects.Pod]:
        """What ``kube.pods.list_claimed`` finds: other writers' claims labelled with the node, and
        the pods bound to it here (a Binding carries the annotations, not the label)."""
        await self._step("claimed", "", node)
        out = [p for p in self.claimed if p.metadata.labels.get(keys.VGPU_NODE) == node]
        for key, ann in self.annotations.items():
            if self.bound.get(key) != node:
                continue
            ns, name = key.split("/", 1)
            out.append(
                objects.Pod(
                    metadata=objects.ObjectMeta(
                        name=name, namespace=ns, uid=self.uids.get(key, ""), annotations=dict(ann)
                    ),
                    spec=objects.PodSpec(
                        node_name=self.bound.get(key, ""), containers=[objects.Container(name="main")]
                    ),
                )
            )
        return out

    async def touch_node(self, node: str, annotations: Mapping[str, str]) -> None:
        await self._step("touch", "", node)
        self.touched.append((node, dict(annotations)))

    # ----- what other actors do

    def release(self, node: str) -> None:
        """The device plugin releases the node lock after Allocate; the node watch reports it."""
        self.locks.pop(node, None)
        if self.on_release is not None:
            self.on_release(node, False)

    def charged(self) -> dict[str, allocations.PodAllocation]:
        """Pod key -> allocation for every pod whose device annotations are on the API now."""
        out = {}
        for key, ann in self.annotations.items():
            alloc = pod_devices.allocation_from_annotations(ann, container_count=1)
            if alloc is not None:
                out[key] = alloc
        return out


class ApiTruth:
    """A ``bind.Truth`` stub: reads the node's claimed pods and applies them as the watch would.

    It follows ``Feed.settle``'s API path: pods the cache holds as assumed (binds of this process)
    are skipped, every other claim is charged. ``before(node)`` runs first: it is where a test
    lets another writer's pod land on the API (``binder.claimed``).
    """

    def __init__(
        self,
        cache: caches.ClusterCache,
        binder: FakeBinder,
        before: Callable[[str], None] | None = None,
    ) -> None:
        self.cache = cache
        self.binder = binder
        self.before = before
        self.calls: list[tuple[str, str]] = []

    async def settle(self, node: str, resource_version: str) -> None:
        self.calls.append((node, resource_version))
        if self.before is not None:
            self.before(node)
        for pod in await self.binder.claimed_pods(node):
            if self.cache.pod_state(pod.key) is caches.PodState.ASSUMED:
                continue  # a bind of this process: already charged, and it settles itself
            self.cache.add_pod(pod.key, pod.metadata.uid, claimed_allocation(pod))


class RecordedEvents:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []

    def record(
        self, namespace: str, name: str, uid: str, type_: str, reason: str, action: str, note: str
    ) -> None:
        self.events.append((f"{namespace}/{name}", type_, reason, note))


def make_deps(
    cache: caches.ClusterCache,
    binder: FakeBinder | None = None,
    settings: config.Settings | None = None,
    follower: bool = False,
    *,
    follower_ready: bool = True,
    invalid: Iterable[str] = (),
    excluded: Mapping[str, str] | None = None,
    synced: Callable[[], bool] = lambda: True,
    leading: Callable[[], bool] = lambda: True,
    truth: binds.Truth | None = None,
    clock: Callable[[], float] = lambda: CLOCK,
    faults: failpoints.Failpoints | None = None,
) -> apps.Deps:
    """The app's dependencies around a real cache and a ``FakeBinder``.

    The flow's timings come from ``settings`` (``lock_wait_s``, ``bind_timeout_s``,
    ``commit_deadline_s``, ``sync_wait_s``). The default ``clock`` stands still at ``CLOCK``: a
    bind finding the node lock held by another pod then waits until it is released (the lock wait
    is measured on this clock); pass a running clock to let ``lock_wait_s`` run out.
    """
    settings = settings or config.Settings()
    invalid_nodes = frozenset(invalid)
    excluded_nodes = dict(excluded or {})
    log = logs.Log(settings.verbosity)
    m = metrics.Metrics(lambda: view.states(cache.snapshot()))
    policies = profile.Profile.build(  # as serve.build sets them
        settings.node_policy,
        settings.card_policy,
        choice=settings.node_choice,
        job_label=settings.job_label,
        lock_margin=settings.lock_margin,
        mig_rule=settings.mig_placement,
    )
    events = RecordedEvents()
    binder = binder or FakeBinder()
    flow = binds.BindFlow(
        cache=cache,
        binder=binder,
        profile=policies,
        request_config=settings.request_config,
        clock=clock,
        log=log,
        metrics=m,
        events=events,
        truth=truth or binds.Trusting(),
        foreign_claims=truth if isinstance(truth, binds.ClaimSource) else None,
        leading=leading,
        synced=synced,
        excluded=excluded_nodes,
        invalid_nodes=invalid_nodes,
        lock_owner=binder.locks.get,  # what the node watch shows, always current here
        lock_wait_s=settings.lock_wait_s,
        bind_timeout_s=settings.bind_timeout_s,
        commit_deadline_s=settings.commit_deadline_s,
        sync_wait_s=settings.sync_wait_s,
        faults=faults or failpoints.Failpoints(),
    )
    binder.on_release = flow.node_lock_changed
    return apps.Deps(
        settings=settings,
        cache=cache,
        nominator=cache.nominator if isinstance(cache.nominator, nominations.Nominator) else None,
        flow=flow,
        profile=policies,
        log=log,
        metrics=m,
        events=events,
        follower=lambda: follower,
        follower_ready=follower_ready,
        synced=synced,
        invalid_nodes=invalid_nodes,
        excluded=excluded_nodes,
    )


def binds_counted(deps: apps.Deps, outcome: str) -> float:
    """``gpuslice_bind_total{outcome=...}``."""
    value = deps.metrics.registry.get_sample_value("gpuslice_bind_total", {"outcome": outcome})
    return value or 0.0


def gpu_pod(
    name: str,
    *,
    gpu: int = 1,
    mem: int | None = None,
    pct: int | None = None,
    cores: int | None = None,
    uid: str | None = None,
    namespace: str = "default",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    limits: dict[str, str] = {"nvidia.com/gpu": str(gpu)}
    if mem is not None:
        limits["nvidia.com/gpumem"] = str(mem)
    if pct is not None:
        limits["nvidia.com/gpumem-percentage"] = str(pct)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"}
    if annotations:
        meta["annotations"] = annotations
    return {
        "metadata": meta,
        "spec": {
            "containers": [{"name": "main", "resources": {"limits": limits}}],
            "schedulerName": "gpuslice-scheduler",
        },
    }
