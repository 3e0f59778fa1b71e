"""``topology-aware``: choose well-connected card sets and prefer nodes that can offer one.

Registered names (the strategy is part of the name, since policy args are numeric):

* ``topology-aware`` and ``topology-aware:highest-bandwidth``
* ``topology-aware:balanced-utilization`` (idle cards earn a bonus: ``(k - 1) * 50 * free_mem /
  card_mem``, i.e. a wholly idle card is worth a same-switch link to each other chosen card)
* ``topology-aware:lowest-fragmentation``

Card choice (``cardsets.best``) uses HAMi's pair score (``linktables``: PCIe level score + 100 per
NVLink; the smaller of the two directions, so asymmetric links count as their weaker side).
Without a topology, or for cards it does not list, pairs score 0: every set is equal and the
lowest indices win.

Node score = ``(50 * numa + 30 * pcie + 20 * p2p) // 100`` over the cards the pod would get on the
node (its largest GPU container, as ``fit.place`` with this policy picks them):

* ``numa`` = 100 * (most chosen cards on one NUMA node) // (chosen cards);
* ``pcie`` = mean over chosen pairs of ``2 * (50 - level)`` (same board 100, one switch 80,
  several switches 60, host bridge 40, same CPU 20, across CPUs 0);
* ``p2p`` = mean over chosen pairs of 100 (NVLink), 50 (PCIe peer-to-peer) or 0.

A single card has nothing to connect: ``pcie`` = ``p2p`` = 100. Without a topology both are a
neutral 50, as is every pair involving a card the topology does not list.

``score_columns`` computes the same score for many rows at once (the batch filter's fast path):
eligibility comes from ``vectorfit``, the pair tables from ``columns.links``, and rows with equal
tables, candidates, NUMA layout (and bonus) share one computation.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gpuslice.model import nodes, requests
from gpuslice.policy import cardsets, columns, fit, linktables, registry, vectorfit

NEUTRAL = linktables.NEUTRAL
_BONUS_UNIT = 50
_NUMA = columns.CARD_FIELDS.index("numa")
_LINKS_ID, _NCARDS = (columns.ROW_FIELDS.index(f) for f in ("links_id", "ncards"))


def weights(state: nodes.NodeState) -> cardsets.Weights:
    """The node's pair-score matrix by device position."""
    return linktables.of(state.inventory).weights


class TopologyAware:
    """Connectivity-maximising card choice and topology node score (module docstring)."""

    def __init__(self, strategy: cardsets.Strategy, args: Mapping[str, float]) -> None:
        """Validate the (empty) args."""
        if args:
            raise ValueError(f"topology-aware takes no args, got {sorted(args)}")
        self.strategy = strategy
        hb = strategy is cardsets.Strategy.HIGHEST_BANDWIDTH
        self.name = "topology-aware" if hb else f"topology-aware:{strategy.value}"

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
        chosen = tuple(sorted(index[g.uuid] for g in biggest))
        numa = tuple(state.inventory.devices[i].numa for i in chosen)
        return registry.Scored(_set_score(linktables.of(state.inventory), chosen, numa))

    def score_columns(
        self,
        cols: columns.NodeColumns,
        rows: columns.IntArray,
        pod: requests.PodRequest,
        ctx: registry.Context = registry.EMPTY_CONTEXT,
    ) -> columns.IntArray:
        """``score_node`` for many feasible rows of a pod ``vectorfit`` can judge."""
        req = vectorfit.request_of(pod, None)
        if req is None:
            raise ValueError("score_columns needs a pod with one GPU container (see vectorfit.request_of)")
        ok = vectorfit.eligible_cards(cols, rows, pod, req)
        node = cols.nodes[rows]
        numa_all = cols.cards[rows][:, :, _NUMA]
        bonus_all = None
        if self.strategy is cardsets.Strategy.BALANCED_UTILIZATION:
            hot = cols.hot[rows]
            unit = (req.count - 1) * _BONUS_UNIT
            total = hot[:, :, 3].astype(np.int64)
            bonus_all = np.where(
                total > 0, np.maximum(0, unit * hot[:, :, 1].astype(np.int64) // np.maximum(total, 1)), 0
            )
        out = np.zeros(len(rows), np.int64)
        memo: dict[tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...] | None], int] = {}
        ok_l, numa_l, links_l, n_l = (
            ok.tolist(),
            numa_all.tolist(),
            node[:, _LINKS_ID].tolist(),
            node[:, _NCARDS].tolist(),
        )
        bonus_l = bonus_all.tolist() if bonus_all is not None else None
        for r in range(len(rows)):
            n = n_l[r]
            cand = tuple(i for i, e in enumerate(ok_l[r][:n]) if e)
            bonus = tuple(bonus_l[r][:n]) if bonus_l is not None else None
            key = (links_l[r], cand, tuple(numa_l[r][:n]), bonus)
            got = memo.get(key)
            if got is None:
                tables = cols.links[links_l[r]]
                chosen = cardsets.best(tables.weights, cand, req.count, self.strategy, bonus)
                got = memo[key] = _set_score(tables, chosen, tuple(numa_l[r][i] for i in chosen))
            out[r] = got
        return out


def set_score(state: nodes.NodeState, chosen: tuple[int, ...]) -> int:
    """The node score of a card set (module docstring)."""
    chosen = tuple(sorted(chosen))
    return _set_score(
        linktables.of(state.inventory), chosen, tuple(state.inventory.devices[i].numa for i in chosen)
    )


def _set_score(tables: linktables.LinkTables, chosen: tuple[int, ...], numa: tuple[int, ...]) -> int:
    if not chosen:
        return registry.MAX_SCORE
    per_numa: dict[int, int] = {}
    for x in numa:
        per_numa[x] = per_numa.get(x, 0) + 1
    numa_score = 100 * max(per_numa.values()) // len(chosen)
    if len(chosen) == 1:
        pcie = p2p = 100
    elif not tables.known:
        pcie = p2p = NEUTRAL
    else:
        pcie_sum = p2p_sum = pairs = 0
        for x, i in enumerate(chosen):
            for j in chosen[x + 1 :]:
                pairs += 1
                pcie_sum += tables.pcie[i][j]
                p2p_sum += tables.p2p[i][j]
        pcie, p2p = pcie_sum // pairs, p2p_sum // pairs
    return (50 * numa_score + 30 * pcie + 20 * p2p) // 100


def _factory(strategy: cardsets.Strategy) -> registry.PolicyFactory:
    return lambda args: TopologyAware(strategy, args)


registry.register("topology-aware", _factory(cardsets.Strategy.HIGHEST_BANDWIDTH))
for _s in cardsets.Strategy:
    registry.register(f"topology-aware:{_s.value}", _factory(_s))
