"""FGD: Fragmentation Gradient Descent (Weng et al., USENIX ATC 2023), fgd-experiment.md section 6.6.

A node's fragmentation against a target workload M is the GPU share that the expected tasks could
not use there: ``F_n(M) = sum_m p_m F_n(m)``. FGD puts each pod where F grows least and, for a
sharing pod, on the card where it grows least.

Exact arithmetic: the weights ``p_m`` are quantised once to integers (``UNIT`` per 1.0, see
``quantize``), so F is an exact integer in units of milli-GPU / ``UNIT`` whatever order it is summed
in, and the node score ``int(100 * sigmoid(dF / 1000))`` is read from a table of integer thresholds
(``SCORE_THRESHOLDS``, ``score``) instead of calling ``exp``. The node-by-node path here
(``score_node``, ``fgd_choice``, the memo) and the vectorised batch path (``fragcolumns``, behind
``FGD.score_columns``) use the same integers, so the simulator and the extender rank nodes alike.

F depends only on (model, free CPU, sorted free milli per card), and on the free CPU only through
which shape CPU thresholds it reaches, so ``Fragmentation`` memoizes it on (model, CPU bucket,
sorted free tuple).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping

import numpy as np

from gpuslice.model import nodes, requests
from gpuslice.policy import api, columns, fragcolumns, fragscore, shares

FreeCards = tuple[int, ...]

COVERAGE = 0.95
"""FGD keeps the most popular shapes until they cover this share of pods."""
MEMO_LIMIT = 1 << 18
"""Memoized node measures kept at most (one default simulator run needs about 10k)."""
UNIT = fragscore.UNIT
"""Integer weight units per 1.0 of probability: F is an integer in milli-GPU / ``UNIT``."""


def top_pairs(
    pairs: list[tuple[api.Shape, float]], coverage: float = COVERAGE
) -> list[tuple[api.Shape, float]]:
    """The most popular (shape, weight) pairs covering ``coverage`` of the total weight.

    Ties in popularity are ordered by (count, share, CPU, types), so the cut is deterministic.
    """
    ranked = sorted(
        pairs, key=lambda sp: (-sp[1], sp[0].count, sp[0].share_milli, sp[0].cpu_milli, sp[0].types)
    )
    total = sum(p for _, p in pairs)
    kept: list[tuple[api.Shape, float]] = []
    covered = 0.0
    for s, p in ranked:
        if kept and covered >= coverage * total - 1e-9 * total:
            break
        kept.append((s, p))
        covered += p
    return kept


def top_shapes(workload: api.Workload, coverage: float = COVERAGE) -> api.Workload:
    """FGD's target workload M: the top shapes of a histogram covering ``coverage``, renormalized."""
    kept = top_pairs(list(zip(workload.shapes, workload.weights, strict=True)), coverage)
    norm = sum(p for _, p in kept)
    if norm <= 0:
        return workload
    return api.Workload(tuple(s for s, _ in kept), tuple(p / norm for _, p in kept))


quantize = fragscore.quantize
sigmoid_score = fragscore.sigmoid_score
score = fragscore.score
SCORE_THRESHOLDS = fragscore.SCORE_THRESHOLDS


class Fragmentation:
    """Memoized fragmentation measure ``F_n(M)`` for one target workload, in milli-GPU / ``UNIT``."""

    REPEATED = False
    """True for fgd-lookahead's measure (``fragcolumns.Plan`` reads it)."""

    def __init__(self, workload: api.Workload) -> None:
        self.workload = workload
        units = quantize(workload.weights)
        self._cpu_only = sum(p for s, p in zip(workload.shapes, units, strict=True) if s.count == 0)
        self._gpu = [
            (p, s.cpu_milli, s.share_milli, s.count, s.types)
            for s, p in zip(workload.shapes, units, strict=True)
            if s.count > 0
        ]
        self._thresholds = sorted({c for _, c, _, _, _ in self._gpu})
        self._typed = any(types for *_, types in self._gpu)
        self._memo: dict[tuple[str, int, FreeCards], int] = {}
        self._plans: dict[tuple[int, tuple[str, ...]], fragcolumns.Plan] = {}

    def of(self, model: str, cpu_free: int, free: FreeCards) -> int:
        """``F_n(M)`` for a node with this model, free CPU and free milli per card (exact integer)."""
        key = (
            model if self._typed else "",
            bisect.bisect_right(self._thresholds, cpu_free),
            tuple(sorted(free)),
        )
        hit = self._memo.get(key)
        if hit is None:
            hit = self._compute(model, cpu_free, key[2])
            if len(self._memo) >= MEMO_LIMIT:
                self._memo.clear()  # a long-lived extender sees ever new states; keep memory bounded
            self._memo[key] = hit
        return hit

    def shape(self, model: str, cpu_free: int, free: FreeCards, shape: api.Shape) -> int:
        """``F_n(m)`` for one shape in milli-GPU (unmemoized; for tests and reports)."""
        total = sum(free)
        if shape.count == 0 or not shares.type_allowed(model, shape.types):
            return total
        if cpu_free >= shape.cpu_milli and sum(1 for f in free if f >= shape.share_milli) >= shape.count:
            return sum(f for f in free if f < shape.share_milli)
        return total

    def _compute(self, model: str, cpu_free: int, free: FreeCards) -> int:
        """F for cards sorted in ascending order (as ``of`` keys them)."""
        below = [0, *itertools.accumulate(free)]  # below[i]: the i smallest cards
        total = below[-1]
        n = len(free)
        out = self._cpu_only * total
        for p, cpu, share, count, types in self._gpu:
            if types and not shares.type_allowed(model, types):
                out += p * total
                continue
            i = bisect.bisect_left(free, share)  # free[i:] reach the share, free[:i] are slivers
            out += p * (below[i] if cpu_free >= cpu and n - i >= count else total)
        return out

    def model_weights(self, model: str) -> fragcolumns.Weights:
        """The weights F sums on a node of this model: (CPU-only shapes, each GPU shape in order).

        FGD weighs every shape the same on every node (a shape the model cannot serve counts all
        free cards as fragments); fgd-lookahead overrides this.
        """
        return self._cpu_only, tuple(p for p, *_ in self._gpu)

    def plan(self, width: int, types: tuple[str, ...]) -> fragcolumns.Plan:
        """The batch path's tables for nodes of at most ``width`` cards whose models are ``types``."""
        key = (width, types)
        got = self._plans.get(key)
        if got is None:
            if len(self._plans) >= 8:
                self._plans.clear()
            got = fragcolumns.Plan(self._gpu, self.model_weights, self.REPEATED, width, types)
            self._plans[key] = got
        return got


def take_whole(free: FreeCards, count: int) -> FreeCards:
    """The free list after a whole-card pod takes the ``count`` lowest-numbered fully free cards."""
    out = list(free)
    for i, f in enumerate(out):
        if count == 0:
            break
        if f >= shares.FULL:
            out[i] = 0
            count -= 1
    return tuple(out)


def fgd_choice(
    frag: Fragmentation,
    model: str,
    cpu_free: int,
    free: FreeCards,
    d: shares.Demand,
    eligible: tuple[int, ...],
) -> tuple[int, int]:
    """FGD's (score, card) for a pod on a node; card -1 for a pod that does not pick by score.

    Sharing pod: for each eligible card in ascending order, the score of the fragmentation change;
    the first card reaching the maximum wins. Other pods: one score, cards chosen elsewhere.
    """
    old = frag.of(model, cpu_free, free)
    cpu_after = cpu_free - d.cpu_milli
    if not d.sharing:
        after = take_whole(free, d.gpus) if d.gpus else free
        return score(old - frag.of(model, cpu_after, after)), -1
    best, card = -1, -1
    seen: dict[int, int] = {}
    for g in sorted(eligible):
        f = free[g]
        if f < d.share_milli:
            continue
        got = seen.get(f)
        if got is None:
            after = free[:g] + (f - d.share_milli,) + free[g + 1 :]
            got = score(old - frag.of(model, cpu_after, after))
            seen[f] = got
        if got > best:
            best, card = got, g
    return max(best, 0), card


class FGD:
    """The FGD policy.

    ``ctx.workload`` is the observed shape histogram (the pod itself if absent); FGD measures
    against its most popular shapes covering 95 % of pods (``top_shapes``).
    """

    name = "fgd"
    idle_only = False
    learns_workload = True
    """Declared: scores against ``Context.workload`` (callers give a fallback until it is trusted)."""

    def __init__(self) -> None:
        self._source: api.Workload | None = None
        self._capacity: tuple[tuple[str, int], ...] = ()
        self._frag: Fragmentation | None = None

    def fragmentation(self, ctx: api.Context, d: shares.Demand) -> Fragmentation:
        """The memoized measure for the context's workload and capacity (rebuilt when either changes)."""
        workload = ctx.workload or api.Workload((shares.shape_of(d),), (1.0,))
        cached = self._frag
        if (
            cached is not None
            and (self._source is workload or self._source == workload)
            and (self._capacity is ctx.capacity or self._capacity == ctx.capacity)
        ):
            return cached
        self._source = workload
        self._capacity = ctx.capacity
        self._frag = self.measure_for(workload, ctx.capacity)
        return self._frag

    def measure_for(
        self, workload: api.Workload, capacity: tuple[tuple[str, int], ...] = ()
    ) -> Fragmentation:
        """The memoized measure for a workload histogram (FGD: its top shapes; capacity unused)."""
        return Fragmentation(top_shapes(workload))

    def score_node(self, state: nodes.NodeState, pod: requests.PodRequest, ctx: api.Context) -> api.Scored:
        """``int(100 * sigmoid((F_old - F_new) / 1000))``, the best card's for a sharing pod."""
        free = shares.free_milli(state)
        d = shares.demand(pod, shares.card_memory(state))
        eligible = tuple(range(len(free)))
        got, _ = fgd_choice(
            self.fragmentation(ctx, d), state.inventory.model, state.cpu_free_milli, free, d, eligible
        )
        return api.Scored(got)

    def score_columns(
        self,
        cols: columns.NodeColumns,
        rows: columns.IntArray,
        pod: requests.PodRequest,
        ctx: api.Context = api.EMPTY_CONTEXT,
    ) -> columns.IntArray:
        """``score_node`` of many rows at once (``fragcolumns``), for a pod ``vectorfit`` can judge."""

        def plan_for(d: shares.Demand) -> fragcolumns.Plan:
            return self.fragmentation(ctx, d).plan(cols.hot.shape[1], cols.types)

        got = fragcolumns.score_rows(cols, rows, pod, plan_for)
        return got if got is not None else self._score_each(cols, rows, pod, ctx)

    def _score_each(
        self,
        cols: columns.NodeColumns,
        rows: columns.IntArray,
        pod: requests.PodRequest,
        ctx: api.Context,
    ) -> columns.IntArray:
        """``score_node`` row by row from the columns (cards with more than a whole card free)."""
        view = fragcolumns.read(cols, rows)
        out = []
        for free, cpu, model, card_memory in view.each(cols.types):
            d = shares.demand(pod, card_memory)
            frag = self.fragmentation(ctx, d)
            out.append(fgd_choice(frag, model, cpu, free, d, tuple(range(len(free))))[0])
        return np.array(out, np.int64)

    def choose_cards_for_pod(
        self,
        state: nodes.NodeState,
        pod: requests.PodRequest,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: api.Context,
    ) -> tuple[int, ...] | None:
        """The card of least fragmentation growth for a sharing pod; lowest free cards otherwise."""
        free = shares.free_milli(state)
        d = shares.demand(pod, shares.card_memory(state))
        share = shares.request_share(request, shares.card_memory(state))
        if request.count == 1 and share < shares.FULL:
            d = shares.Demand(d.cpu_milli, share, 1, d.types)
            _, card = fgd_choice(
                self.fragmentation(ctx, d), state.inventory.model, state.cpu_free_milli, free, d, eligible
            )
            return (card,) if card >= 0 else None
        order = sorted(eligible)
        return tuple(order[: request.count]) if len(order) >= request.count else None

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: api.Context,
    ) -> tuple[int, ...] | None:
        """As ``choose_cards_for_pod`` for a pod without host CPU (the card rule alone)."""
        pod = requests.PodRequest(containers=(request,))
        return self.choose_cards_for_pod(state, pod, request, eligible, ctx)


def _build(args: Mapping[str, float]) -> api.Policy:
    return FGD()


FACTORIES: Mapping[str, api.PolicyFactory] = {"fgd": _build}
"""The policies this module defines, by registry name (``framework.registry`` collects them)."""
