"""fgd-lookahead: FGD whose fragmentation measure looks ahead to repeated sharing tasks.

FGD (``fragmentation``) asks, for each shape m of the target workload, whether *one* more task of m
fits the node; if it does, only cards too small for m count as fragments. A node short of CPU can
pass that test and still be unable to use most of its free cards: one 470-milli task with 12 cores
fits a node with four half-free cards and 14 free cores, but only one of the four cards can ever be
used by such tasks. fgd-lookahead measures, for every **sharing** shape m, the free GPU share that
as many tasks of m as the node can hold would leave unused:

    tasks_m = min(#cards with R_g >= d_m // k_m, C // c_m)
    F_n(m)  = R - (sum of the tasks_m * k_m largest fitting cards)

Whole-card shapes keep FGD's one-task test (cards are used whole, so a card that one task fits is
never a sliver). Shapes constrained to some GPU models are not cut away: FGD's "most popular shapes
covering 95 % of pods" rule is applied within each model-constraint class, so a constrained minority
keeps its own shapes. Everything else is FGD's: the same integer score ``int(100 * sigmoid(dF /
1000))``, ties to the lowest rank, and the same card choice for sharing pods. Nothing here depends
on constants of a trace: the inputs are the observed shape histogram and the node's state.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping

from gpuslice.policy import fragmentation, registry, shares

MAX_CARDS = 8
"""Width of the shared CPU step table: nodes of up to this many cards use it, larger ones their own."""


def top_by_type(workload: registry.Workload, coverage: float = fragmentation.COVERAGE) -> registry.Workload:
    """FGD's top-shapes cut applied within each model-constraint class, class weights kept."""
    classes: dict[tuple[str, ...], list[tuple[registry.Shape, float]]] = {}
    for s, p in zip(workload.shapes, workload.weights, strict=True):
        classes.setdefault(s.types, []).append((s, p))
    kept: list[tuple[registry.Shape, float]] = []
    for members in classes.values():
        kept.extend(fragmentation.top_pairs(members, coverage))
    norm = sum(p for _, p in kept)
    if norm <= 0:
        return workload
    return registry.Workload(tuple(s for s, _ in kept), tuple(p / norm for _, p in kept))


class RepeatedFragmentation(fragmentation.Fragmentation):
    """``F_n(M)`` with sharing shapes measured against as many tasks as the node can hold."""

    REPEATED = True

    def __init__(self, workload: registry.Workload, width: int = MAX_CARDS) -> None:
        super().__init__(workload)
        # The CPU step table by node card count: one shared table up to ``width``, then one as wide;
        # built on the first ``of`` (the batch path never needs it).
        self._width = width
        self._tables: list[list[int]] = []

    def _step_table(self, width: int) -> list[int]:
        """The CPU levels that change ``_compute`` on a node of at most ``width`` cards.

        A whole-card shape only asks whether its CPU fits; a sharing shape of CPU c counts at most
        ``width`` tasks, each needing c more, so its levels are c, 2c, ..., width * c.
        """
        steps = {c for _, c, share, _, _ in self._gpu if share >= shares.FULL}
        steps |= {
            c * j
            for _, c, share, _, _ in self._gpu
            if share < shares.FULL and c > 0
            for j in range(1, width + 1)
        }
        return sorted(steps)

    def of(self, model: str, cpu_free: int, free: fragmentation.FreeCards) -> int:
        """``F_n(M)`` in milli-GPU / ``UNIT`` (memoized on model, the CPU step reached and the sorted cards).

        A CPU step tells task counts apart only up to its table's width in cards, so a node with
        more cards than ``MAX_CARDS`` is keyed on a table as wide as it. Keys of one card count
        always come from one table (the card tuple's length is part of the key), so the memo
        never answers a node with a value computed for another CPU level.
        """
        try:
            steps = self._tables[len(free)]
        except IndexError:
            steps = self._wide_steps(len(free))
        key = (model if self._typed else "", bisect.bisect_right(steps, cpu_free), tuple(sorted(free)))
        hit = self._memo.get(key)
        if hit is None:
            hit = self._compute(model, cpu_free, key[2])
            if len(self._memo) >= fragmentation.MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = hit
        return hit

    def _wide_steps(self, n: int) -> list[int]:
        """Grow ``_tables`` up to nodes of ``n`` cards (each card count past the width gets its own)."""
        if not self._tables:
            self._tables = [self._step_table(self._width)] * (self._width + 1)
        self._tables.extend(self._step_table(k) for k in range(len(self._tables), n + 1))
        return self._tables[n]

    def _compute(self, model: str, cpu_free: int, free: fragmentation.FreeCards) -> int:
        """F for cards sorted in ascending order (as ``of`` keys them)."""
        below = [0, *itertools.accumulate(free)]  # below[i]: the i smallest cards
        total = below[-1]
        n = len(free)
        out = self._cpu_only * total
        for p, cpu, share, count, types in self._gpu:
            if types and not shares.type_allowed(model, types):
                out += p * total
                continue
            i = bisect.bisect_left(free, share)  # free[i:] reach the share
            if share >= shares.FULL:
                fits = cpu_free >= cpu and n - i >= count
                out += p * (below[i] if fits else total)
            else:
                tasks = (n - i) // count
                if cpu > 0:
                    tasks = min(tasks, max(cpu_free, 0) // cpu)
                out += p * below[n - tasks * count]  # all but the tasks * count largest
        return out


class Lookahead(fragmentation.FGD):
    """The fgd-lookahead policy (see the module docstring)."""

    name = "fgd-lookahead"

    def measure_for(self, workload: registry.Workload) -> fragmentation.Fragmentation:
        """The repeated-task measure over the per-class top shapes of the observed histogram."""
        return RepeatedFragmentation(top_by_type(workload))


def _build(args: Mapping[str, float]) -> registry.Policy:
    return Lookahead()


registry.register("fgd-lookahead", _build)
