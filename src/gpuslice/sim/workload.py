"""Workload construction of the FGD benchmark (fgd-experiment.md section 3) and the target workload M."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

import numpy as np

from gpuslice.policy import api, fragmentation
from gpuslice.sim import trace

COVERAGE = fragmentation.COVERAGE


def sorted_by_name(pods: Sequence[trace.TracePod]) -> list[trace.TracePod]:
    """W: the trace pods sorted by name."""
    return sorted(pods, key=lambda p: p.name)


def shape_counts(pods: Sequence[trace.TracePod]) -> Counter[api.Shape]:
    """How many pods have each shape (cpu, d, n, types); memory is ignored."""
    return Counter(
        api.Shape(cpu_milli=p.cpu_milli, share_milli=p.share, count=p.count, types=p.types) for p in pods
    )


def histogram(pods: Sequence[trace.TracePod]) -> api.Workload:
    """All shapes of the pods with their frequencies (most popular first).

    This is what a policy gets as ``ctx.workload``; FGD cuts it to its target workload M itself.
    """
    counts = shape_counts(pods)
    total = sum(counts.values())
    ranked = sorted(
        counts.items(), key=lambda kv: (-kv[1], kv[0].count, kv[0].share_milli, kv[0].cpu_milli, kv[0].types)
    )
    return api.Workload(tuple(s for s, _ in ranked), tuple(n / total for _, n in ranked))


def target_workload(pods: Sequence[trace.TracePod], coverage: float = COVERAGE) -> api.Workload:
    """FGD's M for these pods: the most popular shapes covering ``coverage`` of pods, renormalized."""
    return fragmentation.top_shapes(histogram(pods), coverage)


@dataclasses.dataclass(frozen=True)
class Arrivals:
    """One seed's experiment input.

    Attributes:
        seq: indices into W, in arrival order.
        node_order: node indices (file order) sorted by their random rank, best rank first.
        demand_milli: total GPU demand n * d of ``seq``.
    """

    seq: np.ndarray
    node_order: np.ndarray
    demand_milli: int


def arrivals(
    w: Sequence[trace.TracePod], node_count: int, capacity_milli: int, seed: int, tune: float
) -> Arrivals:
    """Shuffle W, inflate (or tune down) to ``tune`` x capacity, and rank the nodes, all from ``seed``.

    Inflation draws pods from W with replacement and stops at the first draw whose per-GPU share
    would overshoot the target (the artifact checks d but accumulates n * d).
    """
    rng = np.random.default_rng(seed)
    gpu = np.array([p.gpu_milli for p in w], dtype=np.int64)
    share = np.array([p.share for p in w], dtype=np.int64)
    seq = list(rng.permutation(len(w)).tolist())
    target = tune * capacity_milli
    total = int(gpu.sum())
    if total < target and len(w):
        while True:
            k = int(rng.integers(len(w)))
            if total + share[k] > target:
                break
            seq.append(k)
            total += int(gpu[k])
    else:
        while total > target and seq:
            k = seq.pop(int(rng.integers(len(seq))))
            total -= int(gpu[k])
    rank = rng.permutation(node_count)
    return Arrivals(np.array(seq, dtype=np.int64), np.argsort(rank, kind="stable"), total)
