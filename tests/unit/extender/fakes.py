"""In-memory stand-ins for the cache and the API on the bind path (no apiserver needed)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from gpuslice.extender import app as apps
from gpuslice.extender import bind as binds
from gpuslice.extender import binder as binders
from gpuslice.extender import config, logs, metrics, scheduling, view
from gpuslice.model import allocations, nodes
from gpuslice.policy import columns, registry
from gpuslice.policy import quota as quotas


@dataclasses.dataclass(frozen=True)
class Snapshot:
    nodes: dict[str, nodes.NodeState]
    invalid_nodes: frozenset[str]
    quota_views: dict[str, quotas.QuotaView]
    columns: columns.NodeColumns
    generation: int
    workload: registry.Workload | None = None

    def quota(self, namespace: str) -> quotas.QuotaView | None:
        return self.quota_views.get(namespace)


class FakeCache:
    """Nodes plus pod allocations; snapshots apply every allocation to the inventories."""

    def __init__(self, states: list[nodes.NodeState], invalid: frozenset[str] = frozenset()) -> None:
        self.base = {s.name: s for s in states}
        self.invalid = invalid
        self.pods: dict[str, tuple[str, allocations.PodAllocation, bool]] = {}
        self.quotas: dict[str, quotas.QuotaView] = {}
        self.generation = 0

    def snapshot(self) -> Snapshot:
        out = dict(self.base)
        for _, alloc, _ in self.pods.values():
            out[alloc.node] = allocations.apply(out[alloc.node], alloc)
        self.generation += 1
        return Snapshot(
            out, self.invalid, dict(self.quotas), columns.build(list(out.values())), self.generation
        )

    def assume(self, key: str, uid: str, allocation: allocations.PodAllocation, now: float) -> None:
        if key in self.pods:
            raise ValueError(f"{key} already assumed")
        self.pods[key] = (uid, allocation, False)

    def finish_binding(self, key: str, now: float) -> None:
        uid, alloc, _ = self.pods[key]
        self.pods[key] = (uid, alloc, True)

    def forget(self, key: str) -> None:
        self.pods.pop(key, None)


class FakeBinder:
    """Records calls; ``fail`` maps an operation to the error it raises; ``delay`` yields to others."""

    def __init__(self, pods: Mapping[str, dict[str, Any]] | None = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.fail: dict[str, str] = {}
        self.delay = 0.0
        self.pods = dict(pods or {})
        self.annotations: dict[str, dict[str, str]] = {}
        self.locks: dict[str, str] = {}
        self.bound: dict[str, str] = {}
        self.plugin_releases_lock = False
        self.on_release: Callable[[str, bool], None] | None = None
        self.touched: list[tuple[str, dict[str, str]]] = []

    async def _step(self, op: str, *args: str) -> None:
        self.calls.append((op, *args))
        if self.delay:
            await asyncio.sleep(self.delay)
        if op in self.fail:
            raise binders.BindFailure(op, self.fail[op], "Injected")

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        await self._step("read", namespace, name)
        return self.pods.get(f"{namespace}/{name}")

    async def lock_node(self, node: str, namespace: str, name: str) -> None:
        await self._step("lock", node, namespace, name)
        holder = self.locks.get(node)
        if holder is not None and holder != f"{namespace}/{name}":
            raise binders.BindFailure("lock", f"node {node} locked by {holder}", "NodeLockContention")
        self.locks[node] = f"{namespace}/{name}"

    async def unlock_node(self, node: str, namespace: str, name: str) -> None:
        await self._step("unlock", node, namespace, name)
        if self.locks.get(node) == f"{namespace}/{name}":
            del self.locks[node]
            if self.on_release is not None:
                self.on_release(node, False)

    async def annotate(
        self, namespace: str, name: str, uid: str, annotations: Mapping[str, str | None]
    ) -> None:
        await self._step("annotate", namespace, name)
        current = self.annotations.setdefault(f"{namespace}/{name}", {})
        for k, v in annotations.items():
            if v is None:
                current.pop(k, None)
            else:
                current[k] = v

    async def touch_node(self, node: str, annotations: Mapping[str, str]) -> None:
        await self._step("touch", node)
        self.touched.append((node, dict(annotations)))

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        await self._step("bind", namespace, name, node)
        self.bound[f"{namespace}/{name}"] = node
        if self.plugin_releases_lock:  # the device plugin's Allocate, instantly
            self.locks.pop(node, None)
            if self.on_release is not None:
                self.on_release(node, False)


class RecordedEvents:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []

    def record(
        self, namespace: str, name: str, uid: str, type_: str, reason: str, action: str, note: str
    ) -> None:
        self.events.append((f"{namespace}/{name}", type_, reason, note))


def make_deps(
    cache: view.Cache,
    binder: FakeBinder | None = None,
    settings: config.Settings | None = None,
    ready: bool = True,
) -> apps.Deps:
    settings = settings or config.Settings()
    invalid: frozenset[str] = getattr(cache, "invalid", frozenset())  # FakeCache's unregistrable nodes
    log = logs.Log(settings.verbosity)
    m = metrics.Metrics(lambda: view.states(cache.snapshot()))
    policies = scheduling.Policies.build(settings.node_policy, settings.card_policy)
    events = RecordedEvents()
    binder = binder or FakeBinder()
    flow = binds.BindFlow(
        cache=cache,
        binder=binder,
        policies=policies,
        request_config=settings.request_config,
        clock=lambda: 1_700_000_000.0,
        log=log,
        metrics=m,
        events=events,
        lock_wait_s=settings.lock_wait_s,
        invalid_nodes=invalid,
    )
    binder.on_release = flow.node_lock_changed
    return apps.Deps(
        settings=settings,
        cache=cache,
        flow=flow,
        policies=policies,
        log=log,
        metrics=m,
        events=events,
        ready=lambda: ready,
        invalid_nodes=invalid,
    )


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
