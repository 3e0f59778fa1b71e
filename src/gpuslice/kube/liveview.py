"""A one-shot view of a live cluster: nodes, pods and ResourceQuotas listed once into a cache.

``load`` lists each kind once with the informers the extender runs (``kube.sync.Sync``), so every
object goes through the same decoding (registrations, allocations from pod annotations, quota
limits) and lands in a ``ClusterCache`` as it would in a running extender; nothing is watched.
``read_pod`` reads one pod. Used by ``gpuslice explain`` without ``--extender``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from gpuslice.cache import cache as cluster_cache
from gpuslice.kube import client as kclient
from gpuslice.kube import errors, objects, pods, sync
from gpuslice.model import config as model_config
from gpuslice.model import nodes


class LiveView(NamedTuple):
    """What ``load`` read.

    Attributes:
        cache: the cache fed from the lists.
        invalid_nodes: node -> why its GPU registration does not decode.
        nodes: every listed node as decoded (for liveness checks).
    """

    cache: cluster_cache.ClusterCache
    invalid_nodes: dict[str, str]
    nodes: tuple[objects.Node, ...]


async def load(
    kube: kclient.KubeClient,
    cache: cluster_cache.ClusterCache,
    request_config: model_config.RequestConfig = model_config.DEFAULT_REQUEST_CONFIG,
    transform: Callable[[nodes.NodeInventory], nodes.NodeInventory] | None = None,
    claim_expiry_s: float | None = None,
) -> LiveView:
    """List nodes, pods and ResourceQuotas once into ``cache`` (an empty one, say).

    ``claim_expiry_s``: another scheduler's filter claims older than this, with no lock naming
    their pod, are not charged, as in the extender (``kube.claims``; None: every claim is).

    Raises:
        errors.ApiError: a list failed.
    """
    feed = sync.Sync(
        kube, cache, request_config=request_config, transform=transform, claim_expiry_s=claim_expiry_s
    )
    for informer_ in feed.informers:
        await informer_.relist()
    return LiveView(cache, dict(feed.invalid_nodes), tuple(feed.nodes.store.values()))


async def read_pod(kube: kclient.KubeClient, namespace: str, name: str) -> objects.Pod | None:
    """The pod, or None when there is no such pod.

    Raises:
        errors.ApiError: any failure but a 404.
    """
    try:
        return await pods.get(kube, namespace, name)
    except errors.NotFound:
        return None
