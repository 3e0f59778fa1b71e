"""The leader's recovery loop and the bind's truth check against a real kube-apiserver.

The leftovers of a crashed extender are written directly through the API (a node lock naming a
Pending pod, that pod's bind annotations), exactly what a process killed between its writes
leaves; then one recovery pass must clear them, and nothing that a live bind still needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gpuslice.cache import cache as cluster_cache
from gpuslice.codec import keys
from gpuslice.codec import locks as lockcodec
from gpuslice.extender import config, feed, metrics, recovery
from gpuslice.extender.binding import bind, binder
from gpuslice.framework import logs, nominations, profile
from gpuslice.kube import client as kclient
from gpuslice.kube import locks, pods
from gpuslice_dev import nodesim
from gpuslice_dev.controlplane import ControlPlane
from tests.integration import kubehelpers as h

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

SETTINGS = config.validate({"orphan_grace_s": 3.0, "commit_deadline_s": 1.0, "allocate_timeout_s": 5.0})
LIMITS = recovery.Limits(SETTINGS.orphan_grace_s, SETTINGS.allocate_timeout_s, SETTINGS.node_lock_expiry_s)


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def record(
        self, namespace: str, name: str, uid: str, type_: str, reason: str, action: str, note: str
    ) -> None:
        self.seen.append((f"{namespace}/{name}", type_, reason))


async def eventually(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not pred():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), timeout)


@contextlib.asynccontextmanager
async def stack(kube: kclient.KubeClient) -> AsyncIterator[tuple[feed.Feed, recovery.Recovery, Events]]:
    cache = cluster_cache.ClusterCache(nominator=nominations.Nominator())
    log = logs.Log(0)
    m = metrics.Metrics()
    source = feed.Feed(kube, cache, SETTINGS, log, m)
    events = Events()
    flow = bind.BindFlow(
        cache=cache,
        binder=binder.KubeBinder(kube),
        profile=profile.Profile.build("binpack", "spread"),
        request_config=SETTINGS.request_config,
        clock=time.time,
        log=log,
        metrics=m,
        events=events,
        truth=source,
        foreign_claims=source,
        # The sweeper only asks the flow which binds are live here; no bind runs, no gate is needed.
        leading=lambda: True,
        synced=lambda: True,
        excluded={},
        lock_owner=lambda node: None,
    )
    sweeper = recovery.Recovery(kube, source, flow, LIMITS, events, m, log, lambda: True)
    async with source.running():
        await eventually(source.ready)
        yield source, sweeper, events


async def crashed_bind(
    cp: ControlPlane,
    kube: kclient.KubeClient,
    namespace: str,
    node: str,
    name: str,
    age_s: float,
    bound: bool,
) -> dict[str, Any]:
    """What an extender killed after its writes leaves: lock + annotations (+ Binding if ``bound``)."""
    uuid = nodesim.cards(node, count=2)[0].uuid
    taken = time.time() - age_s
    ann = {
        keys.VGPU_NODE: node,
        keys.VGPU_TIME: str(int(taken)),
        keys.DEVICES_ALLOCATED: f"{uuid},NVIDIA,40000,50:;",
        keys.DEVICES_TO_ALLOCATE: f"{uuid},NVIDIA,40000,50:;",
        keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING,
        keys.BIND_TIME: str(int(taken)),
    }
    h.create_pod(cp, namespace, name, annotations=ann, gpus=1, node_name=node if bound else None)
    await pods.patch_annotations(kube, namespace, name, {}, labels={keys.VGPU_NODE: node})
    current = await locks.read_node(kube, node)
    await locks._write(
        kube, node, lockcodec.encode(taken, namespace, name), current.metadata.resource_version
    )
    return ann


async def test_orphan_of_a_killed_bind_is_cleared_and_the_node_freed(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    await nodesim.make_node(kube, node_name, count=2, memory_mib=81920)
    await crashed_bind(control_plane, kube, namespace, node_name, "orphan", age_s=10, bound=False)
    async with stack(kube) as (source, sweeper, events):
        key = f"{namespace}/orphan"
        # The phantom reservation is charged until recovery runs.
        await eventually(lambda: source.cache.pod_state(key) is not None)
        await sweeper.sweep()
        node = await locks.read_node(kube, node_name)
        assert keys.NODE_LOCK not in node.metadata.annotations
        pod = await pods.get(kube, namespace, "orphan")
        assert not any(k in pod.metadata.annotations for k in (keys.VGPU_NODE, keys.DEVICES_ALLOCATED))
        assert keys.VGPU_NODE not in pod.metadata.labels
        assert (key, "Warning", "OrphanBindCleared") in events.seen
        await eventually(lambda: source.cache.pod_state(key) is None)
        usage = source.cache.snapshot().nodes[node_name].usage
        assert all(u.memory_mib == 0 for u in usage)
        assert sweeper.metrics.recovery.labels("orphan_bind_cleared")._value.get() == 1


async def test_a_young_lock_and_a_live_bind_are_left_alone(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    await nodesim.make_node(kube, node_name, count=2, memory_mib=81920)
    await crashed_bind(control_plane, kube, namespace, node_name, "young", age_s=0, bound=False)
    async with stack(kube) as (source, sweeper, events):
        await sweeper.sweep()
        node = await locks.read_node(kube, node_name)
        assert lockcodec.is_owner(node.metadata.annotations[keys.NODE_LOCK], namespace, "young")
        pod = await pods.get(kube, namespace, "young")
        assert pod.metadata.annotations[keys.BIND_PHASE] == keys.BIND_PHASE_ALLOCATING
        assert events.seen == []


async def test_unanswered_allocate_releases_the_lock_but_keeps_the_devices(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    await nodesim.make_node(kube, node_name, count=2, memory_mib=81920)
    ann = await crashed_bind(control_plane, kube, namespace, node_name, "stuck", age_s=8, bound=True)
    async with stack(kube) as (source, sweeper, events):
        await sweeper.sweep()
        node = await locks.read_node(kube, node_name)
        assert keys.NODE_LOCK not in node.metadata.annotations
        pod = await pods.get(kube, namespace, "stuck")
        assert pod.metadata.annotations[keys.DEVICES_ALLOCATED] == ann[keys.DEVICES_ALLOCATED]
        assert (f"{namespace}/stuck", "Warning", "AllocateTimeout") in events.seen
        # The bound pod keeps its cards charged.
        assert source.cache.pod_state(f"{namespace}/stuck") is not None


async def test_claim_left_by_a_failed_bind_without_a_lock_is_cleared(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    await nodesim.make_node(kube, node_name, count=2, memory_mib=81920)
    await crashed_bind(control_plane, kube, namespace, node_name, "claim", age_s=10, bound=False)
    await locks.release(kube, node_name, namespace, "claim")
    async with stack(kube) as (source, sweeper, events):
        await eventually(lambda: f"{namespace}/claim" in source.unbound_claims)
        await sweeper.sweep()
        pod = await pods.get(kube, namespace, "claim")
        assert keys.VGPU_NODE not in pod.metadata.annotations
        assert (f"{namespace}/claim", "Warning", "OrphanBindCleared") in events.seen


async def test_truth_check_reads_the_node_from_the_api_when_the_watch_lags(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    await nodesim.make_node(kube, node_name, count=2, memory_mib=81920)
    cache = cluster_cache.ClusterCache(nominator=nominations.Nominator())
    source = feed.Feed(kube, cache, SETTINGS, logs.Log(0), metrics.Metrics())
    for inf in source.informers:  # listed once, never watching: the watch "lags" forever
        await inf.relist()
    # Another writer's pod appears after our list, then we take the lock.
    await crashed_bind(control_plane, kube, namespace, node_name, "other", age_s=0, bound=True)
    key = f"{namespace}/other"
    assert cache.pod_state(key) is None
    rv = (await locks.read_node(kube, node_name)).metadata.resource_version
    await source.settle(node_name, rv)
    assert cache.pod_state(key) is cluster_cache.PodState.ADDED
    assert cache.snapshot().nodes[node_name].usage[0].memory_mib == 40000


async def test_lock_left_by_a_bind_killed_before_its_binding_is_released(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    """The bind's only write before the Binding is the node lock (the annotations travel in the
    Binding), so a bind killed there leaves a lock naming a Pending pod that carries nothing."""
    await nodesim.make_node(kube, node_name, count=2, memory_mib=81920)
    h.create_pod(control_plane, namespace, "killed", gpus=1)
    current = await locks.read_node(kube, node_name)
    taken = time.time() - 10
    await locks._write(
        kube, node_name, lockcodec.encode(taken, namespace, "killed"), current.metadata.resource_version
    )
    async with stack(kube) as (source, sweeper, events):
        await sweeper.sweep()
        node = await locks.read_node(kube, node_name)
        assert keys.NODE_LOCK not in node.metadata.annotations
        pod = await pods.get(kube, namespace, "killed")
        assert pod.spec.node_name == "" and keys.VGPU_NODE not in pod.metadata.annotations
        assert (f"{namespace}/killed", "Warning", "OrphanBindCleared") in events.seen
        assert source.cache.pod_state(f"{namespace}/killed") is None


async def test_truth_check_charges_a_pod_bound_with_its_annotations_in_the_binding(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    """Another replica's bind wrote its claim in the Binding only: no ``hami.io/vgpu-node`` label."""
    await nodesim.make_node(kube, node_name, count=2, memory_mib=81920)
    cache = cluster_cache.ClusterCache(nominator=nominations.Nominator())
    source = feed.Feed(kube, cache, SETTINGS, logs.Log(0), metrics.Metrics())
    for inf in source.informers:  # listed once, never watching: the watch "lags" forever
        await inf.relist()
    uuid = nodesim.cards(node_name, count=2)[1].uuid
    uid = h.create_pod(control_plane, namespace, "other", gpus=1)["metadata"]["uid"]
    ann = {
        keys.VGPU_NODE: node_name,
        keys.VGPU_TIME: str(int(time.time())),
        keys.DEVICES_ALLOCATED: f"{uuid},NVIDIA,30000,0:;",
        keys.DEVICES_TO_ALLOCATE: f"{uuid},NVIDIA,30000,0:;",
        keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING,
        keys.BIND_TIME: str(int(time.time())),
    }
    assert await binder.KubeBinder(kube).bind(namespace, "other", uid, node_name, ann)
    key = f"{namespace}/other"
    assert keys.VGPU_NODE not in (await pods.get(kube, namespace, "other")).metadata.labels
    assert cache.pod_state(key) is None
    # Our bind takes the node lock after that Binding, and settles up to the lock write.
    h.create_pod(control_plane, namespace, "mine", gpus=1)
    rv = (await locks.acquire(kube, node_name, namespace, "mine")).resource_version
    await source.settle(node_name, rv)
    assert cache.pod_state(key) is cluster_cache.PodState.ADDED
    assert cache.snapshot().nodes[node_name].usage[1].memory_mib == 30000
