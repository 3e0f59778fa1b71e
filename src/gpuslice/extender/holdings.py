"""A held pod's own charge, read from the cache, for ``framework.explain`` to release.

``/explain``, the cluster view and ``gpuslice explain`` judge a bound pod (or one whose bind is
in flight) without its own cards: ``held`` reads its allocation and what the cache charges it on
its node (``cache.ClusterCache.pod_allocation`` and ``pods_on``). A cache without those reads
(a test double) holds nothing.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from gpuslice.cache import cache as caches
from gpuslice.framework import explain as explains
from gpuslice.model import allocations


@runtime_checkable
class Holdings(Protocol):
    """The cache reads ``held`` needs (``cache.ClusterCache``)."""

    def pod_allocation(self, key: str) -> allocations.PodAllocation | None:
        """The allocation the cache charges for the pod."""
        ...

    def pods_on(self, node: str) -> tuple[caches.HeldPod, ...]:
        """What each pod charged on the node holds."""
        ...


def held(cache: object, key: str, uid: str = "") -> explains.Held | None:
    """The pod ``namespace/name``'s charge as the cache holds it; None when it holds none.

    ``uid``: the pod's UID; a held pod of the same name but another UID (an older pod) is not it.
    """
    if not isinstance(cache, Holdings):
        return None
    alloc = cache.pod_allocation(key)
    if alloc is None:
        return None
    charge = next((p for p in cache.pods_on(alloc.node) if p.key == key), None)
    if charge is None or (uid and charge.uid and charge.uid != uid):
        return None
    return explains.Held(
        node=alloc.node,
        cards=tuple(dict.fromkeys(g.uuid for c in alloc.containers for g in c)),
        reservation=charge.reservation,
        cpu_milli=charge.cpu_milli,
        memory_mib=charge.memory_mib,
    )
