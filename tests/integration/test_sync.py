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
from gpuslice.cache import shapes
from gpuslice.codec import keys, pod_devices
from gpuslice.framework import nominations
from gpuslice.kube import client as kclient
from gpuslice.kube import events, pods, sync
from gpuslice.model import allocations, status
from gpuslice.model import config as model_config
from gpuslice.policy import api
from gpuslice_dev import nodesim
from gpuslice_dev.controlplane import ControlPlane
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

    cache = cluster_cache.ClusterCache(nominator=nominations.Nominator())
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


def _labelled_pod(name: str, label: str, cpu: str, *, gpus: int = 0, node: str = "") -> dict[str, Any]:
    body = h.pod_body(name, gpus=gpus, node_name=node or None)
    body["metadata"]["labels"] = {"gpuslice.io/test": label}
    resources = body["spec"]["containers"][0]["resources"]
    resources["requests"] = {"cpu": cpu}
    return body


async def test_pending_pods_without_gpus_enter_the_target_workload(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str
) -> None:
    # FGD's target workload includes pods that ask no GPU; the filter never sees them, so the pod
    # feed observes each one once, when it first sees it pending. GPU pods are the filter's.
    label = unique("observe")
    histogram = shapes.ShapeHistogram(model_config.WorkloadSettings(min_count=1, drift=0.0))
    cache = cluster_cache.ClusterCache(histogram, nominator=nominations.Nominator())
    path = f"/api/v1/namespaces/{namespace}/pods"
    for body in (
        _labelled_pod("cpu-a", label, "1500m"),
        _labelled_pod("cpu-b", label, "1500m"),
        _labelled_pod("cpu-c", label, "250m"),
        _labelled_pod("gpu", label, "4", gpus=1),  # the filter observes it, not the feed
        _labelled_pod("bound", label, "2", node="somewhere"),  # already placed: not an arrival
    ):
        code, got = control_plane.api_request("POST", path, body)
        assert code == 201, got
    s = sync.Sync(kube, cache, pod_selector=f"gpuslice.io/test={label}")
    async with s:
        await eventually(s.readiness)
        await eventually(lambda: histogram.count == 3)
        # an update of an observed pod is not a new arrival
        control_plane.api_request("PATCH", f"{path}/cpu-a", {"metadata": {"annotations": {"x": "1"}}})
        h.create_pod(control_plane, namespace, "unlabelled")  # outside the selector: never seen
        code, got = control_plane.api_request("POST", path, _labelled_pod("cpu-d", label, "250m"))
        assert code == 201, got
        await eventually(lambda: histogram.count == 4)
        await asyncio.sleep(0.3)
    assert histogram.count == 4
    got_weights = histogram.weights()
    assert set(got_weights) == {
        api.Shape(cpu_milli=1500, share_milli=0, count=0),
        api.Shape(cpu_milli=250, share_milli=0, count=0),
    }
