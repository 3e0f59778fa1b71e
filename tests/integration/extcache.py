"""The extender's cache fed from a real kube-apiserver, and a wait for a node's state in it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from gpuslice.cache import cache as caches
from gpuslice.extender import config, feed
from gpuslice.extender import metrics as ext_metrics
from gpuslice.framework import logs, nominations
from gpuslice.kube import client as kclient
from gpuslice.model import nodes

WAIT_S = 15.0


@contextlib.asynccontextmanager
async def extender_cache(kube: kclient.KubeClient, job_label: str = "") -> AsyncIterator[caches.ClusterCache]:
    """The extender's informers feeding a cluster cache, as ``gpuslice serve`` runs them."""
    cache = caches.ClusterCache(nominator=nominations.Nominator())
    f = feed.Feed(kube, cache, config.Settings(job_label=job_label), logs.Log(), ext_metrics.Metrics())
    async with f.running():
        yield cache


async def cached(
    cache: caches.ClusterCache, node: str, pred: Callable[[nodes.NodeState], bool], timeout: float = WAIT_S
) -> nodes.NodeState:
    """The node's state once ``pred`` holds for it (``TimeoutError`` after ``timeout`` seconds)."""

    async def poll() -> nodes.NodeState:
        while True:
            state = cache.snapshot().nodes.get(node)
            if state is not None and pred(state):
                return state
            await asyncio.sleep(0.05)

    return await asyncio.wait_for(poll(), timeout)
