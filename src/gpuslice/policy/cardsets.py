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
"""

from __future__ import annotations

import enum
import functools
import itertools

EXACT_LIMIT = 10
"""Up to this many candidate cards the answer is exact (2^10 = 1024 subsets)."""
MAX_SWAP_ROUNDS = 64
"""Bound on local-search improvement rounds beyond ``EXACT_LIMIT``."""

Weights = tuple[tuple[int, ...], ...]


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
