"""Card sets that meet a pod's ``gpu-topology-requirement`` (``requests.TopologyRequirement``).

A pair of cards (positions in ``inventory.devices``) qualifies when the node's topology lists both
and, as asked, they share at least one active NVLink (the weaker direction's count) and their link
bandwidth (``Topology.pair_bandwidth``, the weaker direction) is at least the minimum. A set
qualifies when every pair in it does, i.e. it is a clique of the qualifying-pair graph, so ``fit``
offers the card policy the *maximal* cliques of the eligible cards that hold enough cards
(``groups``; any ``count`` cards of one are a qualifying set). A node without a topology has no
qualifying pair; one whose topology carries no bandwidth has none under a minimum bandwidth (the
requirement cannot be checked there, so it is not met: docs/topology.md).

Maximal cliques come from Bron-Kerbosch with pivoting (Tomita et al., "The worst-case time
complexity for generating all maximal cliques", TCS 2006) over at most a node's cards; real nodes
give a handful (an NVSwitch node: one; bridged pairs: one per pair; a hybrid cube-mesh: a few
four-card groups).
"""

from __future__ import annotations

import functools

from gpuslice.model import nodes, requests, status, topology

_EPSILON = 1e-9
"""Bandwidths are published rounded; a minimum equal to a published value is met."""


def active(pod: requests.PodRequest) -> bool:
    """True when the pod's requirement restricts some container (one asking for 2+ cards)."""
    link = pod.topology
    return link is not None and link.active and pod.max_count >= 2


def pairs(state: nodes.NodeState, link: requests.TopologyRequirement) -> tuple[tuple[bool, ...], ...]:
    """``ok[i][j]``: cards i and j (device positions) qualify as a pair (module docstring)."""
    return _pairs(state.inventory.topology, tuple(d.uuid for d in state.inventory.devices), link)


@functools.lru_cache(maxsize=1024)
def _pairs(
    topo: topology.Topology | None, uuids: tuple[str, ...], link: requests.TopologyRequirement
) -> tuple[tuple[bool, ...], ...]:
    n = len(uuids)
    if topo is None:
        return tuple((False,) * n for _ in range(n))
    pos = [topo.position(u) for u in uuids]
    rows = []
    for i in range(n):
        row = []
        for j in range(n):
            a, b = pos[i], pos[j]
            row.append(i != j and a is not None and b is not None and _pair_ok(topo, a, b, link))
        rows.append(tuple(row))
    return tuple(rows)


def _pair_ok(topo: topology.Topology, a: int, b: int, link: requests.TopologyRequirement) -> bool:
    if link.require_nvlink and topo.pair_nvlinks(a, b) <= 0:
        return False
    if link.min_bandwidth_gbps > 0:
        bw = topo.pair_bandwidth(a, b)
        if bw is None or bw + _EPSILON < link.min_bandwidth_gbps:
            return False
    return True


def cliques(ok: tuple[tuple[bool, ...], ...], members: tuple[int, ...], k: int) -> list[tuple[int, ...]]:
    """The maximal cliques of ``ok`` among ``members`` with at least ``k`` cards, each sorted.

    Ordered smallest first, then by their cards: a container takes its cards from the tightest
    group that holds it, keeping larger well-connected groups whole for larger requests.
    """
    out: list[tuple[int, ...]] = []
    adj = {v: frozenset(u for u in members if ok[v][u]) for v in members}

    def expand(r: frozenset[int], p: frozenset[int], x: frozenset[int]) -> None:
        if len(r) + len(p) < k:
            return  # cannot grow to k cards
        if not p and not x:
            out.append(tuple(sorted(r)))
            return
        pivot = max(p | x, key=lambda u: (len(adj[u] & p), -u))
        for v in sorted(p - adj[pivot]):
            expand(r | {v}, p & adj[v], x & adj[v])
            p = p - {v}
            x = x | {v}

    expand(frozenset(), frozenset(members), frozenset())
    return sorted(out, key=lambda c: (len(c), c))


def satisfied(ok: tuple[tuple[bool, ...], ...], chosen: tuple[int, ...]) -> bool:
    """True when every pair of ``chosen`` qualifies."""
    return all(ok[a][b] for x, a in enumerate(chosen) for b in chosen[x + 1 :])


def groups(
    state: nodes.NodeState, link: requests.TopologyRequirement, eligible: tuple[int, ...], k: int
) -> tuple[tuple[tuple[bool, ...], ...], list[tuple[int, ...]]]:
    """The pair table and the maximal qualifying groups of ``eligible`` with at least ``k`` cards."""
    ok = pairs(state, link)
    return ok, cliques(ok, eligible, k)


def reason(
    state: nodes.NodeState, link: requests.TopologyRequirement, eligible: tuple[int, ...], k: int
) -> str:
    """Why no group exists.

    ``NVLINK_REQUIRED`` when NVLink alone already leaves no ``k`` cards connected pairwise, else
    ``INSUFFICIENT_GPU_BANDWIDTH``.
    """
    if link.require_nvlink:
        nvlink_only = requests.TopologyRequirement(require_nvlink=True)
        if not cliques(pairs(state, nvlink_only), eligible, k):
            return status.NVLINK_REQUIRED
    return status.INSUFFICIENT_GPU_BANDWIDTH
