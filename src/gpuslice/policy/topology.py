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

``score_columns`` computes the same score for many rows at once (the batch filter's fast path).
Eligibility comes from ``vectorfit``, the pair tables from ``columns.links``. One card scores 100
wherever the pod fits. For k >= 2 cards, rows with at most ``cardsets.EXACT_LIMIT`` candidates
work on the k-subsets of card positions (``cardsets.combos``):

* highest-bandwidth and lowest-fragmentation depend on the candidates only, so their choice is
  looked up by the row's eligibility bitmask in a table built once per topology, pod size and
  strategy (``cardsets.lookup``, nodes of up to ``cardsets.LUT_WIDTH`` cards);
* balanced-utilization (its bonus follows each card's free memory) and wider nodes score every
  subset of every row with matrix products (``cardsets.best_many``).

The ``30 * pcie + 20 * p2p`` part of each subset is precomputed per topology; only the NUMA part is
per row. These per-topology arrays are stacked in links-id order and kept across calls (one stack
per width and k, reused while a new ``NodeColumns`` holds the same tables). Rows with more
candidates (nodes of more than 10 cards) take ``cardsets.best`` once per distinct key, as
``score_node`` does.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import numpy as np

from gpuslice.model import nodes, requests
from gpuslice.policy import api, cardsets, columns, fit, linktables, vectorfit

NEUTRAL = linktables.NEUTRAL
_BONUS_UNIT = 50
_NUMA = columns.CARD_FIELDS.index("numa")
_COUNT_MASK = np.stack([np.ones(vectorfit.MAX_CARDS), 2.0 ** np.arange(vectorfit.MAX_CARDS)], axis=1)
_FREE_MEM, _TOTAL_MEM = (columns.HOT_FIELDS.index(f) for f in ("free_mem", "total_mem"))
_LINKS_ID, _NCARDS = (columns.ROW_FIELDS.index(f) for f in ("links_id", "ncards"))


def weights(state: nodes.NodeState) -> cardsets.Weights:
    """The node's pair-score matrix by device position."""
    return linktables.of(state.inventory).weights


class TopologyAware:
    """Connectivity-maximising card choice and topology node score (module docstring)."""

    idle_only = False
    """Declared: no card filter beyond the fit (``api.Policy``)."""
    learns_workload = False
    """Declared: scores without the learned workload (``api.Policy``)."""

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
        ctx: api.Context,
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

    def score_node(self, state: nodes.NodeState, pod: requests.PodRequest, ctx: api.Context) -> api.Scored:
        """How well connected the pod's cards would be here (0..100)."""
        placed = fit.place(state, pod, self, ctx)
        if placed.allocation is None:
            return api.Scored(0)
        biggest = max(placed.allocation.containers, key=len, default=())
        index = {d.uuid: i for i, d in enumerate(state.inventory.devices)}
        chosen = tuple(sorted(index[g.uuid] for g in biggest))
        numa = tuple(state.inventory.devices[i].numa for i in chosen)
        return api.Scored(_set_score(linktables.of(state.inventory), chosen, numa))

    def score_columns(
        self,
        cols: columns.NodeColumns,
        rows: columns.IntArray,
        pod: requests.PodRequest,
        ctx: api.Context = api.EMPTY_CONTEXT,
    ) -> columns.IntArray:
        """``score_node`` for many feasible rows of a pod ``vectorfit`` can judge (module docstring)."""
        req = vectorfit.request_of(pod, None)
        if req is None:
            raise ValueError("score_columns needs a pod with one GPU container (see vectorfit.request_of)")
        k = req.count
        out = np.full(len(rows), api.MAX_SCORE, np.int64)
        if k <= 1 or len(rows) == 0:
            return out  # one card: numa = pcie = p2p = 100 wherever the pod fits
        ok = vectorfit.eligible_cards(cols, rows, pod, req)
        width = ok.shape[1]
        e = ok.astype(np.float64)
        count_mask = e @ _COUNT_MASK[:width]  # per row: eligible cards, eligibility bitmask
        n_ok = count_mask[:, 0]
        sets = cardsets.combos(width, k)
        exact = (n_ok >= k) & (n_ok <= cardsets.EXACT_LIMIT)
        if sets is not None and exact.all():  # the common case: no row to set aside
            return self._score_sets(cols, rows, e, count_mask[:, 1], k, sets)
        out[n_ok < k] = 0  # not a feasible row: score_node finds no placement
        if sets is None:
            exact[:] = False
        fast = np.flatnonzero(exact)
        if len(fast) and sets is not None:
            out[fast] = self._score_sets(cols, rows[fast], e[fast], count_mask[fast, 1], k, sets)
        slow = np.flatnonzero(~exact & (n_ok >= k))
        if len(slow):
            out[slow] = self._score_each(cols, rows[slow], ok[slow], k)
        return out

    def _bonus(self, cols: columns.NodeColumns, rows: columns.IntArray, k: int) -> np.ndarray | None:
        """``choose_cards``' per-card bonus for the rows (None unless balanced-utilization).

        ``unit * free // total`` in float64: the product is exact (below 2^42), the quotient is at
        most ~1500 so its rounding error stays below 2^-42, far less than the 1 / total >= 2^-31 by
        which a non-integer quotient misses the next integer: the floor is the integer one.
        """
        if self.strategy is not cardsets.Strategy.BALANCED_UTILIZATION:
            return None
        hot = cols.hot[rows]
        total = hot[:, :, _TOTAL_MEM].astype(np.float64)
        unit = (k - 1) * _BONUS_UNIT
        per = np.floor(unit * hot[:, :, _FREE_MEM] / np.maximum(total, 1.0))
        np.maximum(per, 0.0, out=per)
        per[total <= 0] = 0.0
        return per

    def _score_sets(
        self,
        cols: columns.NodeColumns,
        rows: columns.IntArray,
        e: np.ndarray,
        mask: np.ndarray,
        k: int,
        sets: cardsets.Combos,
    ) -> columns.IntArray:
        """Rows with at most ``cardsets.EXACT_LIMIT`` candidates ``e`` (0/1, bitmask ``mask``)."""
        tables = _stack(cols.links, sets)
        table = cols.nodes[rows, _LINKS_ID]
        lut = tables.lookup(self.strategy)
        if lut is not None:
            pick = lut[table, mask.astype(np.int64)]
        else:
            pick = cardsets.best_many(tables.pairs, table, e, self.strategy, self._bonus(cols, rows, k), sets)
        most = _most_common(cols.cards[rows[:, None], sets.positions[pick], _NUMA])
        return np.asarray((50 * (100 * most // k) + tables.links_part[table, pick]) // 100, np.int64)

    def _score_each(
        self, cols: columns.NodeColumns, rows: columns.IntArray, ok: np.ndarray, k: int
    ) -> columns.IntArray:
        """Rows with many candidates (``cardsets`` local search) or wide nodes: one ``best`` per key."""
        bonus_all = self._bonus(cols, rows, k)
        out = np.zeros(len(rows), np.int64)
        memo: dict[tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...] | None], int] = {}
        ok_l = ok.tolist()
        numa_l = cols.cards[rows][:, :, _NUMA].tolist()
        links_l = cols.nodes[rows, _LINKS_ID].tolist()
        n_l = cols.nodes[rows, _NCARDS].tolist()
        bonus_l = bonus_all.astype(np.int64).tolist() if bonus_all is not None else None
        for r in range(len(rows)):
            n = n_l[r]
            cand = tuple(i for i, e in enumerate(ok_l[r][:n]) if e)
            bonus = tuple(bonus_l[r][:n]) if bonus_l is not None else None
            key = (links_l[r], cand, tuple(numa_l[r][:n]), bonus)
            got = memo.get(key)
            if got is None:
                tables = cols.links[links_l[r]]
                chosen = cardsets.best(tables.weights, cand, k, self.strategy, bonus)
                got = memo[key] = _set_score(tables, chosen, tuple(numa_l[r][i] for i in chosen))
            out[r] = got
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class _Stacked:
    """Per-subset tables of every topology in a ``NodeColumns.links``, stacked by links id.

    Attributes:
        links: the tables these arrays were built from.
        sets: the subsets (``cardsets.combos``).
        pairs: the pair scores and per-subset ``cardsets.links`` of every table.
        links_part: (tables, subsets) ``30 * pcie + 20 * p2p`` of each subset (module docstring).
        luts: per strategy, (tables, 2^width) ``cardsets.lookup`` (filled on first use).
    """

    links: tuple[linktables.LinkTables, ...]
    sets: cardsets.Combos
    pairs: cardsets.Pairs
    links_part: columns.IntArray
    luts: dict[cardsets.Strategy, columns.IntArray | None] = dataclasses.field(default_factory=dict)

    def lookup(self, strategy: cardsets.Strategy) -> columns.IntArray | None:
        """The stacked ``cardsets.lookup`` tables, or None where the strategy or width has none."""
        if strategy in self.luts:
            return self.luts[strategy]
        width, k = self.sets.members.shape[1], self.sets.positions.shape[1]
        per = [cardsets.lookup(t.weights, width, k, strategy) for t in self.links]
        got = None if not per or any(p is None for p in per) else np.stack([p for p in per if p is not None])
        self.luts[strategy] = got
        return got


_STACKS: dict[tuple[int, int], _Stacked] = {}
_MAX_STACKS = 64


def _stack(links: tuple[linktables.LinkTables, ...], sets: cardsets.Combos) -> _Stacked:
    """The stacked tables for these links (the last one per subset size is kept: columns share it)."""
    width, k = sets.members.shape[1], sets.positions.shape[1]
    key = (width, k)
    got = _STACKS.get(key)
    # a fresh NodeColumns holds the same LinkTables objects, so this compares identities
    if got is not None and got.links == links:
        return got
    parts = [_per_table(t, width, k) for t in links]
    n = len(sets.positions)
    stacked = _Stacked(
        links,
        sets,
        cardsets.pairs(
            np.stack([p[0] for p in parts]) if parts else np.zeros((0, width, width)),
            np.stack([p[1] for p in parts]) if parts else np.zeros((0, n)),
        ),
        np.stack([p[2] for p in parts]) if parts else np.zeros((0, n), np.int64),
    )
    if len(_STACKS) >= _MAX_STACKS:
        _STACKS.clear()
    _STACKS[key] = stacked
    return stacked


def _most_common(numa: np.ndarray) -> columns.IntArray:
    """Per row, how many of its values equal its most frequent one."""
    n, k = numa.shape
    if n == 0 or k == 1:
        return np.full(n, k, np.int64)
    if k == 2:
        return np.asarray(1 + (numa[:, 0] == numa[:, 1]), np.int64)
    low = int(numa.min())
    span = int(numa.max()) - low + 1
    if span <= 64:  # a few NUMA nodes: count them per row
        code = (numa - low) + (np.arange(n) * span)[:, None]
        return np.asarray(
            np.bincount(code.ravel(), minlength=n * span).reshape(n, span).max(axis=1), np.int64
        )
    return np.asarray((numa[:, :, None] == numa[:, None, :]).sum(axis=2).max(axis=1), np.int64)


@functools.lru_cache(maxsize=1024)
def _per_table(
    tables: linktables.LinkTables, width: int, k: int
) -> tuple[np.ndarray, np.ndarray, columns.IntArray]:
    sets = cardsets.combos(width, k)
    assert sets is not None  # _stack is only asked for enumerable sizes
    n = len(tables.weights)
    w = np.zeros((width, width), np.float64)
    w[:n, :n] = np.array(tables.weights, np.float64).reshape(n, n)
    pairs = k * (k - 1) // 2
    if tables.known:
        pc = np.zeros((width, width), np.float64)
        pp = np.zeros((width, width), np.float64)
        pc[:n, :n] = np.triu(np.array(tables.pcie, np.float64).reshape(n, n), 1)
        pp[:n, :n] = np.triu(np.array(tables.p2p, np.float64).reshape(n, n), 1)
        m = sets.members
        pcie = np.einsum("ci,ij,cj->c", m, pc, m).astype(np.int64) // pairs
        p2p = np.einsum("ci,ij,cj->c", m, pp, m).astype(np.int64) // pairs
    else:
        pcie = p2p = np.full(len(sets.positions), NEUTRAL, np.int64)
    return w, cardsets.inside_links(tables.weights, sets), 30 * pcie + 20 * p2p


def set_score(state: nodes.NodeState, chosen: tuple[int, ...]) -> int:
    """The node score of a card set (module docstring)."""
    chosen = tuple(sorted(chosen))
    return _set_score(
        linktables.of(state.inventory), chosen, tuple(state.inventory.devices[i].numa for i in chosen)
    )


def _set_score(tables: linktables.LinkTables, chosen: tuple[int, ...], numa: tuple[int, ...]) -> int:
    if not chosen:
        return api.MAX_SCORE
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


def _factory(strategy: cardsets.Strategy) -> api.PolicyFactory:
    return lambda args: TopologyAware(strategy, args)


FACTORIES: Mapping[str, api.PolicyFactory] = {
    "topology-aware": _factory(cardsets.Strategy.HIGHEST_BANDWIDTH),
    **{f"topology-aware:{s.value}": _factory(s) for s in cardsets.Strategy},
}
"""The policies this module defines, by registry name (``framework.registry`` collects them)."""
