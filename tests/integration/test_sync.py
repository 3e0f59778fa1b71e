"""Watches -> ClusterCache against a real kube-apiserver.

Aspects: readiness waits for every kind to list; GPU nodes appear in snapshots; a malformed
registration excludes only that node, is remembered with its reason and reported as a Warning
Event on the Node; placed pods are charged and uncharged when they finish or are deleted;
ResourceQuotas become namespace limits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpuslice.cache import cache as cluster_cache
from gpuslice.codec import keys, pod_devices
from gpuslice.devcluster import nodesim
from gpuslice.devcluster.controlplane import ControlPlane
from gpuslice.kube import client as kclient
from gpuslice.kube import events, pods, sync
from gpuslice.model import allocations, status
from tests.integration import kubehelpers as h
from tests.integration.conftest import unique

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

WAIT_S = 10.0


async def eventually(pred: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not pred():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), WAIT_S)


def card_usage(cache: cluster_cache.ClusterCache, node: str, i: int) -> tuple[int, int, int]:
    u = cache.snapshot().nodes[node].usage[i]
    return u.slots, u.memory_mib, u.cores


async def test_watches_feed_the_cache(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str
) -> None:
    label = unique("sync")
    good, bad = f"{label}-good", f"{label}-bad"
    sel = {"gpuslice.io/test": label}
    await nodesim.make_node(kube, good, count=2, labels=sel)
    await nodesim.make_node(kube, bad, count=2, labels=sel, annotations={keys.NODE_REGISTER: "[{not json"})
    card = nodesim.card_uuids(good, 2)[1]
    alloc = allocations.PodAllocation(
        node=good, containers=((allocations.DeviceGrant(uuid=card, memory_mib=3000, cores=25),),)
    )
    h.create_pod(
        control_plane,
        namespace,
        "placed",
        gpus=1,
        annotations=pod_devices.bind_annotations(alloc, time.time()),
    )
    h.create_pod(control_plane, namespace, "plain")
    status_code, body = control_plane.api_request(
        "POST",
        f"/api/v1/namespaces/{namespace}/resourcequotas",
        {
            "metadata": {"name": "gpu"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "20000", "nvidia.com/gpu": "4"}},
        },
    )
    assert status_code == 201, body

    cache = cluster_cache.ClusterCache()
    invalid: list[tuple[str, str]] = []
    try:
        async with events.Recorder(kube, instance="it-sync") as rec:
            s = sync.Sync(
                kube,
                cache,
                recorder=rec,
                on_invalid=lambda n, r: invalid.append((n, r)),
                node_selector=f"gpuslice.io/test={label}",
            )
            assert not s.readiness()
            async with s:
                await eventually(s.readiness)
                # Listed: the good node with the placed pod's usage; the bad one excluded.
                assert set(cache.snapshot().nodes) == {good}
                assert card_usage(cache, good, 1) == (1, 3000, 25)
                assert card_usage(cache, good, 0) == (0, 0, 0)
                assert list(s.invalid_nodes) == [bad] and [n for n, _ in invalid] == [bad]
                quota = cache.snapshot().quota(namespace)
                assert quota is not None and (quota.count_limit, quota.memory_limit) == (4, 20000)

                # The pod finishes: uncharged.
                await pods.patch_status(kube, namespace, "placed", {"phase": "Succeeded"})
                await eventually(lambda: card_usage(cache, good, 1) == (0, 0, 0))

                # The bad node is fixed: it joins; the good one loses its registration: it leaves.
                fixed = {
                    keys.NODE_REGISTER: control_plane.api_request("GET", f"/api/v1/nodes/{good}")[1][
                        "metadata"
                    ]["annotations"][keys.NODE_REGISTER]
                }
                control_plane.api_request(
                    "PATCH", f"/api/v1/nodes/{bad}", {"metadata": {"annotations": fixed}}
                )
                control_plane.api_request(
                    "PATCH",
                    f"/api/v1/nodes/{good}",
                    {"metadata": {"annotations": {keys.NODE_REGISTER: None}}},
                )
                await eventually(lambda: set(cache.snapshot().nodes) == {bad})
                assert s.invalid_nodes == {}
                control_plane.api_request("DELETE", f"/api/v1/namespaces/{namespace}/resourcequotas/gpu")
                await eventually(lambda: cache.snapshot().quota(namespace) is None)
                assert s.readiness()
            await rec.flush()
        warnings = [
            e
            for e in _events(control_plane, "default")
            if e["regarding"]["name"] == bad and e["reason"] == status.NODE_REGISTRATION_INVALID
        ]
        assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
    finally:
        for n in (good, bad):
            control_plane.api_request("DELETE", f"/api/v1/nodes/{n}")


def _events(control_plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    status_code, body = control_plane.api_request(
        "GET", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"
    )
    assert status_code == 200, body
    items: list[dict[str, Any]] = body["items"]
    return items
