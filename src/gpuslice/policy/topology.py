"""``topology-aware``: choose well-connected card sets and prefer nodes that can offer one.

Registered names (the strategy is part of the name, since policy args are numeric):

* ``topology-aware`` and ``topology-aware:highest-bandwidth``
* ``topology-aware:balanced-utilization`` (idle cards earn a bonus: ``(k - 1) * 50 * free_mem /
  card_mem``, i.e. a wholly idle card is worth a same-switch link to each other chosen card)
* ``topology-aware:lowest-fragmentation``

Card choice (``cardsets.best``) uses HAMi's pair score (PCIe level score + 100 per NVLink; the
smaller of the two directions, so asymmetric links count as their weaker side). Without a
topology, or for cards it does not list, pairs score 0: every set is equal and the lowest indices
win.

Node score = ``(50 * numa + 30 * pcie + 20 * p2p) // 100`` over the cards the pod would get on the
node (its largest GPU container, as ``fit.place`` with this policy picks them):

* ``numa`` = 100 * (most chosen cards on one NUMA node) // (chosen cards);
* ``pcie`` = mean over chosen pairs of ``2 * (50 - level)`` (same board 100, one switch 80,
  several switches 60, host bridge 40, same CPU 20, across CPUs 0);
* ``p2p`` = mean over chosen pairs of 100 (NVLink), 50 (PCIe peer-to-peer) or 0.

A single card has nothing to connect: ``pcie`` = ``p2p`` = 100. Without a topology both are a
neutral 50.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from gpuslice.model import nodes, requests, topology
from gpuslice.policy import cardsets, fit, registry

NEUTRAL = 50
_BONUS_UNIT = 50


@functools.lru_cache(maxsize=1024)
def _weights(topo: topology.Topology | None, uuids: tuple[str, ...]) -> cardsets.Weights:
    """Pair scores indexed by device position (0 where the topology does not know a card)."""
    n = len(uuids)
    if topo is None:
        return tuple((0,) * n for _ in range(n))
    pos = [topo.position(u) for u in uuids]
    out = []
    for i in range(n):
        row = []
        for j in range(n):
            a, b = pos[i], pos[j]
            row.append(
                0 if i == j or a is None or b is None else min(topo.pair_score(a, b), topo.pair_score(b, a))
            )
        out.append(tuple(row))
    return tuple(out)


def weights(state: nodes.NodeState) -> cardsets.Weights:
    """The node's pair-score matrix by device position."""
    inv = state.inventory
    return _weights(inv.topology, tuple(d.uuid for d in inv.devices))


class TopologyAware:
    """Connectivity-maximising card choice and topology node score (module docstring)."""

    def __init__(self, strategy: cardsets.Strategy, args: Mapping[str, float]) -> None:
        """Validate the (empty) args."""
        if args:
            raise ValueError(f"topology-aware takes no args, got {sorted(args)}")
        self.strategy = strategy
        self.name = (
            "topology-aware"
            if strategy is cardsets.Strategy.HIGHEST_BANDWIDTH
            else f"topology-aware:{strategy.value}"
        )

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: registry.Context,
    ) -> tuple[int, ...] | None:
        """The best-connected ``request.count`` eligible cards for the strategy."""
        bonus = None
        if self.strategy is cardsets.Strategy.BALANCED_UTILIZATION:
            unit = (request.count - 1) * _BONUS_UNIT
            bonus = tuple(
                0 if d.memory_mib <= 0 else max(0, unit * state.free_memory(i) // d.memory_mib)
                for i, d in enumerate(state.inventory.devices)
            )
        return cardsets.best(weights(state), eligible, request.count, self.strategy, bonus)

    def score_node(
        self, state: nodes.NodeState, pod: requests.PodRequest, ctx: registry.Context
    ) -> registry.Scored:
        """How well connected the pod's cards would be here (0..100)."""
        placed = fit.place(state, pod, self, ctx)
        if placed.allocation is None:
            return registry.Scored(0)
        biggest = max(placed.allocation.containers, key=len, default=())
        index = {d.uuid: i for i, d in enumerate(state.inventory.devices)}
        return registry.Scored(set_score(state, tuple(index[g.uuid] for g in biggest)))


def set_score(state: nodes.NodeState, chosen: tuple[int, ...]) -> int:
    """The node score of a card set (module docstring)."""
    if not chosen:
        return registry.MAX_SCORE
    devs = state.inventory.devices
    per_numa: dict[int, int] = {}
    for i in chosen:
        per_numa[devs[i].numa] = per_numa.get(devs[i].numa, 0) + 1
    numa = 100 * max(per_numa.values()) // len(chosen)
    topo = state.inventory.topology
    if len(chosen) == 1:
        pcie = p2p = 100
    elif topo is None:
        pcie = p2p = NEUTRAL
    else:
        pcie_sum = p2p_sum = pairs = 0
        for x, i in enumerate(chosen):
            for j in chosen[x + 1 :]:
                a, b = topo.position(devs[i].uuid), topo.position(devs[j].uuid)
                pairs += 1
                if a is None or b is None:
                    pcie_sum += NEUTRAL
                    p2p_sum += NEUTRAL
                    continue
                pcie_sum += 2 * (topology.PcieLevel.SYSTEM - max(topo.pcie[a][b], topo.pcie[b][a]))
                p2p_sum += (
                    100 if min(topo.nvlinks[a][b], topo.nvlinks[b][a]) > 0 else 50 if topo.p2p[a][b] else 0
                )
        pcie, p2p = pcie_sum // pairs, p2p_sum // pairs
    return (50 * numa + 30 * pcie + 20 * p2p) // 100


def _factory(strategy: cardsets.Strategy) -> registry.PolicyFactory:
    return lambda args: TopologyAware(strategy, args)


registry.register("topology-aware", _factory(cardsets.Strategy.HIGHEST_BANDWIDTH))
for _s in cardsets.Strategy:
    registry.register(f"topology-aware:{_s.value}", _factory(_s))
