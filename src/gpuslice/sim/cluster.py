"""The simulated cluster: node states in rank order plus numpy mirrors for a vectorised pre-filter.

The pre-filter answers "which nodes can take this pod" for all nodes at once (free CPU and memory,
card model, number of cards with free milli >= d). It must agree with ``fit.place``, which then
produces the real allocation on the chosen node (a property test checks the two agree).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuslice.model import allocations, nodes
from gpuslice.policy import shares
from gpuslice.sim import trace


class Cluster:
    """Mutable node states (``TaggedNodeState``) with per-node version counters.

    Attributes:
        states: node states, index = position in rank order.
        cpu_free: free CPU per node.
        mem_free: free host memory per node.
        free: free milli per card, ``-1`` past a node's last card.
        version: bumped on every change of a node (score caches compare against it).
    """

    def __init__(self, inventories: Sequence[nodes.NodeInventory]) -> None:
        self.states: list[nodes.NodeState] = [
            shares.tagged(nodes.empty_state(inv), ()) for inv in inventories
        ]
        n = len(inventories)
        width = max((len(inv.devices) for inv in inventories), default=0)
        self.cpu_free = np.array([inv.cpu_milli for inv in inventories], dtype=np.int64)
        self.mem_free = np.array([inv.memory_mib for inv in inventories], dtype=np.int64)
        self.free = np.full((n, max(width, 1)), -1, dtype=np.int64)
        for j, inv in enumerate(inventories):
            self.free[j, : len(inv.devices)] = shares.FULL
        self.gpus = np.array([len(inv.devices) for inv in inventories], dtype=np.int64)
        self.capacity_milli = int(self.gpus.sum()) * shares.FULL
        self.version = np.zeros(n, dtype=np.int64)
        self._models = [inv.model for inv in inventories]
        self._type_masks: dict[tuple[str, ...], np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.states)

    def type_mask(self, types: tuple[str, ...]) -> np.ndarray:
        """Nodes whose card model satisfies ``types`` (cached per type list)."""
        mask = self._type_masks.get(types)
        if mask is None:
            mask = np.array([shares.type_allowed(m, types) and bool(m) for m in self._models], dtype=bool)
            self._type_masks[types] = mask
        return mask

    def feasible(self, pod: trace.TracePod) -> np.ndarray:
        """Indices (ascending rank) of the nodes that can take the pod."""
        mask = (self.cpu_free >= pod.cpu_milli) & (self.mem_free >= pod.memory_mib)
        if pod.count > 0:
            if pod.types:
                mask &= self.type_mask(pod.types)
            mask &= (self.free >= pod.share).sum(axis=1) >= pod.count
        return np.flatnonzero(mask)

    def commit(self, j: int, alloc: allocations.PodAllocation, tag: str, sign: int = 1) -> None:
        """Add (sign 1) or remove (sign -1) a pod's allocation on node j."""
        old = self.states[j]
        new = allocations.apply(old, alloc, sign)
        state = shares.tagged(new, shares.add_tag(shares.tags_of(old), tag, sign))
        self.states[j] = state
        self.cpu_free[j] = state.cpu_free_milli
        self.mem_free[j] = state.memory_free_mib
        cards = shares.free_milli(state)
        self.free[j, : len(cards)] = cards
        self.version[j] += 1

    def used_milli(self) -> int:
        """Allocated milli-GPU over the cluster."""
        return self.capacity_milli - int(np.where(self.free > 0, self.free, 0).sum())
