"""The five baseline policies of the FGD paper: Random, DotProd, GpuClustering, GpuPacking, BestFit.

Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient
Descent", USENIX ATC 2023; the arithmetic follows fgd-experiment.md section 6 (the authors'
simulator). Scores are integers in 0..100 truncated toward zero; resources are read through
``shares`` (free milli per card, per-card share d of the pod).

Every policy also scores many rows of ``columns.NodeColumns`` at once (``score_columns``, the batch
filter's fast path) with exactly ``score_node``'s result: ``columns`` packs each card's free milli,
each row's sum of them and its GPU-pod tag set (``shares.node_tags`` of the state it was given, so an
extender node, a plain ``NodeState``, has its tags estimated from usage as ``score_node`` does). The
integer arithmetic is the same in numpy (``//`` floors in both); the float formulas of DotProd and
BestFit are the same IEEE operations in the same order on the same operands (integers below 2**53
convert exactly), and ``np.trunc`` is Python's ``int()`` on a float. The pod's share d depends on
the node's first card only for a request in MiB; it is computed per row then.

Random and ``ctx.rng``: Random's node score draws nothing (0 everywhere); its one draw happens in
``normalize``, once over the candidates, whichever path scored them. Its card rule draws once per
``fit.place`` of a sharing pod, so the exact path (``fit.place`` on every node) advances the stream
once per feasible node while the fast path draws only for the node ``batch.choose`` places on:
feasibility and scores are identical on both paths, the position in the stream is not, and a card
drawn for the chosen node is an equally uniform draw either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from gpuslice.model import devices, nodes, requests
from gpuslice.policy import api, columns, shares

MAX_SPEC_CPU = 128000
"""CPU normalizer (millicores of the largest node)."""
MAX_SPEC_GPU = 8000
"""GPU normalizer (milli-GPU of the largest node)."""


_FIRST_MEM, _CPU_TOTAL, _CPU_USED, _SUM_FREE, _TAGS_ID, _NCARDS = (
    columns.ROW_FIELDS.index(f)
    for f in ("first_mem", "cpu_total", "cpu_used", "sum_free_milli", "tags_id", "ncards")
)
_FREE_MILLI = columns.CARD_FIELDS.index("free_milli")


def _view(state: nodes.NodeState, pod: requests.PodRequest) -> tuple[tuple[int, ...], shares.Demand]:
    return shares.free_milli(state), shares.demand(pod, shares.card_memory(state))


_IntLike = int | columns.IntArray


class _RowDemand(NamedTuple):
    """``shares.demand`` over many rows: CPU and card count are the pod's; the share may vary by row."""

    cpu_milli: int
    share_milli: _IntLike
    gpus: int


def _row_demand(node: columns.IntArray, pod: requests.PodRequest) -> _RowDemand:
    """``shares.demand(pod, first card's memory)`` for each row of ``cols.nodes[rows]``."""
    count = 0
    fixed = 0
    per_row: list[columns.IntArray] = []
    for req in pod.app_containers:
        if req is None or req.count <= 0:
            continue
        count += req.count
        if not req.exclusive and req.memory_mib > 0:
            # shares.request_share with a MiB request: a ceil of the card-memory share, per row
            by_cores = req.cores_clamped * shares.FULL // devices.FULL_CORES
            mem = node[:, _FIRST_MEM]
            by_memory = np.where(mem > 0, -(-req.memory_mib * shares.FULL // np.maximum(mem, 1)), shares.FULL)
            per_row.append(np.minimum(shares.FULL, np.maximum(by_cores, by_memory)))
        else:
            fixed = max(fixed, shares.request_share(req))
    if not count:
        return _RowDemand(pod.cpu_milli, 0, 0)
    share: _IntLike = fixed
    for arr in per_row:
        share = np.maximum(share, arr)
    return _RowDemand(pod.cpu_milli, share, count)


class _BestCards:
    """The default GPU rule ("best"), shared by DotProd, GpuClustering, GpuPacking and BestFit."""

    idle_only = False
    """Declared: no card filter beyond the fit (``api.Policy``)."""
    learns_workload = False
    """Declared: scores without the learned workload (``api.Policy``)."""

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: api.Context,
    ) -> tuple[int, ...] | None:
        """Least free fitting card for a sharing request, lowest-numbered free cards otherwise."""
        share = shares.request_share(request, shares.card_memory(state))
        d = shares.Demand(0, share, request.count, ())
        return shares.best_cards(shares.free_milli(state), d, eligible)


class RandomPolicy:
    """Random: one feasible node drawn uniformly scores 100, the others 0 (a batch step)."""

    name = "random"
    idle_only = False
    learns_workload = False

    def score_node(self, state: nodes.NodeState, pod: requests.PodRequest, ctx: api.Context) -> api.Scored:
        """Every node scores 0 before the batch step."""
        return api.Scored(0)

    def score_columns(
        self,
        cols: columns.NodeColumns,
        rows: columns.IntArray,
        pod: requests.PodRequest,
        ctx: api.Context,
    ) -> columns.IntArray:
        """``score_node`` for many rows: 0 (nothing is drawn; see the module docstring)."""
        return np.zeros(len(rows), np.int64)

    def normalize(self, scores: np.ndarray, ctx: api.Context) -> np.ndarray:
        """Give 100 to one uniformly drawn candidate (the first without a random source)."""
        out = np.zeros_like(scores)
        if len(out):
            out[int(ctx.rng.integers(len(out))) if ctx.rng is not None else 0] = api.MAX_SCORE
        return out

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: api.Context,
    ) -> tuple[int, ...] | None:
        """A sharing request gets a uniformly random eligible card; whole cards the lowest-numbered."""
        order = sorted(eligible)
        if len(order) < request.count:
            return None
        if shares.request_share(request, shares.card_memory(state)) < shares.FULL and request.count == 1:
            pick = int(ctx.rng.integers(len(order))) if ctx.rng is not None else 0
            return (order[pick],)
        return tuple(order[: request.count])


class DotProd(_BestCards):
    """DotProd (Tetris): ``int(100 * (1 - dot / 2))`` of normalized (cpu, gpu) node and pod vectors."""

    name = "dotprod"

    def score_node(self, state: nodes.NodeState, pod: requests.PodRequest, ctx: api.Context) -> api.Scored:
        """Smallest dot product of free resources and demand wins."""
        free, d = _view(state, pod)
        dot = (state.cpu_free_milli / MAX_SPEC_CPU) * (d.cpu_milli / MAX_SPEC_CPU) + (
            sum(free) / MAX_SPEC_GPU
        ) * (d.gpu_milli / MAX_SPEC_GPU)
        return api.Scored(int(100 * (1 - dot / 2)))

    def score_columns(
        self,
        cols: columns.NodeColumns,
        rows: columns.IntArray,
        pod: requests.PodRequest,
        ctx: api.Context,
    ) -> columns.IntArray:
        """``score_node`` for many rows (the same float operations in the same order)."""
        node = cols.nodes[rows]
        d = _row_demand(node, pod)
        cpu_free = node[:, _CPU_TOTAL] - node[:, _CPU_USED]
        dot = (cpu_free / MAX_SPEC_CPU) * (d.cpu_milli / MAX_SPEC_CPU) + (
            node[:, _SUM_FREE] / MAX_SPEC_GPU
        ) * ((d.gpus * d.share_milli) / MAX_SPEC_GPU)
        return _trunc(100 * (1 - dot / 2))


class GpuClustering(_BestCards):
    """GpuClustering: put GPU pods with GPU pods of the same tag, then fill used nodes."""

    name = "clustering"

    def score_node(self, state: nodes.NodeState, pod: requests.PodRequest, ctx: api.Context) -> api.Scored:
        """B + 75 (only this tag), + 50 (this tag among others), + 25 (no GPU pods), + 0 (others)."""
        free, d = _view(state, pod)
        if d.gpus == 0:
            return api.Scored(0)
        b = 25 * (MAX_SPEC_GPU - sum(free)) // MAX_SPEC_GPU
        return api.Scored(b + _cluster_bonus(shares.node_tags(state), d.tag))

    def score_columns(
        self,
        cols: columns.NodeColumns,
        rows: columns.IntArray,
        pod: requests.PodRequest,
        ctx: api.Context,
    ) -> columns.IntArray:
        """``score_node`` for many rows (tags from ``columns``' per-row tag set)."""
        node = cols.nodes[rows]
        d = _row_demand(node, pod)
        if d.gpus == 0:
            return np.zeros(len(rows), np.int64)
        b = 25 * (MAX_SPEC_GPU - node[:, _SUM_FREE]) // MAX_SPEC_GPU
        tags_id = node[:, _TAGS_ID]
        sharing = d.share_milli < shares.FULL
        whole_tag = f"{d.gpus}-gpu"
        if isinstance(sharing, bool):
            table = np.array(
                [_cluster_bonus(t, shares.SHARE_TAG if sharing else whole_tag) for t in cols.tag_sets]
            )
            out: columns.IntArray = b + table[tags_id]
            return out
        share_t = np.array([_cluster_bonus(t, shares.SHARE_TAG) for t in cols.tag_sets])
        whole_t = np.array([_cluster_bonus(t, whole_tag) for t in cols.tag_sets])
        out = b + np.where(sharing, share_t[tags_id], whole_t[tags_id])
        return out


def _cluster_bonus(tags: frozenset[str], tag: str) -> int:
    """GpuClustering's bonus of a node's tag set for a pod's tag (75, 50, 25 or 0)."""
    if tags == {tag}:
        return 75
    if tag in tags:
        return 50
    return 0 if tags else 25


def packing_score(free: tuple[int, ...], d: shares.Demand) -> int:
    """GpuPacking's score: partly used cards first, then free cards on used nodes, then small empty nodes."""
    if d.gpus == 0:
        return 0
    fully_free = sum(1 for f in free if f >= shares.FULL)
    if fully_free == len(free):
        return max(33 - fully_free, fully_free)
    picked = sorted(f for f in free if f >= d.share_milli)[: d.gpus]
    used_free = sum(1 for f in picked if f >= shares.FULL)
    if used_free > 0:
        return max(50 - used_free, 33)
    return max(100 - sum(f * 100 // shares.FULL for f in picked) // 10, 50)


class GpuPacking(_BestCards):
    """GpuPacking (see ``packing_score``)."""

    name = "packing"

    def score_node(self, state: nodes.NodeState, pod: requests.PodRequest, ctx: api.Context) -> api.Scored:
        """Score by how used the cards the pod would take are."""
        free, d = _view(state, pod)
        return api.Scored(packing_score(free, d))

    def score_columns(
        self,
        cols: columns.NodeColumns,
        rows: columns.IntArray,
        pod: requests.PodRequest,
        ctx: api.Context,
    ) -> columns.IntArray:
        """``packing_score`` for many rows (padding cards are left out as ``free`` leaves them)."""
        node = cols.nodes[rows]
        d = _row_demand(node, pod)
        if d.gpus == 0:
            return np.zeros(len(rows), np.int64)
        free = cols.cards[rows, :, _FREE_MILLI].astype(np.int64)
        k = free.shape[1]
        real = np.arange(k) < node[:, _NCARDS][:, None]
        fully_free = ((free >= shares.FULL) & real).sum(axis=1)
        empty_node = np.maximum(33 - fully_free, fully_free)
        share = d.share_milli if isinstance(d.share_milli, int) else d.share_milli[:, None]
        # the cards that fit the share, ascending; the first ``gpus`` of them are picked
        big = np.iinfo(np.int64).max
        fits = np.sort(np.where(real & (free >= share), free, big), axis=1)[:, : d.gpus]
        picked = fits != big
        used_free = (picked & (fits >= shares.FULL)).sum(axis=1)
        pct = np.where(picked, fits * 100 // shares.FULL, 0).sum(axis=1)
        out: columns.IntArray = np.where(
            fully_free == node[:, _NCARDS],
            empty_node,
            np.where(used_free > 0, np.maximum(50 - used_free, 33), np.maximum(100 - pct // 10, 50)),
        )
        return out


class BestFit(_BestCards):
    """BestFit: least leftover CPU and GPU (equal weights), min-max normalized over the candidates."""

    name = "bestfit"

    def score_node(self, state: nodes.NodeState, pod: requests.PodRequest, ctx: api.Context) -> api.Scored:
        """Raw score ``int((1 - s) * 100)`` with s the mean normalized leftover."""
        free, d = _view(state, pod)
        s = (
            0.5 * (state.cpu_free_milli - d.cpu_milli) / MAX_SPEC_CPU
            + 0.5 * (sum(free) - d.gpu_milli) / MAX_SPEC_GPU
        )
        return api.Scored(int((1 - s) * 100))

    def score_columns(
        self,
        cols: columns.NodeColumns,
        rows: columns.IntArray,
        pod: requests.PodRequest,
        ctx: api.Context,
    ) -> columns.IntArray:
        """Raw ``score_node`` for many rows (same float operations and order); ``normalize`` is separate."""
        node = cols.nodes[rows]
        d = _row_demand(node, pod)
        cpu_free = node[:, _CPU_TOTAL] - node[:, _CPU_USED]
        s = (
            0.5 * (cpu_free - d.cpu_milli) / MAX_SPEC_CPU
            + 0.5 * (node[:, _SUM_FREE] - d.gpus * d.share_milli) / MAX_SPEC_GPU
        )
        return _trunc((1 - s) * 100)

    def normalize(self, scores: np.ndarray, ctx: api.Context) -> np.ndarray:
        """``(raw - lo) * 100 // (hi - lo)`` over the candidates, 0 when all are equal.

        Raw scores lie in 0..100, so hi - lo <= 100 and the step keeps the order strictly.
        """
        if not len(scores):
            return scores
        lo, hi = int(scores.min()), int(scores.max())
        if hi == lo:
            return np.zeros_like(scores)
        out: np.ndarray = (scores - lo) * api.MAX_SCORE // (hi - lo)
        return out


def _trunc(x: columns.FloatArray) -> columns.IntArray:
    """Python's ``int()`` of each float (toward zero)."""
    out: columns.IntArray = np.trunc(x).astype(np.int64)
    return out


def _factory(cls: type[api.Policy]) -> api.PolicyFactory:
    def build(args: Mapping[str, float]) -> api.Policy:
        return cls()

    return build


FACTORIES: Mapping[str, api.PolicyFactory] = {
    c.name: _factory(c) for c in (RandomPolicy, DotProd, GpuClustering, GpuPacking, BestFit)
}
"""The policies this module defines, by registry name (``framework.registry`` collects them)."""
