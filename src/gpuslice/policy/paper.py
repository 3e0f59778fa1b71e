"""The five baseline policies of the FGD paper: Random, DotProd, GpuClustering, GpuPacking, BestFit.

Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient
Descent", USENIX ATC 2023; the arithmetic follows fgd-experiment.md section 6 (the authors'
simulator). Scores are integers in 0..100 truncated toward zero; resources are read through
``shares`` (free milli per card, per-card share d of the pod).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gpuslice.model import nodes, requests
from gpuslice.policy import registry, shares

MAX_SPEC_CPU = 128000
"""CPU normalizer (millicores of the largest node)."""
MAX_SPEC_GPU = 8000
"""GPU normalizer (milli-GPU of the largest node)."""


def _view(state: nodes.NodeState, pod: requests.PodRequest) -> tuple[tuple[int, ...], shares.Demand]:
    return shares.free_milli(state), shares.demand(pod, shares.card_memory(state))


class _BestCards:
    """The default GPU rule ("best"), shared by DotProd, GpuClustering, GpuPacking and BestFit."""

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: registry.Context,
    ) -> tuple[int, ...] | None:
        """Least free fitting card for a sharing request, lowest-numbered free cards otherwise."""
        share = shares.request_share(request, shares.card_memory(state))
        d = shares.Demand(0, share, request.count, ())
        return shares.best_cards(shares.free_milli(state), d, eligible)


class RandomPolicy:
    """Random: one feasible node drawn uniformly scores 100, the others 0 (a batch step)."""

    name = "random"

    def score_node(
        self, state: nodes.NodeState, pod: requests.PodRequest, ctx: registry.Context
    ) -> registry.Scored:
        """Every node scores 0 before the batch step."""
        return registry.Scored(0)

    def normalize(self, scores: np.ndarray, ctx: registry.Context) -> np.ndarray:
        """Give 100 to one uniformly drawn candidate (the first without a random source)."""
        out = np.zeros_like(scores)
        if len(out):
            out[int(ctx.rng.integers(len(out))) if ctx.rng is not None else 0] = registry.MAX_SCORE
        return out

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: registry.Context,
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

    def score_node(
        self, state: nodes.NodeState, pod: requests.PodRequest, ctx: registry.Context
    ) -> registry.Scored:
        """Smallest dot product of free resources and demand wins."""
        free, d = _view(state, pod)
        dot = (state.cpu_free_milli / MAX_SPEC_CPU) * (d.cpu_milli / MAX_SPEC_CPU) + (
            sum(free) / MAX_SPEC_GPU
        ) * (d.gpu_milli / MAX_SPEC_GPU)
        return registry.Scored(int(100 * (1 - dot / 2)))


class GpuClustering(_BestCards):
    """GpuClustering: put GPU pods with GPU pods of the same tag, then fill used nodes."""

    name = "clustering"

    def score_node(
        self, state: nodes.NodeState, pod: requests.PodRequest, ctx: registry.Context
    ) -> registry.Scored:
        """B + 75 (only this tag), + 50 (this tag among others), + 25 (no GPU pods), + 0 (others)."""
        free, d = _view(state, pod)
        if d.gpus == 0:
            return registry.Scored(0)
        b = 25 * (MAX_SPEC_GPU - sum(free)) // MAX_SPEC_GPU
        tags = shares.node_tags(state)
        if tags == {d.tag}:
            return registry.Scored(b + 75)
        if d.tag in tags:
            return registry.Scored(b + 50)
        if not tags:
            return registry.Scored(b + 25)
        return registry.Scored(b)


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

    def score_node(
        self, state: nodes.NodeState, pod: requests.PodRequest, ctx: registry.Context
    ) -> registry.Scored:
        """Score by how used the cards the pod would take are."""
        free, d = _view(state, pod)
        return registry.Scored(packing_score(free, d))


class BestFit(_BestCards):
    """BestFit: least leftover CPU and GPU (equal weights), min-max normalized over the candidates."""

    name = "bestfit"

    def score_node(
        self, state: nodes.NodeState, pod: requests.PodRequest, ctx: registry.Context
    ) -> registry.Scored:
        """Raw score ``int((1 - s) * 100)`` with s the mean normalized leftover."""
        free, d = _view(state, pod)
        s = (
            0.5 * (state.cpu_free_milli - d.cpu_milli) / MAX_SPEC_CPU
            + 0.5 * (sum(free) - d.gpu_milli) / MAX_SPEC_GPU
        )
        return registry.Scored(int((1 - s) * 100))

    def normalize(self, scores: np.ndarray, ctx: registry.Context) -> np.ndarray:
        """``(raw - lo) * 100 // (hi - lo)`` over the candidates, 0 when all are equal.

        Raw scores lie in 0..100, so hi - lo <= 100 and the step keeps the order strictly.
        """
        if not len(scores):
            return scores
        lo, hi = int(scores.min()), int(scores.max())
        if hi == lo:
            return np.zeros_like(scores)
        out: np.ndarray = (scores - lo) * registry.MAX_SCORE // (hi - lo)
        return out


def _factory(cls: type[registry.Policy]) -> registry.PolicyFactory:
    def build(args: Mapping[str, float]) -> registry.Policy:
        return cls()

    return build


for _cls in (RandomPolicy, DotProd, GpuClustering, GpuPacking, BestFit):
    registry.register(_cls.name, _factory(_cls))
