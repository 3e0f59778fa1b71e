"""Informers -> cache for ``gpuslice serve``: ``kube.sync.Sync`` plus the extender's hooks.

``kube.sync`` decodes nodes (registrations, invalid ones remembered), pods (allocations from
annotations, which is also how usage is rebuilt after a restart) and ResourceQuotas into the
cache. On top of it the extender adds:

* overcommit: every inventory's memory and cores scaled by the configured factors;
* ``on_node_lock`` (node, held) on every node event, so binds waiting for HAMi's node lock retry
  as soon as the device plugin releases it;
* ``on_capacity_freed`` (node) when a pod holding GPUs goes away, or when its init containers
  have all succeeded and the cache released their peak (requeue nudges, shadow departures);
  both are listener lists (``extender.listeners``) that ``serve.build`` registers consumers on;
* a housekeeping loop: readiness and watch-restart metrics, assumed-pod expiry, ``gc.freeze``;
* node liveness (``liveness.NodeHealth``) from every node event;
* ``unbound_claims``: pods carrying a node claim (``hami.io/vgpu-node``) but no binding, which
  the recovery loop inspects for orphans without scanning every pod;
* another scheduler's filter claims (``kube.claims``), judged against the node lock's expiry
  (``node_lock_expiry_s``): ``kube.sync`` charges one while it is held and drops it once stale;
  the claims are judged again every second and when a node's lock changes,
  each change is logged, a claim turning stale nudges the Pending pods (``on_capacity_freed``),
  and ``foreign_claim(key)`` gives the bind path a pod's claim judged now;
* ``settle(node, resourceVersion)``, the bind path's truth check: wait until the pod watch has
  passed the node lock's resourceVersion; if it has not within ``TRUTH_WAIT_S``, read the node's
  claimed pods from the API and apply them to the cache as the watch would.
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
from gpuslice.codec import keys
from gpuslice.codec import locks as lockcodec
from gpuslice.extender import config, listeners, metrics, tasks
from gpuslice.extender.binding import binder as binders
from gpuslice.extender.binding import liveness
from gpuslice.framework import logs
from gpuslice.kube import claims, informer, objects, pods, sync
from gpuslice.kube import client as kclient
from gpuslice.kube import errors as kerrors
from gpuslice.kube import events as kevents
from gpuslice.model import nodes

STALL_COOLOFF_FACTOR = 5.0
"""A node whose Allocate stalled gets a probe pod again after this many allocate timeouts."""
TRUTH_WAIT_S = 0.05
"""How long the truth check waits for the pod watch before it reads the node's pods itself."""


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
        self.on_node_lock: listeners.Listeners[[str, bool]] = listeners.Listeners()
        """Told (node, held) on every node event: whether HAMi's lock annotation is set."""
        self.on_capacity_freed: listeners.Listeners[[str]] = listeners.Listeners()
        """Told (node) when a pod holding GPUs there went away or released its init containers' peak."""
        self.on_pod: listeners.Listeners[[str, objects.Pod, bool]] = listeners.Listeners()
        """Told (key, pod, deleted) of every pod event once the cache applied it (gang members)."""
        s = settings
        self.sync = sync.Sync(
            kube,
            cache,
            recorder=recorder,
            request_config=s.request_config,
            transform=lambda inv: scale(inv, s.memory_scaling, s.core_scaling),
            resync_s=s.resync_period_s,
            claim_expiry_s=s.node_lock_expiry_s or config.DEFAULT_LOCK_EXPIRY_S,
            clock=lambda: self.clock(),
            job_label=s.job_label,  # each placed pod's job reaches the cache
        )
        self.sync.on_claim = self._claim_changed
        self.invalid_nodes = self.sync.invalid_nodes
        """Node -> why its registration was rejected (a live view)."""
        self.sync.nodes.handler = self._on_node
        self.sync.pods.handler = self._on_pod
        self.informers: tuple[informer.Informer[Any], ...] = tuple(self.sync.informers)
        for inf in self.informers:
            inf.watch_timeout_s = s.watch_timeout_s
        self._restarts = [0] * len(self.informers)
        self.kube = kube
        self.health = liveness.NodeHealth(
            s.handshake_timeout_s,
            s.stuck_lock_s,
            stall_cooloff_s=STALL_COOLOFF_FACTOR * s.allocate_timeout_s,
            gpu_resource=s.request_config.names.count,
        )
        self.unbound_claims: dict[str, objects.Pod] = {}
        """Pod key -> pod, for pods with ``hami.io/vgpu-node`` and no ``spec.nodeName``."""
        self._locks: dict[str, str] = {}
        """Node -> its ``hami.io/mutex.lock`` as last seen (claims are judged again when it changes)."""
        self._inits_released: set[str] = set()
        """Keys of held pods whose init containers all succeeded (charged their app containers only)."""
        self.clock: Callable[[], float] = time.time
        self.monotonic: Callable[[], float] = time.monotonic

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

    def lock_owner(self, name: str) -> str | None:
        """``ns/name`` of the pod HAMi's lock on the node names (watched), None when unlocked."""
        node = self.sync.nodes.store.get(name)
        value = None if node is None else node.metadata.annotations.get(keys.NODE_LOCK)
        if not value:
            return None
        try:
            lock = lockcodec.decode(value)
        except codec_errors.DecodeError:
            return None
        return f"{lock.namespace}/{lock.name}" if lock.has_owner else None

    def foreign_claim(self, key: str) -> claims.Claim | None:
        """Pod ``key``'s filter claim that no bind took up, judged now; the cache follows at once."""
        return self.sync.foreign_claim(key)

    def _claim_changed(self, key: str, claim: claims.Claim) -> None:
        if claim.held:
            held_again = "another scheduler's claim counts as held again"
            self.log.info(held_again, pod=key, node=claim.node, state=claim.state.value)
            return
        self.log.info(
            "another scheduler's claim is stale: no longer counted, the pod's bind replaces it",
            pod=key,
            node=claim.node,
            written=claim.written,
            age_s=f"{claim.age_s:.0f}",
        )

    def recheck_claims(self, node: str | None = None) -> None:
        """Judge other schedulers' claims again (``kube.sync.Sync.recheck_claims``); nudge on stale ones."""
        for key in self.sync.recheck_claims(node):
            claim = self.sync.foreign_claim(key)
            if claim is not None and not claim.held:
                self.on_capacity_freed.emit(claim.node)

    def pod(self, key: str) -> objects.Pod | None:
        """The pod as the watch last saw it."""
        return self.sync.pods.store.get(key)

    def nodes(self) -> list[objects.Node]:
        """Every node as the watch last saw it."""
        return list(self.sync.nodes.store.values())

    async def settle(self, node: str, resource_version: str) -> None:
        """The bind path's truth check (see the module docstring).

        Raises:
            binders.BindFailure: the node's pods could not be read.
        """
        if await self.sync.pods.wait_for(resource_version, TRUTH_WAIT_S):
            self.metrics.truth_reads.labels("watch").inc()
            return
        self.metrics.truth_reads.labels("api").inc()
        try:
            claimed = await pods.list_claimed(self.kube, node)
        except kerrors.ApiError as err:
            raise binders.BindFailure("read", f"cannot read the pods of node {node}: {err}") from err
        for pod in claimed:
            if self.cache.pod_state(pod.key) is caches.PodState.ASSUMED:
                continue  # a bind of this process: already charged, and it settles itself
            self.sync.on_pod(informer.Event(informer.EventType.MODIFIED, pod))

    def _on_node(self, event: informer.Event[objects.Node]) -> None:
        self.sync.on_node(event)
        if event.obj is not None:
            deleted = event.type is informer.EventType.DELETED
            self.health.observe(event.obj, deleted, self.clock(), self.monotonic())
        if event.obj is not None and self.on_node_lock:
            held = event.type is not informer.EventType.DELETED and bool(
                event.obj.metadata.annotations.get(keys.NODE_LOCK)
            )
            self.on_node_lock.emit(event.obj.metadata.name, held)
        if event.obj is not None:
            gone = event.type is informer.EventType.DELETED
            self._lock_seen(event.obj.metadata.name, None if gone else event.obj.metadata.annotations)

    def _lock_seen(self, name: str, annotations: dict[str, str] | None) -> None:
        """A lock taken, released or replaced on the node may change the claims on it: judge them."""
        lock = None if annotations is None else annotations.get(keys.NODE_LOCK)
        if self._locks.get(name) == lock:
            return
        if lock is None:
            self._locks.pop(name, None)
        else:
            self._locks[name] = lock
        self.recheck_claims(name)

    def _on_pod(self, event: informer.Event[objects.Pod]) -> None:
        pod = event.obj
        if pod is None:
            return
        key = pod.key
        deleted = event.type is informer.EventType.DELETED
        ann = pod.metadata.annotations
        bound = pod.spec.node_name
        if bound and ann.get(keys.BIND_PHASE) in (keys.BIND_PHASE_SUCCESS, keys.BIND_PHASE_FAILED):
            stamp = ann.get(keys.BIND_TIME, "")
            if stamp.isdigit():
                self.health.allocate_answered(bound, float(stamp), self.clock(), self.monotonic())
        if keys.VGPU_NODE in ann and not bound and not deleted and not pod.terminated:
            self.unbound_claims[key] = pod
        elif self.unbound_claims:
            self.unbound_claims.pop(key, None)
        held = self.cache.pod_state(key) is not None
        self.sync.apply_pod(key, pod, deleted)
        if self.on_pod:
            self.on_pod.emit(key, pod, deleted)
        released = self._inits_release(pod, key, held)
        if not held or not self.on_capacity_freed:
            return
        if released or self.cache.pod_state(key) is None:
            node = bound or ann.get(keys.VGPU_NODE, "")
            if node:
                self.on_capacity_freed.emit(node)

    def _inits_release(self, pod: objects.Pod, key: str, held: bool) -> bool:
        """True when this event released a held pod's init-container peak (``Pod.inits_done`` flipped)."""
        if pod.spec.init_containers and pod.inits_done and self.cache.pod_state(key) is not None:
            if key in self._inits_released:
                return False
            self._inits_released.add(key)
            return held
        if self._inits_released:
            self._inits_released.discard(key)
        return False

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Feed]:
        """Run the informers and the housekeeping loop until the context exits."""
        async with self.sync, tasks.background(self._housekeeping(), "feed-housekeeping"):
            yield self

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
            self.health.tick(clock(), self.monotonic())
            self.recheck_claims()  # claims age without events
            for reason, n in self.health.counts().items():
                self.metrics.nodes_excluded.labels(reason).set(n)
            self.metrics.nodes_excluded.labels("NodeRegistrationInvalid").set(len(self.invalid_nodes))
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
