"""Informers -> cache for ``gpuslice serve``: ``kube.sync.Sync`` plus the extender's hooks.

``kube.sync`` decodes nodes (registrations, invalid ones remembered), pods (allocations from
annotations, which is also how usage is rebuilt after a restart) and ResourceQuotas into the
cache. On top of it the extender adds:

* overcommit: every inventory's memory and cores scaled by the configured factors;
* ``on_node_lock(node, held)`` on every node event, so binds waiting for HAMi's node lock retry
  as soon as the device plugin releases it;
* ``on_capacity_freed(node)`` when a pod holding GPUs goes away (requeue nudges);
* a housekeeping loop: readiness and watch-restart metrics, assumed-pod expiry, ``gc.freeze``.
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
from gpuslice.codec import keys
from gpuslice.extender import config, logs, metrics
from gpuslice.kube import client as kclient
from gpuslice.kube import events as kevents
from gpuslice.kube import informer, objects, sync
from gpuslice.model import nodes


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
    """``kube.sync.Sync`` with the extender's hooks (see the module docstring).

    Args:
        kube: API client.
        cache: the cluster cache to keep current.
        settings: overcommit, request config, resync and watch timeout.
        log: logger.
        metrics_: where watch restarts and sync state are counted.
        recorder: where Warning events about invalid node registrations go.
    """

    def __init__(
        self,
        kube: kclient.KubeClient,
        cache: caches.ClusterCache,
        settings: config.Settings,
        log: logs.Log,
        metrics_: metrics.Metrics,
        recorder: kevents.Recorder | None = None,
    ) -> None:
        self.cache = cache
        self.settings = settings
        self.log = log
        self.metrics = metrics_
        self.on_node_lock: Callable[[str, bool], None] | None = None
        self.on_capacity_freed: Callable[[str], None] | None = None
        s = settings
        self.sync = sync.Sync(
            kube,
            cache,
            recorder=recorder,
            request_config=s.request_config,
            transform=lambda inv: scale(inv, s.memory_scaling, s.core_scaling),
            resync_s=s.resync_period_s,
        )
        self.invalid_nodes = self.sync.invalid_nodes
        """Node -> why its registration was rejected (a live view)."""
        self.sync.nodes.handler = self._on_node
        self.sync.pods.handler = self._on_pod
        self.informers: tuple[informer.Informer[Any], ...] = tuple(self.sync.informers)
        for inf in self.informers:
            inf.watch_timeout_s = s.watch_timeout_s
        self._restarts = [0] * len(self.informers)

    def node(self, name: str) -> objects.Node | None:
        """The node as the watch last saw it."""
        return self.sync.nodes.store.get(name)

    def ready(self) -> bool:
        """Every kind listed once and every watch healthy; also refreshes the feed metrics."""
        ok = self.sync.readiness()
        for k, inf in enumerate(self.informers):
            if inf.restarts > self._restarts[k]:
                self.metrics.watch_restarts.labels(inf.kind.name).inc(inf.restarts - self._restarts[k])
                self._restarts[k] = inf.restarts
        self.metrics.cache_synced.set(1 if ok else 0)
        return ok

    def _on_node(self, event: informer.Event[objects.Node]) -> None:
        self.sync.on_node(event)
        if event.obj is not None and self.on_node_lock is not None:
            held = event.type is not informer.EventType.DELETED and bool(
                event.obj.metadata.annotations.get(keys.NODE_LOCK)
            )
            self.on_node_lock(event.obj.metadata.name, held)

    def _on_pod(self, event: informer.Event[objects.Pod]) -> None:
        pod = event.obj
        held = pod is not None and self.cache.pod_state(pod.key) is not None
        self.sync.on_pod(event)
        if pod is None or not held or self.on_capacity_freed is None:
            return
        if self.cache.pod_state(pod.key) is None:
            node = pod.spec.node_name or pod.metadata.annotations.get(keys.VGPU_NODE, "")
            if node:
                self.on_capacity_freed(node)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Feed]:
        """Run the informers and the housekeeping loop until the context exits."""
        async with self.sync:
            task = asyncio.create_task(self._housekeeping(), name="feed-housekeeping")
            try:
                yield self
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

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
