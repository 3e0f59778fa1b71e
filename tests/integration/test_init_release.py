"""Init containers release their peak: real kube-apiserver -> kube.sync.Sync informers -> ClusterCache.

A GPU pod whose allocation gives its init container 5000 MiB on card A and its app container
1500 MiB (and 20 cores) on card A is charged 5000 MiB until kubelet reports the init container
terminated with exit code 0; the pod's status is patched through the ``status`` subresource as
kubelet would. A running init container, or one that exited 1, releases nothing. The bind path's
truth check (``kube.pods.list_claimed``) sees the same status, so it charges the same.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpuslice.cache import cache as cluster_cache
from gpuslice.codec import keys, pod_devices
from gpuslice.framework import nominations
from gpuslice.kube import client as kclient
from gpuslice.kube import informer, pods, sync
from gpuslice.model import allocations, nodes
from gpuslice_dev import nodesim
from gpuslice_dev.controlplane import ControlPlane
from tests.chaos import audit
from tests.integration import kubehelpers as h
from tests.integration.conftest import unique

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

WAIT_S = 10.0
STARTED = "2026-01-01T00:00:00Z"
IMAGE = "registry.k8s.io/pause:3.10"


async def eventually(pred: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not pred():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), WAIT_S)


def gpu(count: int) -> dict[str, Any]:
    return {"limits": {"nvidia.com/gpu": str(count)}}


def pod_body(name: str, node: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        # the label HAMi's scheduler writes with the annotations
        "metadata": {"name": name, "annotations": annotations, "labels": {keys.VGPU_NODE: node}},
        "spec": {
            "schedulerName": "gpuslice-test-none",
            "nodeName": node,
            "initContainers": [{"name": "warmup", "image": IMAGE, "resources": gpu(1)}],
            "containers": [{"name": "main", "image": IMAGE, "resources": gpu(1)}],
        },
    }


def init_status(state: dict[str, Any]) -> dict[str, Any]:
    """A pod status as kubelet writes it while or after running the init container."""
    terminated = "terminated" in state and state["terminated"]["exitCode"] == 0
    return {
        "phase": "Running" if terminated else "Pending",
        "initContainerStatuses": [
            {
                "name": "warmup",
                "image": IMAGE,
                "imageID": "",
                "ready": terminated,
                "restartCount": 0,
                "state": state,
            }
        ],
    }


RUNNING = {"running": {"startedAt": STARTED}}


def exited(code: int) -> dict[str, Any]:
    reason = "Completed" if code == 0 else "Error"
    return {"terminated": {"exitCode": code, "reason": reason, "startedAt": STARTED, "finishedAt": STARTED}}


async def test_init_peak_is_released_once_the_init_container_succeeded(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str
) -> None:
    label = unique("init")
    node = f"{label}-node"
    await nodesim.make_node(kube, node, count=2, labels={"gpuslice.io/test": label})
    card_a, card_b = nodesim.card_uuids(node, 2)
    alloc = allocations.PodAllocation(
        node=node,
        containers=(
            (allocations.DeviceGrant(uuid=card_a, memory_mib=5000, cores=0),),
            (allocations.DeviceGrant(uuid=card_a, memory_mib=1500, cores=20),),
        ),
        init_count=1,
    )
    status_code, body = control_plane.api_request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        pod_body("trainer", node, pod_devices.bind_annotations(alloc, time.time())),
    )
    assert status_code == 201, body
    status_code, body = control_plane.api_request(
        "POST",
        f"/api/v1/namespaces/{namespace}/resourcequotas",
        {"metadata": {"name": "gpu"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "20000"}}},
    )
    assert status_code == 201, body

    cache = cluster_cache.ClusterCache(nominator=nominations.Nominator())
    key = f"{namespace}/trainer"
    full = (nodes.CardUsage(1, 5000, 20), nodes.EMPTY_CARD, (1, 5000, 20))
    app = (nodes.CardUsage(1, 1500, 20), nodes.EMPTY_CARD, (1, 1500, 20))

    def charged() -> tuple[nodes.CardUsage, nodes.CardUsage, tuple[int, int, int]]:
        snap = cache.snapshot()
        q = snap.quota(namespace)
        assert q is not None and q.memory_limit == 20000
        usage = snap.nodes[node].usage
        return usage[0], usage[1], (q.used_count, q.used_memory, q.used_cores)

    def audited() -> tuple[nodes.CardUsage, nodes.CardUsage]:
        """The chaos oracle's usage of the two cards, rebuilt from one API read alone."""
        cards = audit.api_usage(*audit.read(control_plane)).cards
        a, b = (nodes.CardUsage(c.slots, c.memory_mib, c.cores) for c in (cards[card_a], cards[card_b]))
        return a, b

    try:
        s = sync.Sync(kube, cache, node_selector=f"gpuslice.io/test={label}")
        async with s:
            await eventually(s.readiness)
            await eventually(lambda: cache.snapshot().quota(namespace) is not None)
            assert card_b == cache.snapshot().nodes[node].inventory.devices[1].uuid
            assert charged() == full
            assert audited() == full[:2]

            # The init container runs, then fails: nothing is released. The watch has applied
            # each patch (its resourceVersion) before the charge is read.
            for state in (RUNNING, exited(1)):
                patched = await pods.patch_status(kube, namespace, "trainer", init_status(state))
                assert not patched.inits_done
                assert await s.pods.wait_for(patched.metadata.resource_version, WAIT_S)
                seen = s.pods.store.get(key)
                assert seen is not None and seen.status == patched.status
                assert charged() == full
                assert audited() == full[:2]

            # Kubelet retries it and it exits 0: card A and the namespace shrink to the app charge.
            patched = await pods.patch_status(kube, namespace, "trainer", init_status(exited(0)))
            assert patched.inits_done
            assert await s.pods.wait_for(patched.metadata.resource_version, WAIT_S)
            assert charged() == app
            assert audited() == app[:2]

            # The bind path's truth check reads the node's pods from the API: status included,
            # so applying them charges the same.
            claimed = await pods.list_claimed(kube, node)
            assert [(p.key, p.inits_done) for p in claimed] == [(key, True)]
            cache.remove_pod(key)
            assert charged() == (nodes.EMPTY_CARD, nodes.EMPTY_CARD, (0, 0, 0))
            for p in claimed:
                s.on_pod(informer.Event(informer.EventType.MODIFIED, p))
            assert charged() == app

            # The pod finishes: everything is released.
            await pods.patch_status(kube, namespace, "trainer", {"phase": "Succeeded"})
            await eventually(lambda: cache.pod_state(key) is None)
            assert charged() == (nodes.EMPTY_CARD, nodes.EMPTY_CARD, (0, 0, 0))
    finally:
        control_plane.api_request("DELETE", f"/api/v1/nodes/{node}")
        h.delete_pod(control_plane, namespace, "trainer")


async def test_a_failed_init_container_keeps_the_peak(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str
) -> None:
    """restartPolicy Never: the init container exits 1, the pod fails; until then the peak stays."""
    label = unique("initfail")
    node = f"{label}-node"
    await nodesim.make_node(kube, node, count=1, labels={"gpuslice.io/test": label})
    (card_a,) = nodesim.card_uuids(node, 1)
    alloc = allocations.PodAllocation(
        node=node,
        containers=(
            (allocations.DeviceGrant(uuid=card_a, memory_mib=5000, cores=0),),
            (allocations.DeviceGrant(uuid=card_a, memory_mib=1500, cores=0),),
        ),
        init_count=1,
    )
    body = pod_body("once", node, pod_devices.bind_annotations(alloc, time.time()))
    body["spec"]["restartPolicy"] = "Never"
    status_code, created = control_plane.api_request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    assert status_code == 201, created
    cache = cluster_cache.ClusterCache(nominator=nominations.Nominator())
    key = f"{namespace}/once"
    try:
        s = sync.Sync(kube, cache, node_selector=f"gpuslice.io/test={label}")
        async with s:
            await eventually(s.readiness)
            await eventually(lambda: cache.pod_state(key) is not None)
            assert cache.snapshot().nodes[node].usage[0] == nodes.CardUsage(1, 5000, 0)
            patched = await pods.patch_status(kube, namespace, "once", init_status(exited(1)))
            assert await s.pods.wait_for(patched.metadata.resource_version, WAIT_S)
            assert cache.snapshot().nodes[node].usage[0] == nodes.CardUsage(1, 5000, 0)
            await pods.patch_status(kube, namespace, "once", {"phase": "Failed"})
            await eventually(lambda: cache.pod_state(key) is None)
            assert cache.snapshot().nodes[node].usage[0] == nodes.EMPTY_CARD
    finally:
        control_plane.api_request("DELETE", f"/api/v1/nodes/{node}")
        h.delete_pod(control_plane, namespace, "once")
