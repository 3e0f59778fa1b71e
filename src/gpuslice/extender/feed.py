"""Informers -> cache for ``gpuslice serve``: nodes, pods and ResourceQuotas.

* Nodes: ``hami.io/node-nvidia-register`` (+ cordons, topology) decoded into an inventory, scaled by
  the configured overcommit, upserted; a node whose registration does not decode is removed from
  the cache and remembered as invalid (filter answers ``NodeRegistrationInvalid``).
* Pods: a non-terminated pod carrying ``hami.io/vgpu-node`` and ``vgpu-devices-allocated`` is
  charged (this is also how usage is rebuilt after a restart); terminated or deleted pods are
  uncharged.
* Quotas: the GPU limits of every ResourceQuota, merged per namespace (the smallest limit wins).

Ready means every informer has listed once and is healthy now.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec

from gpuslice.cache import cache as caches
from gpuslice.codec import errors as codec_errors
from gpuslice.codec import keys, node_inventory, pod_devices, resources
from gpuslice.extender import config, logs, metrics
from gpuslice.kube import client as kclient
from gpuslice.kube import informer, kinds, objects
from gpuslice.model import nodes
from gpuslice.policy import quota as quotas


def _kind_name(inf: Any) -> str:
    return str(inf.kind.name)


def scale(inventory: nodes.NodeInventory, memory: float, cores: float) -> nodes.NodeInventory:
    """The inventory with every card's registered memory and cores multiplied (overcommit)."""
    if memory == 1.0 and cores == 1.0:
        return inventory
    devs = tuple(
        msgspec.structs.replace(d, memory_mib=int(d.memory_mib * memory), cores=int(d.cores * cores))
        for d in inventory.devices
    )
    return msgspec.structs.replace(inventory, devices=devs)


class Feed:
    """The three informers and their handlers.

    Args:
        kube: API client.
        cache: the cluster cache to keep current.
        settings: overcommit, request config, resync and watch timeout.
        log: logger.
        metrics_: where watch restarts and sync state are counted.
        on_node_lock: told (node, held) on every node event, so binds waiting for HAMi's node
            lock retry as soon as it is released.
        on_capacity_freed: told the node when a pod holding GPUs there is gone.
    """

    def __init__(
        self,
        kube: kclient.KubeClient,
        cache: caches.ClusterCache,
        settings: config.Settings,
        log: logs.Log,
        metrics_: metrics.Metrics,
        on_node_lock: Callable[[str, bool], None] | None = None,
        on_capacity_freed: Callable[[str], None] | None = None,
    ) -> None:
        self.cache = cache
        self.on_node_lock = on_node_lock
        self.on_capacity_freed = on_capacity_freed
        self.settings = settings
        self.log = log
        self.metrics = metrics_
        self.invalid_nodes: set[str] = set()
        self._quota_by_object: dict[str, resources.QuotaLimits] = {}
        wt, rs = settings.watch_timeout_s, settings.resync_period_s
        self.nodes = informer.Informer(kube, kinds.NODES, self._on_node, watch_timeout_s=wt, resync_s=rs)
        self.pods = informer.Informer(kube, kinds.PODS, self._on_pod, watch_timeout_s=wt, resync_s=rs)
        self.quotas = informer.Informer(kube, kinds.QUOTAS, self._on_quota, watch_timeout_s=wt, resync_s=rs)
        self.informers: tuple[informer.Informer[Any], ...] = (self.nodes, self.pods, self.quotas)
        self._restarts = [0] * len(self.informers)

    def node(self, name: str) -> objects.Node | None:
        """The node as the watch last saw it."""
        return self.nodes.store.get(name)

    def ready(self) -> bool:
        """Every kind listed once and every watch healthy."""
        ok = all(i.synced and i.healthy for i in self.informers)
        for k, inf in enumerate(self.informers):
            if inf.restarts > self._restarts[k]:
                self.metrics.watch_restarts.labels(_kind_name(inf)).inc(inf.restarts - self._restarts[k])
                self._restarts[k] = inf.restarts
        self.metrics.cache_synced.set(1 if ok else 0)
        return ok

    def _on_node(self, event: informer.Event[objects.Node]) -> None:
        if event.obj is None:
            return
        name = event.obj.metadata.name
        if event.type is informer.EventType.DELETED:
            self.invalid_nodes.discard(name)
            self.cache.remove_node(name)
            return
        annotations = event.obj.metadata.annotations
        if self.on_node_lock is not None:
            self.on_node_lock(name, bool(annotations.get(keys.NODE_LOCK)))
        try:
            inventory = node_inventory.decode_node(name, annotations)
        except codec_errors.AnnotationMissing:
            self.invalid_nodes.discard(name)
            self.cache.remove_node(name)
            return
        except codec_errors.DecodeError as err:
            if name not in self.invalid_nodes:
                self.log.warning("invalid node registration", node=name, err=str(err))
            self.invalid_nodes.add(name)
            self.cache.remove_node(name)
            return
        self.invalid_nodes.discard(name)
        s = self.settings
        self.cache.upsert_node(scale(inventory, s.memory_scaling, s.core_scaling))

    def _on_pod(self, event: informer.Event[objects.Pod]) -> None:
        pod = event.obj
        if pod is None:
            return
        key = f"{pod.metadata.namespace}/{pod.metadata.name}"
        if event.type is informer.EventType.DELETED or pod.terminated:
            held = self.cache.pod_state(key) is not None
            self.cache.remove_pod(key)
            node = pod.spec.node_name or pod.metadata.annotations.get(keys.VGPU_NODE, "")
            if held and node and self.on_capacity_freed is not None:
                self.on_capacity_freed(node)
            return
        if not pod.spec.node_name and self.cache.pod_state(key) is None:
            return
        try:
            alloc = pod_devices.allocation_from_pod(msgspec.to_builtins(pod))
        except codec_errors.DecodeError as err:
            self.log.warning("invalid pod device annotation", pod=key, err=str(err))
            return
        if alloc is None:
            return
        if not pod.spec.node_name:
            return  # annotated by a bind still in flight; the bind path already assumed it
        self.cache.add_pod(key, pod.metadata.uid, alloc)

    def _on_quota(self, event: informer.Event[objects.ResourceQuota]) -> None:
        q = event.obj
        if q is None:
            return
        ns, key = q.metadata.namespace, f"{q.metadata.namespace}/{q.metadata.name}"
        if event.type is informer.EventType.DELETED:
            self._quota_by_object.pop(key, None)
        else:
            try:
                self._quota_by_object[key] = resources.parse_quota(q.spec.hard, self.settings.request_config)
            except codec_errors.DecodeError as err:
                self.log.warning("invalid quota", quota=key, err=str(err))
                return
        self.cache.set_quota(ns, self._merged(ns))

    def _merged(self, namespace: str) -> quotas.QuotaView | None:
        limits = [v for k, v in self._quota_by_object.items() if k.split("/", 1)[0] == namespace]
        if not limits:
            return None

        def smallest(values: list[int | None]) -> int | None:
            given = [v for v in values if v is not None]
            return min(given) if given else None

        return quotas.QuotaView(
            count_limit=smallest([q.count for q in limits]),
            memory_limit=smallest([q.memory_mib for q in limits]),
            cores_limit=smallest([q.cores for q in limits]),
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Feed]:
        """Run the informers and the housekeeping loop until the context exits."""
        tasks = [asyncio.create_task(i.run(), name=f"informer-{_kind_name(i)}") for i in self.informers]
        tasks.append(asyncio.create_task(self._housekeeping(), name="feed-housekeeping"))
        try:
            yield self
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _housekeeping(self, clock: Callable[[], float] = time.time) -> None:
        """Every second: metrics and readiness; every ``assumed_ttl_s / 4``: expire assumed pods.

        Once every kind is listed the first time, the long-lived cache objects are moved out of
        the garbage collector's generations (``gc.freeze``), so full collections stop scanning
        them on the request path.
        """
        frozen = False
        next_expiry = clock()
        while True:
            await asyncio.sleep(1.0)
            ready = self.ready()
            if ready and not frozen:
                frozen = True
                gc.collect()
                gc.freeze()
                snap = self.cache.snapshot()
                self.log.info("cache synced", nodes=len(snap.nodes), invalid_nodes=len(self.invalid_nodes))
            if clock() >= next_expiry:
                next_expiry = clock() + max(1.0, self.settings.assumed_ttl_s / 4)
                gone = self.cache.expire(clock(), self.settings.assumed_ttl_s)
                if gone:
                    self.log.info("assumed pods expired", pods=",".join(gone))
