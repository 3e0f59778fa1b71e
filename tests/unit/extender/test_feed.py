from __future__ import annotations

from typing import Any

import pytest

from gpuslice.cache import cache as caches
from gpuslice.codec import keys, registrations
from gpuslice.extender import config, feed, logs, metrics
from gpuslice.kube import informer, objects
from gpuslice.model import devices

pytestmark = pytest.mark.unit

ADDED, MODIFIED, DELETED = informer.EventType.ADDED, informer.EventType.MODIFIED, informer.EventType.DELETED


def _registration(n: int = 2, memory: int = 32768) -> str:
    return registrations.encode_json(
        devices.GpuDevice(uuid=f"GPU-{i}", index=i, type="NVIDIA A100", memory_mib=memory) for i in range(n)
    )


def _node(name: str, annotations: dict[str, str]) -> objects.Node:
    return objects.Node(metadata=objects.ObjectMeta(name=name, annotations=annotations, resource_version="7"))


def _pod(
    name: str, node: str = "", annotations: dict[str, str] | None = None, phase: str = ""
) -> objects.Pod:
    return objects.Pod(
        metadata=objects.ObjectMeta(
            name=name, namespace="ns", uid=f"u-{name}", annotations=annotations or {}
        ),
        spec=objects.PodSpec(node_name=node, containers=[objects.Container(name="c")]),
        status=objects.PodStatus(phase=phase),
    )


class _Recorder:
    def __init__(self) -> None:
        self.locks: list[tuple[str, bool]] = []
        self.freed: list[str] = []


def _feed(settings: config.Settings | None = None) -> tuple[feed.Feed, caches.ClusterCache, _Recorder]:
    cache = caches.ClusterCache()
    rec = _Recorder()
    kube: Any = object()  # informers are built but never run here
    f = feed.Feed(kube, cache, settings or config.Settings(), logs.Log(0), metrics.Metrics())
    f.on_node_lock = lambda node, held: rec.locks.append((node, held))
    f.on_capacity_freed = rec.freed.append
    return f, cache, rec


def test_nodes_registered_invalid_and_removed() -> None:
    f, cache, rec = _feed(config.Settings(memory_scaling=1.5, core_scaling=2.0))
    f.sync.nodes.handler(informer.Event(ADDED, _node("good", {keys.NODE_REGISTER: _registration()})))
    f.sync.nodes.handler(informer.Event(ADDED, _node("bad", {keys.NODE_REGISTER: "[{not json"})))
    f.sync.nodes.handler(informer.Event(ADDED, _node("cpu-only", {})))
    snap = cache.snapshot()
    assert set(snap.nodes) == {"good"}
    # Overcommit: 32768 * 1.5 = 49152 MiB and 100 * 2.0 = 200 cores registered per card.
    assert [(d.memory_mib, d.cores) for d in snap.nodes["good"].inventory.devices] == [(49152, 200)] * 2
    assert set(f.invalid_nodes) == {"bad"}
    f.sync.nodes.handler(informer.Event(MODIFIED, _node("bad", {keys.NODE_REGISTER: _registration(1)})))
    assert not f.invalid_nodes and "bad" in cache.snapshot().nodes
    f.sync.nodes.handler(
        informer.Event(MODIFIED, _node("good", {keys.NODE_REGISTER: _registration(), keys.NODE_LOCK: "x"}))
    )
    f.sync.nodes.handler(informer.Event(DELETED, _node("good", {})))
    assert "good" not in cache.snapshot().nodes
    assert ("good", True) in rec.locks and ("good", False) in rec.locks


def test_pods_charged_from_annotations_and_released() -> None:
    f, cache, rec = _feed()
    f.sync.nodes.handler(informer.Event(ADDED, _node("n", {keys.NODE_REGISTER: _registration()})))
    ann = {keys.VGPU_NODE: "n", keys.DEVICES_ALLOCATED: "GPU-1,NVIDIA,4000,30:;"}
    f.sync.pods.handler(informer.Event(ADDED, _pod("p", node="n", annotations=ann)))
    f.sync.pods.handler(informer.Event(ADDED, _pod("plain", node="n")))  # not a HAMi pod
    usage = cache.snapshot().nodes["n"].usage
    assert (usage[1].memory_mib, usage[1].cores, usage[1].slots) == (4000, 30, 1)
    f.sync.pods.handler(informer.Event(MODIFIED, _pod("p", node="n", annotations=ann, phase="Succeeded")))
    assert cache.snapshot().nodes["n"].usage[1].memory_mib == 0
    assert rec.freed == ["n"]
    f.sync.pods.handler(informer.Event(DELETED, _pod("plain", node="n")))
    assert rec.freed == ["n"]  # held nothing


def test_malformed_device_annotation_is_ignored() -> None:
    f, cache, _ = _feed()
    f.sync.nodes.handler(informer.Event(ADDED, _node("n", {keys.NODE_REGISTER: _registration()})))
    bad = {keys.VGPU_NODE: "n", keys.DEVICES_ALLOCATED: "GPU-1,NVIDIA,lots,30:;"}
    f.sync.pods.handler(informer.Event(ADDED, _pod("p", node="n", annotations=bad)))
    assert cache.pod_state("ns/p") is None


def test_quotas_merge_per_namespace_smallest_limit_wins() -> None:
    f, cache, _ = _feed()

    def quota(name: str, hard: dict[str, str]) -> objects.ResourceQuota:
        return objects.ResourceQuota(
            metadata=objects.ObjectMeta(name=name, namespace="team"), spec=objects.QuotaSpec(hard=hard)
        )

    f.sync.quotas.handler(informer.Event(ADDED, quota("a", {"limits.nvidia.com/gpumem": "20000"})))
    f.sync.quotas.handler(
        informer.Event(ADDED, quota("b", {"limits.nvidia.com/gpumem": "10000", "nvidia.com/gpu": "4"}))
    )
    view = cache.snapshot().quota("team")
    assert view is not None and (view.memory_limit, view.count_limit) == (10000, 4)
    f.sync.quotas.handler(informer.Event(DELETED, quota("b", {})))
    view = cache.snapshot().quota("team")
    assert view is not None and (view.memory_limit, view.count_limit) == (20000, None)
    f.sync.quotas.handler(informer.Event(DELETED, quota("a", {})))
    assert cache.snapshot().quota("team") is None
