"""Best set of k cards on a weighted card graph: exact subset DP, or bounded local search.

Weights ``w[i][j]`` are pair scores (higher = better link). For candidates C and a choice S, with
``links(X)`` the sum of pair scores inside X and ``R = C - S`` the cards left over:

* ``HIGHEST_BANDWIDTH``: maximise ``links(S)``, then ``links(R)``.
* ``BALANCED_UTILIZATION``: maximise ``links(S) + sum(bonus[i] for i in S)`` (``bonus`` rewards idle
  cards), then ``links(R)``.
* ``LOWEST_FRAGMENTATION``: maximise ``links(R)`` (keep the best remaining group intact), then
  ``links(S)``. For k = 1 this is HAMi's rule: the card with the lowest summed score to the others.

Remaining ties go to the lexicographically smallest sorted set. Up to ``EXACT_LIMIT`` candidates
the answer is exact: ``links`` of every subset of C comes from three smaller subsets in O(1)
(inclusion-exclusion on its two lowest cards a, b:
``links(m) = links(m - a) + links(m - b) - links(m - a - b) + w[a][b]``), so a query costs
O(2^|C|) additions instead of HAMi's O(C(n, k) k^2) enumeration, and results are memoised.
Beyond it, greedy growth plus first-improvement 1-swaps runs for at most ``MAX_SWAP_ROUNDS``.

``best_many`` answers the exact query for many rows at once (the batch filter's node scores): it
enumerates the k-subsets of a row's card positions in lexicographic order (``combos``) and scores all
of them with a few matrix products. With ``deg(i)`` the summed pair scores from card i to the
candidates, ``links(R) = links(C) + links(S) - sum(deg(i) for i in S)``, so both objectives of every
subset come from ``links(S)`` (a per-topology table) and ``deg``. The first subset in lexicographic
order with the best (primary, secondary) pair is the lexicographically smallest, as in ``best``.
Without a bonus the answer depends on the candidate set only, so ``lookup`` tabulates it once per
matrix for every eligibility bitmask of up to ``LUT_WIDTH`` cards.
"""

from __future__ import annotations

import enum
import functools
import itertools
import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

EXACT_LIMIT = 10
"""Up to this many candidate cards the answer is exact (2^10 = 1024 subsets)."""
MAX_SWAP_ROUNDS = 64
"""Bound on local-search improvement rounds beyond ``EXACT_LIMIT``."""

MAX_COMBOS = 256
"""``combos`` enumerates at most this many subsets (C(8, 4) = 70, C(10, 5) = 252)."""

Weights = tuple[tuple[int, ...], ...]
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class Strategy(enum.Enum):
    """What a multi-card choice optimises (see the module docstring)."""

    HIGHEST_BANDWIDTH = "highest-bandwidth"
    BALANCED_UTILIZATION = "balanced-utilization"
    LOWEST_FRAGMENTATION = "lowest-fragmentation"


def links(w: Weights, cards: tuple[int, ...] | list[int]) -> int:
    """Sum of pair scores inside a set (positions into ``w``)."""
    return sum(w[a][b] for a, b in itertools.combinations(cards, 2))


def value(
    w: Weights, cand: tuple[int, ...], chosen: tuple[int, ...], strategy: Strategy, bonus: tuple[int, ...]
) -> tuple[int, int]:
    """The (primary, secondary) objective of a choice; higher is better."""
    rest = [c for c in cand if c not in chosen]
    inside, outside = links(w, chosen), links(w, rest)
    if strategy is Strategy.LOWEST_FRAGMENTATION:
        return outside, inside
    if strategy is Strategy.BALANCED_UTILIZATION:
        return inside + sum(bonus[c] for c in chosen), outside
    return inside, outside


def best(
    w: Weights, cand: tuple[int, ...], k: int, strategy: Strategy, bonus: tuple[int, ...] | None = None
) -> tuple[int, ...]:
    """The best k of the candidate positions, sorted (see the module docstring)."""
    cand = tuple(sorted(cand))
    if k <= 0:
        return ()
    if k > len(cand):
        raise ValueError(f"cannot choose {k} of {len(cand)} cards")
    if k == len(cand):
        return cand
    b = bonus if bonus is not None else (0,) * len(w)
    if len(cand) <= EXACT_LIMIT:
        return _exact(w, cand, k, strategy, b)
    return _local_search(w, cand, k, strategy, b)


@functools.lru_cache(maxsize=8192)
def _exact(
    w: Weights, cand: tuple[int, ...], k: int, strategy: Strategy, bonus: tuple[int, ...]
) -> tuple[int, ...]:
    n = len(cand)
    full = (1 << n) - 1
    ps = [0] * (1 << n)
    bs = [0] * (1 << n)
    for m in range(1, 1 << n):
        low = m & -m
        rest = m ^ low
        bs[m] = bs[rest] + bonus[cand[low.bit_length() - 1]]
        if rest:
            low2 = rest & -rest
            pair = w[cand[low.bit_length() - 1]][cand[low2.bit_length() - 1]]
            ps[m] = ps[rest] + ps[m ^ low2] - ps[rest ^ low2] + pair
    best_key: tuple[int, int] | None = None
    best_sets: list[tuple[int, ...]] = []
    for m in range(1, 1 << n):
        if m.bit_count() != k:
            continue
        if strategy is Strategy.LOWEST_FRAGMENTATION:
            key = (ps[full ^ m], ps[m])
        elif strategy is Strategy.BALANCED_UTILIZATION:
            key = (ps[m] + bs[m], ps[full ^ m])
        else:
            key = (ps[m], ps[full ^ m])
        if best_key is None or key > best_key:
            best_key, best_sets = key, [_members(cand, m)]
        elif key == best_key:
            best_sets.append(_members(cand, m))
    return min(best_sets)


def _members(cand: tuple[int, ...], m: int) -> tuple[int, ...]:
    return tuple(cand[i] for i in range(len(cand)) if m >> i & 1)


def _local_search(
    w: Weights, cand: tuple[int, ...], k: int, strategy: Strategy, bonus: tuple[int, ...]
) -> tuple[int, ...]:
    """Greedy growth from the best seed, then first-improvement 1-swaps (bounded rounds)."""

    def val(s: list[int]) -> tuple[int, int]:
        return value(w, cand, tuple(s), strategy, bonus)

    chosen: list[int] = []
    while len(chosen) < k:
        pool = [c for c in cand if c not in chosen]
        chosen.append(max(pool, key=lambda c: (val([*chosen, c]), -c)))
    current = val(chosen)
    for _ in range(MAX_SWAP_ROUNDS):
        improved = False
        for pos in range(k):
            for c in cand:
                if c in chosen:
                    continue
                trial = chosen.copy()
                trial[pos] = c
                v = val(trial)
                if v > current:
                    chosen, current, improved = trial, v, True
        if not improved:
            break
    return tuple(sorted(chosen))


class Combos(NamedTuple):
    """The k-subsets of positions 0..width-1, in lexicographic order.

    Attributes:
        members: (subsets, width) 1.0 where the position belongs to the subset.
        positions: (subsets, k) the positions of each subset, ascending.
    """

    members: FloatArray
    positions: IntArray


@functools.lru_cache(maxsize=256)
def combos(width: int, k: int) -> Combos | None:
    """All k-subsets of ``range(width)``; None when there are more than ``MAX_COMBOS`` (or none)."""
    if not 0 < k <= width or math.comb(width, k) > MAX_COMBOS:
        return None
    positions = np.array(list(itertools.combinations(range(width), k)), np.int64).reshape(-1, k)
    members = np.zeros((len(positions), width), np.float64)
    members[np.arange(len(positions))[:, None], positions] = 1.0
    for a in (positions, members):
        a.flags.writeable = False
    return Combos(members, positions)


def inside_links(w: Weights, sets: Combos) -> FloatArray:
    """``links`` of every subset (positions beyond ``w`` count 0)."""
    n = len(w)
    m = np.zeros((sets.members.shape[1],) * 2, np.float64)
    m[:n, :n] = np.triu(np.array(w, np.float64).reshape(n, n), 1)
    return np.asarray(np.einsum("ci,ij,cj->c", sets.members, m, sets.members), np.float64)


class Pairs(NamedTuple):
    """Pair-score matrices of several topologies, ready for ``best_many`` (see ``pairs``).

    Attributes:
        weights: (tables, width, width) pair scores, 0 beyond a node's cards.
        inside: (tables, subsets) ``inside_links`` of each matrix.
        total: (tables,) links of all positions (a bound of every ``links``).
        nonnegative: no pair score below 0 (the one-key comparison needs it).
    """

    weights: FloatArray
    inside: FloatArray
    total: FloatArray
    nonnegative: bool


def pairs(weights: FloatArray, inside: FloatArray) -> Pairs:
    """``Pairs`` of stacked matrices and their ``inside_links``."""
    total = np.triu(weights, 1).sum(axis=(1, 2)) if len(weights) else np.zeros(0)
    return Pairs(weights, inside, total, bool(weights.min(initial=0.0) >= 0))


def best_many(
    tables: Pairs,
    table: IntArray,
    eligible: npt.NDArray[np.bool_] | FloatArray,
    strategy: Strategy,
    bonus: FloatArray | None,
    sets: Combos,
) -> IntArray:
    """For every row, the index into ``sets`` of ``best`` over its eligible positions.

    Both objectives are linear in a subset's members once ``deg`` is known, so one key per subset,
    ``(primary * big + secondary) + (members eligible - k) * huge``, is a matrix product; ``big`` and
    ``huge`` bound the secondary and the combined key, which is exact in float64 while it stays
    below 2^52 (otherwise a two-pass comparison runs). ``argmax`` takes the first best subset, the
    lexicographically smallest.

    Args:
        tables: the pair scores of every topology (``pairs``).
        table: (rows,) which matrix each row uses.
        eligible: (rows, width) the candidate positions of each row (bool or 0.0/1.0); every row
            needs at least k of them, and at most ``EXACT_LIMIT`` for the answer to equal ``best``'s.
        strategy: the objective (module docstring).
        bonus: (rows, width) per-card bonus for ``BALANCED_UTILIZATION`` (None = 0).
        sets: ``combos(width, k)``.
    """
    e: FloatArray = np.asarray(eligible, np.float64)
    if strategy is not Strategy.BALANCED_UTILIZATION:
        bonus = None
    if len(table) == 0 or (table == table[0]).all():
        t = int(table[0]) if len(table) else 0
        return _best_one_table(tables, t, e, strategy, bonus, sets)
    out = np.empty(len(table), np.int64)
    for t in np.unique(table).tolist():
        idx = np.flatnonzero(table == t)
        b = None if bonus is None else bonus[idx]
        out[idx] = _best_one_table(tables, t, e[idx], strategy, b, sets)
    return out


def _best_one_table(
    tables: Pairs, t: int, e: FloatArray, strategy: Strategy, bonus: FloatArray | None, sets: Combos
) -> IntArray:
    """``best_many`` for rows sharing matrix t."""
    w, ins = tables.weights[t], tables.inside[t]
    k = sets.positions.shape[1]
    deg = e @ w
    # secondary <= links of every card; primary <= that + k * the largest bonus
    w_all = float(tables.total[t])
    big = w_all + 1.0
    b_max = float(bonus.max(initial=0.0)) if bonus is not None else 0.0
    huge = (w_all + k * b_max + 1.0) * big
    negative = not tables.nonnegative or (bonus is not None and bonus.min(initial=0.0) < 0)
    if negative or (k + 2) * huge >= 2.0**52:
        return _two_pass(deg, e, ins, strategy, bonus, sets)
    # per-row constants (links of all candidates, -k * huge) drop out of the argmax
    n, width = e.shape
    x = np.empty((n, width + 1), np.float64)
    if strategy is Strategy.LOWEST_FRAGMENTATION:
        x[:, :width] = e * huge - deg * big  # primary links(R) = const + ins - deg(S); secondary ins
    elif bonus is not None:
        x[:, :width] = e * huge + bonus * big - deg  # primary ins + bonus(S); secondary links(R)
    else:
        x[:, :width] = e * huge - deg  # primary ins; secondary links(R)
    x[:, width] = 1.0
    m = np.empty((width + 1, len(ins)), np.float64)
    m[:width] = sets.members.T
    m[width] = ins * (big + 1.0)
    return np.asarray((x @ m).argmax(axis=1), np.int64)


def _two_pass(
    deg: FloatArray,
    e: FloatArray,
    ins: FloatArray,
    strategy: Strategy,
    bonus: FloatArray | None,
    sets: Combos,
) -> IntArray:
    """``best_many`` comparing primary, then secondary (for keys too large for one float64)."""
    mt = sets.members.T
    k = sets.positions.shape[1]
    valid = (e @ mt) == k
    outside = ((deg * e).sum(axis=1) / 2)[:, None] + ins - deg @ mt
    if strategy is Strategy.LOWEST_FRAGMENTATION:
        primary, secondary = outside, np.broadcast_to(ins, outside.shape)
    elif bonus is not None:
        primary, secondary = ins + bonus @ mt, outside
    else:
        primary, secondary = np.broadcast_to(ins, outside.shape), outside
    primary = np.where(valid, primary, -np.inf)
    top = primary.max(axis=1, keepdims=True)
    secondary = np.where(primary == top, secondary, -np.inf)
    return np.asarray(secondary.argmax(axis=1), np.int64)


LUT_WIDTH = 10
"""``lookup`` tabulates every eligibility mask of nodes up to this many cards (2^10 masks)."""


@functools.lru_cache(maxsize=1024)
def lookup(w: Weights, width: int, k: int, strategy: Strategy) -> IntArray | None:
    """``best_many``'s answer (an index into ``combos(width, k)``) for every eligibility bitmask.

    Entry m answers the candidates ``{i : m >> i & 1}``; masks with fewer than k or more than
    ``EXACT_LIMIT`` candidates hold -1. None beyond ``LUT_WIDTH`` cards, for balanced-utilization
    (its bonus is not a function of the mask) or when ``combos`` has no enumeration.
    """
    sets = combos(width, k)
    if sets is None or width > LUT_WIDTH or strategy is Strategy.BALANCED_UTILIZATION:
        return None
    masks = np.arange(1 << width, dtype=np.int64)
    ok = (masks[:, None] >> np.arange(width)) & 1 == 1
    count = ok.sum(axis=1)
    use = np.flatnonzero((count >= k) & (count <= EXACT_LIMIT))
    n = len(w)
    mat = np.zeros((1, width, width), np.float64)
    mat[0, :n, :n] = np.array(w, np.float64).reshape(n, n)
    out = np.full(1 << width, -1, np.int64)
    tables = pairs(mat, inside_links(w, sets)[None, :])
    out[use] = _best_one_table(tables, 0, ok[use].astype(np.float64), strategy, None, sets)
    out.flags.writeable = False
    return out
