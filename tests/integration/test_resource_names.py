"""Renamed GPU resources through the extender's real informers: ResourceQuota keys follow the names.

``gpuslice serve`` builds its quota informer (``kube.sync.Sync`` inside ``extender.feed.Feed``)
from ``Settings.request_config``; this runs that feed against a real kube-apiserver with renamed
resources and reads the namespace limits the cache ends up with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from gpuslice.cache import cache as caches
from gpuslice.extender import config, feed, metrics
from gpuslice.framework import logs, nominations
from gpuslice.kube import client as kclient
from gpuslice.policy import quota as quotas
from gpuslice_dev.controlplane import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

WAIT_S = 10.0
RENAMED = config.validate(
    {
        "resource_count_name": "example.com/vgpu",
        "resource_memory_name": "example.com/vmem",
        "resource_memory_percentage_name": "example.com/vmem-percentage",
        "resource_core_name": "example.com/vcores",
        "memory_factor": 2,
    }
)


async def eventually(pred: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not pred():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), WAIT_S)


def create_quota(cp: ControlPlane, namespace: str, name: str, hard: dict[str, str]) -> None:
    body: dict[str, Any] = {"metadata": {"name": name}, "spec": {"hard": hard}}
    status, obj = cp.api_request("POST", f"/api/v1/namespaces/{namespace}/resourcequotas", body)
    assert status == 201, obj


def limits(cache: caches.ClusterCache, namespace: str) -> tuple[int | None, ...] | None:
    view: quotas.QuotaView | None = cache.snapshot().quota(namespace)
    return None if view is None else (view.count_limit, view.memory_limit, view.cores_limit)


async def test_quota_keys_follow_the_configured_names(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str
) -> None:
    create_quota(
        control_plane,
        namespace,
        "renamed",
        {
            "requests.example.com/vgpu": "4",
            "limits.example.com/vmem": "20000",
            "example.com/vcores": "150",
            "nvidia.com/gpu": "1",  # an ordinary resource under these names
            "nvidia.com/cores": "1",  # the alias belongs to the default cores name only
        },
    )
    cache = caches.ClusterCache(nominator=nominations.Nominator())
    source = feed.Feed(kube, cache, RENAMED, logs.Log(), metrics.Metrics())
    assert source.sync.request_config == RENAMED.request_config
    async with source.running():
        # memory limits are multiplied by memory_factor, as requests are
        await eventually(lambda: limits(cache, namespace) == (4, 40000, 150))


async def test_default_names_read_the_nvidia_cores_alias(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str
) -> None:
    create_quota(control_plane, namespace, "design-doc", {"limits.nvidia.com/cores": "80"})
    create_quota(
        control_plane, namespace, "hami", {"limits.nvidia.com/gpucores": "90", "nvidia.com/gpu": "2"}
    )
    cache = caches.ClusterCache(nominator=nominations.Nominator())
    async with feed.Feed(kube, cache, config.Settings(), logs.Log(), metrics.Metrics()).running():
        await eventually(lambda: limits(cache, namespace) == (2, None, 80))
