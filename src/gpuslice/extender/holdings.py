"""A held pod's own charge, read from the cache, for ``framework.explain`` to release.

``/explain``, the cluster view and ``gpuslice explain`` judge a bound pod (or one whose bind is
in flight) without its own cards: ``held`` reads its allocation and what the cache charges it on
its node (``cache.ClusterCache.pod_allocation`` and ``pods_on``).
"""

from __future__ import annotations

from gpuslice.cache import cache as caches
from gpuslice.framework import explain as explains


def held(cache: caches.ClusterCache, key: str, uid: str = "") -> explains.Held | None:
    """The pod ``namespace/name``'s charge as the cache holds it; None when it holds none.

    ``uid``: the pod's UID; a held pod of the same name but another UID (an older pod) is not it.
    """
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
