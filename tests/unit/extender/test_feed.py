from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import msgspec
import pytest

from gpuslice.cache import cache as caches
from gpuslice.codec import keys, registrations
from gpuslice.extender import config, feed, metrics
from gpuslice.extender.binding import binder as binders
from gpuslice.framework import logs, nominations
from gpuslice.kube import client as kclient
from gpuslice.kube import errors as kerrors
from gpuslice.kube import informer, objects
from gpuslice.model import allocations, devices

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
    cache = caches.ClusterCache(nominator=nominations.Nominator())
    rec = _Recorder()
    kube: Any = object()  # informers are built but never run here
    f = feed.Feed(kube, cache, settings or config.Settings(), logs.Log(0), metrics.Metrics())
    f.on_node_lock.add(lambda node, held: rec.locks.append((node, held)))
    f.on_capacity_freed.add(rec.freed.append)
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


# ----------------------------------------------------------------------------- the truth check


class _PodList:
    """A kube client whose only answer is a pod list (or ``error``), filtered as the apiserver
    would by ``fieldSelector: spec.nodeName=<node>`` or ``labelSelector: hami.io/vgpu-node=<node>``."""

    def __init__(self, items: list[objects.Pod], error: Exception | None = None) -> None:
        self.items = items
        self.error = error
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> kclient.Response:
        self.calls.append((method, path, kwargs))
        if self.error is not None:
            raise self.error
        params = kwargs.get("params") or {}
        items = self.items
        if "fieldSelector" in params:
            node = params["fieldSelector"].removeprefix("spec.nodeName=")
            items = [p for p in items if p.spec.node_name == node]
        if "labelSelector" in params:
            node = params["labelSelector"].removeprefix(f"{keys.VGPU_NODE}=")
            items = [p for p in items if p.metadata.labels.get(keys.VGPU_NODE) == node]
        body = {"metadata": {"resourceVersion": "400"}, "items": [msgspec.to_builtins(p) for p in items]}
        return kclient.Response(200, msgspec.json.encode(body))


def _claiming(name: str, devices_: str, node: str = "n", bound: bool = True) -> objects.Pod:
    ann = {keys.VGPU_NODE: node, keys.DEVICES_ALLOCATED: devices_}
    pod = _pod(name, node=node if bound else "", annotations=ann)
    return msgspec.structs.replace(
        pod, metadata=msgspec.structs.replace(pod.metadata, labels={keys.VGPU_NODE: node})
    )


def _truth_feed(api: _PodList) -> tuple[feed.Feed, caches.ClusterCache, metrics.Metrics]:
    cache = caches.ClusterCache(nominator=nominations.Nominator())
    m = metrics.Metrics()
    f = feed.Feed(cast(kclient.KubeClient, api), cache, config.Settings(), logs.Log(0), m)
    f.sync.nodes.handler(informer.Event(ADDED, _node("n", {keys.NODE_REGISTER: _registration()})))
    return f, cache, m


def _reads(m: metrics.Metrics, source: str) -> float:
    return m.registry.get_sample_value("gpuslice_bind_truth_reads_total", {"source": source}) or 0.0


def test_settle_trusts_a_pod_watch_that_passed_the_lock_write() -> None:
    api = _PodList([_claiming("x", "GPU-0,NVIDIA,1000,0:;")])
    f, cache, m = _truth_feed(api)
    f.sync.pods.resource_version = "450"  # the watch has applied every write up to 450
    asyncio.run(f.settle("n", "400"))
    assert api.calls == []  # nothing to read: the cache is current
    assert cache.pod_state("ns/x") is None
    assert (_reads(m, "watch"), _reads(m, "api")) == (1, 0)


def test_settle_reads_the_nodes_claims_when_the_watch_lags() -> None:
    bound = _claiming("x", "GPU-0,NVIDIA,30000,10:;")
    unbound = _claiming("y", "GPU-1,NVIDIA,2000,0:;", bound=False)  # between annotation and Binding
    mine = _claiming("p", "GPU-1,NVIDIA,9999,0:;", bound=False)  # a bind of this process
    # Bound by a Binding that carried the annotations: no label (the apiserver drops Binding labels).
    unlabelled = _pod(
        "z", node="n", annotations={keys.VGPU_NODE: "n", keys.DEVICES_ALLOCATED: "GPU-0,NVIDIA,500,0:;"}
    )
    api = _PodList([bound, unbound, mine, unlabelled])
    f, cache, m = _truth_feed(api)
    ours = allocations.PodAllocation(node="n", containers=((allocations.DeviceGrant("GPU-1", 4000, 0),),))
    assert cache.assume("ns/p", "u-p", ours, 0.0).ok
    f.sync.pods.resource_version = "300"
    t0 = time.monotonic()
    asyncio.run(f.settle("n", "400"))
    assert time.monotonic() - t0 >= feed.TRUTH_WAIT_S  # waited for the watch first
    assert [(method, path, kwargs["params"]) for method, path, kwargs in api.calls] == [
        ("GET", "/api/v1/pods", {"fieldSelector": "spec.nodeName=n"}),
        ("GET", "/api/v1/pods", {"labelSelector": f"{keys.VGPU_NODE}=n"}),
    ]
    assert cache.pod_state("ns/x") is caches.PodState.ADDED
    assert cache.pod_state("ns/y") is caches.PodState.ADDED
    assert cache.pod_state("ns/z") is caches.PodState.ADDED
    # The assumed pod keeps its reservation: the bind settles it itself.
    assert cache.pod_state("ns/p") is caches.PodState.ASSUMED and cache.pod_allocation("ns/p") == ours
    usage = cache.snapshot().nodes["n"].usage
    assert [(u.slots, u.memory_mib, u.cores) for u in usage] == [(2, 30500, 10), (2, 6000, 0)]
    assert (_reads(m, "watch"), _reads(m, "api")) == (0, 1)


def test_settle_fails_the_bind_when_the_api_cannot_be_read() -> None:
    f, _, _ = _truth_feed(_PodList([], error=kerrors.ApiUnavailable("connection refused")))
    with pytest.raises(binders.BindFailure) as err:
        asyncio.run(f.settle("n", "400"))
    assert err.value.operation == "read" and "connection refused" in str(err.value)
