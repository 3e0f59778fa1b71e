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
keeps its own shapes.

**Model-aware weights.** FGD weighs every shape alike on every node, as if each node expected the
cluster-wide mix of tasks. A task pinned to one model only ever lands on that model's nodes, so
those nodes expect more of it per card than its share of the histogram says, and nodes of other
models expect none of it. With ``r_s`` the share of the cluster's cards that shape s can use
(``api.Context.capacity``) and ``a_s = p_s / r_s`` (``a = p`` for unconstrained and CPU-only
shapes), a node of model t weighs each shape it can serve ``a_s / Z_t`` (``Z_t`` the sum of ``a``
over those shapes): the mix of tasks it should expect. A shape it cannot serve weighs nothing unless
its models are *scarce*: the GPU demand that can run only on them is at least their share of the
cluster's cards. Then it weighs ``a_s / G`` (``G`` the sum of ``a`` over all shapes) and counts the
node's free cards as fragments, as FGD does, so flexible pods fill the nodes that scarce demand
cannot use before they take the scarce cards. On a workload without model constraints every weight
is the histogram's ``p_s`` and the measure is the plain repeated-task one.

Measured (``gpuslice simulate``, 10 seeds): FGD's node-independent weights are why model-pinned
workloads defeated the look-ahead: with a third of the GPU pods pinned, pinned pods failed on their
models while unconstrained pods had filled those models' cards. The per-class cut alone did not fix
it; the model-aware weights do (README, "Placement").

Everything else is FGD's: the same integer score ``int(100 * sigmoid(dF / 1000))``, ties to the
lowest rank, and the same card choice for sharing pods. Nothing here depends on constants of a
trace: the inputs are the observed shape histogram, the cluster's cards per model and the node.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping

from gpuslice.policy import api, fragcolumns, fragmentation, shares

MAX_CARDS = 8
"""Width of the shared CPU step table: nodes of up to this many cards use it, larger ones their own."""


def top_by_type(workload: api.Workload, coverage: float = fragmentation.COVERAGE) -> api.Workload:
    """FGD's top-shapes cut applied within each model-constraint class, class weights kept."""
    classes: dict[tuple[str, ...], list[tuple[api.Shape, float]]] = {}
    for s, p in zip(workload.shapes, workload.weights, strict=True):
        classes.setdefault(s.types, []).append((s, p))
    kept: list[tuple[api.Shape, float]] = []
    for members in classes.values():
        kept.extend(fragmentation.top_pairs(members, coverage))
    norm = sum(p for _, p in kept)
    if norm <= 0:
        return workload
    return api.Workload(tuple(s for s, _ in kept), tuple(p / norm for _, p in kept))


def _reach(types: tuple[str, ...], capacity: tuple[tuple[str, int], ...]) -> float:
    """The share of the cluster's cards a shape of these allowed models can use (1 when unknown)."""
    total = sum(n for _, n in capacity)
    if not types or total <= 0:
        return 1.0
    return sum(n for m, n in capacity if shares.type_allowed(m, types)) / total


def _allowed(types: tuple[str, ...], capacity: tuple[tuple[str, int], ...]) -> frozenset[str]:
    """The cluster's models a shape of these allowed models can use."""
    return frozenset(m for m, _ in capacity if shares.type_allowed(m, types))


class RepeatedFragmentation(fragmentation.Fragmentation):
    """``F_n(M)`` with sharing shapes measured against as many tasks as the node can hold.

    Weighted by model (``model_weights``, see the module docstring): ``capacity`` is the cluster's
    cards per model (``api.Context.capacity``; empty = unknown, every shape reaches everything).
    """

    REPEATED = True

    def __init__(
        self,
        workload: api.Workload,
        width: int = MAX_CARDS,
        capacity: tuple[tuple[str, int], ...] = (),
    ) -> None:
        super().__init__(workload)
        self._by_model: dict[str, fragcolumns.Weights] = {}
        self._prepare(workload, capacity)
        # The CPU step table by node card count: one shared table up to ``width``, then one as wide;
        # built on the first ``of`` (the batch path never needs it).
        self._width = width
        self._tables: list[list[int]] = []

    def _prepare(self, workload: api.Workload, capacity: tuple[tuple[str, int], ...]) -> None:
        """Each shape's reach, demand-relative pressure and scarcity (the inputs of ``model_weights``).

        ``a_s = p_s / r_s`` (``r_s``: the share of the cluster's cards shape s can use) is how many
        tasks of s a card it can use expects, relative to an unconstrained shape. A model set T is
        *scarce* when the GPU demand that can only run on T (shapes whose usable models are a subset
        of T's) is at least T's share of the cluster's cards: ``pi_T = D_T / r_T >= 1``.
        """
        pairs = list(zip(workload.shapes, workload.weights, strict=True))
        cpu_only = [p for shape, p in pairs if shape.count == 0]
        gpu = [(shape, p) for shape, p in pairs if shape.count > 0]
        self._reaches = [_reach(shape.types, capacity) for shape, _ in gpu]
        self._a = [p / r if r > 0 else 0.0 for (_, p), r in zip(gpu, self._reaches, strict=True)]
        self._cpu_shapes = cpu_only
        self._cpu_weight = sum(cpu_only)
        self._global = self._cpu_weight + sum(self._a)
        demand = [p * shape.count * shape.share_milli for shape, p in gpu]
        total = sum(demand)
        models = [_allowed(shape.types, capacity) if shape.types else None for shape, _ in gpu]
        self._scarce: list[bool] = []
        for allowed, r in zip(models, self._reaches, strict=True):
            if allowed is None or not capacity or r <= 0 or total <= 0:  # unknown capacity: none scarce
                self._scarce.append(False)
                continue
            only_here = sum(
                dm for dm, other in zip(demand, models, strict=True) if other is not None and other <= allowed
            )
            self._scarce.append(only_here / total / r >= 1.0)

    def model_weights(self, model: str) -> fragcolumns.Weights:
        """The weights on a node of this model (see the module docstring).

        A shape the model can serve weighs ``a_s / Z`` with ``Z`` the sum over the shapes it can
        serve (CPU-only shapes count ``a = p``): the mix of tasks such a node expects. A shape it
        cannot serve weighs ``a_s / G`` (``G``: the sum over all shapes) if its models are scarce,
        so that the node's free cards count as fragments for it and filling them is cheap; otherwise
        0, for other nodes take it.
        """
        got = self._by_model.get(model)
        if got is not None:
            return got
        serves = [
            not shape.types or shares.type_allowed(model, shape.types)
            for shape in (s for s in self.workload.shapes if s.count > 0)
        ]
        z = self._cpu_weight + sum(a for a, ok in zip(self._a, serves, strict=True) if ok)
        weights: list[float] = []
        for a, ok, scarce in zip(self._a, serves, self._scarce, strict=True):
            if ok:
                weights.append(a / z if z > 0 else 0.0)
            else:
                weights.append(a / self._global if scarce and self._global > 0 else 0.0)
        cpu = sum(fragmentation.quantize([p / z if z > 0 else 0.0 for p in self._cpu_shapes]))
        got = (cpu, fragmentation.quantize(weights))
        self._by_model[model] = got
        return got

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
        cpu_only, weights = self.model_weights(model)
        out = cpu_only * total
        for p, (_, cpu, share, count, types) in zip(weights, self._gpu, strict=True):
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

    def measure_for(
        self, workload: api.Workload, capacity: tuple[tuple[str, int], ...] = ()
    ) -> fragmentation.Fragmentation:
        """The model-aware repeated-task measure over the per-class top shapes of the histogram."""
        return RepeatedFragmentation(top_by_type(workload), capacity=capacity)


def _build(args: Mapping[str, float]) -> api.Policy:
    return Lookahead()


FACTORIES: Mapping[str, api.PolicyFactory] = {"fgd-lookahead": _build}
"""The policies this module defines, by registry name (``framework.registry`` collects them)."""
