"""Card shares in milli-GPU, the unit of the fragmentation-aware and paper policies.

A card's *free milli* is the share of it still free, ``min(1000 * free_cores / cores,
1000 * free_memory / memory)`` floored; a pod's *share* ``d`` is its per-card demand on the same
scale (1000 = a whole card). Every policy in ``paper`` and ``fragmentation`` reads the node through
these functions, so the same policy works on a simulated node and on a real HAMi node.

Pod-shape tags (``share-gpu``, ``<n>-gpu``) are what GpuClustering needs and what a plain
``NodeState`` cannot tell (two 1-GPU pods and one 2-GPU pod leave the same usage): a
``TaggedNodeState`` carries them as a multiset; for an untagged state they are estimated from usage.
"""

from __future__ import annotations

from typing import NamedTuple

from gpuslice.model import devices, nodes, requests
from gpuslice.policy import api

FULL = 1000
"""Milli-GPU of one whole card."""

SHARE_TAG = "share-gpu"
"""GpuClustering's tag of a sharing (fractional-GPU) pod."""


class Demand(NamedTuple):
    """A pod's resource shape as the share-based policies see it.

    Attributes:
        cpu_milli: host CPU request.
        share_milli: per-card share d (1000 = whole card; 0 for a CPU-only pod).
        gpus: number of cards n.
        types: allowed card models (empty = any).
    """

    cpu_milli: int
    share_milli: int
    gpus: int
    types: tuple[str, ...]

    @property
    def sharing(self) -> bool:
        """True for a fractional-GPU pod (one card, d < 1000)."""
        return self.gpus > 0 and self.share_milli < FULL

    @property
    def gpu_milli(self) -> int:
        """Total GPU demand n * d in milli-GPU."""
        return self.gpus * self.share_milli

    @property
    def tag(self) -> str:
        """GpuClustering's tag ('' for a CPU-only pod)."""
        if self.gpus == 0:
            return ""
        return SHARE_TAG if self.sharing else f"{self.gpus}-gpu"


def request_share(req: requests.ContainerRequest, card_memory_mib: int = 0) -> int:
    """Per-card share of one container request, in milli-GPU.

    An exclusive (100-core) request is a whole card; otherwise the larger of the core share and the
    memory share (a percentage, or MiB relative to ``card_memory_mib``); a request that names
    neither takes the whole card's memory, i.e. 1000.
    """
    if req.exclusive:
        return FULL
    by_cores = req.cores_clamped * FULL // devices.FULL_CORES
    if req.memory_percentage != requests.MEMORY_PERCENTAGE_UNSET and req.memory_mib == 0:
        by_memory = min(req.memory_percentage, 100) * FULL // 100
    elif req.memory_mib > 0:
        by_memory = FULL if card_memory_mib <= 0 else -(-req.memory_mib * FULL // card_memory_mib)
    else:
        by_memory = FULL
    return min(FULL, max(by_cores, by_memory))


def demand(pod: requests.PodRequest, card_memory_mib: int = 0) -> Demand:
    """The pod's demand: CPU, the largest per-card share, the total card count of its app containers."""
    count = 0
    share = 0
    for req in pod.app_containers:
        if req is None or req.count <= 0:
            continue
        count += req.count
        share = max(share, request_share(req, card_memory_mib))
    return Demand(pod.cpu_milli, share if count else 0, count, pod.selectors.use_types)


def shape_of(d: Demand) -> api.Shape:
    """The target-workload shape of a demand."""
    return api.Shape(cpu_milli=d.cpu_milli, share_milli=d.share_milli, count=d.gpus, types=d.types)


def card_free_milli(state: nodes.NodeState, i: int) -> int:
    """Free milli-GPU of card i: the smaller of its free core and memory shares (0 if unusable)."""
    dev = state.inventory.devices[i]
    use = state.usage[i]
    if not dev.health or dev.cores <= 0 or dev.memory_mib <= 0 or use.slots >= dev.split_count:
        return 0
    if dev.uuid in state.inventory.cordoned:
        return 0
    by_cores = FULL * (dev.cores - use.cores) // dev.cores
    by_memory = FULL * (dev.memory_mib - use.memory_mib) // dev.memory_mib
    return max(0, min(by_cores, by_memory))


def free_milli(state: nodes.NodeState) -> tuple[int, ...]:
    """Free milli-GPU of every card, in device order."""
    return tuple(card_free_milli(state, i) for i in range(len(state.inventory.devices)))


def type_allowed(card_type: str, types: tuple[str, ...]) -> bool:
    """True when a card model satisfies a type list (case-insensitive substring, as HAMi's selector)."""
    if not types:
        return True
    low = card_type.lower()
    return any(t.lower() in low for t in types)


def card_memory(state: nodes.NodeState) -> int:
    """Registered memory of the node's first card (0 without cards)."""
    devs = state.inventory.devices
    return devs[0].memory_mib if devs else 0


class TaggedNodeState(nodes.NodeState, frozen=True, kw_only=True):
    """A node state that also records the shape tags of the GPU pods on it.

    Attributes:
        pod_tags: a multiset of tags as sorted ``(tag, pods)`` pairs.
    """

    pod_tags: tuple[tuple[str, int], ...] = ()


def add_tag(tags: tuple[tuple[str, int], ...], tag: str, delta: int) -> tuple[tuple[str, int], ...]:
    """The tag multiset with ``delta`` pods of ``tag`` added (negative removes; '' is ignored)."""
    if not tag:
        return tags
    counts = dict(tags)
    left = counts.get(tag, 0) + delta
    if left > 0:
        counts[tag] = left
    else:
        counts.pop(tag, None)
    return tuple(sorted(counts.items()))


def tagged(state: nodes.NodeState, tags: tuple[tuple[str, int], ...]) -> TaggedNodeState:
    """The state with the given tag multiset attached."""
    return TaggedNodeState(
        inventory=state.inventory,
        usage=state.usage,
        cpu_used_milli=state.cpu_used_milli,
        memory_used_mib=state.memory_used_mib,
        pod_tags=tags,
    )


def tags_of(state: nodes.NodeState) -> tuple[tuple[str, int], ...]:
    """The recorded tag multiset, or () for an untagged state."""
    return state.pod_tags if isinstance(state, TaggedNodeState) else ()


def node_tags(state: nodes.NodeState) -> frozenset[str]:
    """The set of GPU-pod tags on the node.

    Exact for a ``TaggedNodeState``. Otherwise estimated from usage: a card held by one exclusive
    task is a ``1-gpu`` pod, any other used card holds sharing pods.
    """
    if isinstance(state, TaggedNodeState):
        return frozenset(tag for tag, _ in state.pod_tags)
    out: set[str] = set()
    for dev, use in zip(state.inventory.devices, state.usage, strict=True):
        if use.slots <= 0 and use.cores <= 0 and use.memory_mib <= 0:
            continue
        out.add("1-gpu" if use.slots == 1 and use.cores >= dev.cores else SHARE_TAG)
    return frozenset(out)


def best_cards(free: tuple[int, ...], d: Demand, eligible: tuple[int, ...]) -> tuple[int, ...] | None:
    """The paper's default GPU rule ("best").

    A sharing pod takes the eligible card with the least free milli (lowest index on ties); a
    whole-card pod takes the lowest-numbered eligible (fully free) cards.
    """
    order = sorted(eligible)
    n = d.gpus
    if len(order) < n:
        return None
    if d.sharing:
        return tuple(sorted(sorted(order, key=lambda i: (free[i], i))[:n]))
    return tuple(order[:n])
