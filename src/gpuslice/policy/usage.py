"""Weighted device usage shared by ``binpack`` and ``spread``.

Usage of a card = ``w_mem * memory_ratio + w_cores * cores_ratio`` with default weights 0.6 and 0.4
(normalised to sum 1); a ratio whose capacity is 0 counts 0, and ratios are capped at 1.

* Card key (card choice): the card's usage *after* the request is placed on it.
* Node score (0..100): the node's usage after placing the pod, from its totals over all cards:
  ``floor(100 * (w_mem * min(1, (used_mem + pod_mem) / total_mem)
  + w_cores * min(1, (used_cores + pod_cores) / total_cores)) + 0.5)``, where the pod's memory
  uses the first card's size for percentage requests. Where the pod lands on the node does not
  change its totals, so the node score needs no card choice (``batch`` computes it vectorised).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from gpuslice.model import nodes, requests
from gpuslice.policy import api, columns, fit

_NCARDS, _FIRST_MEM, _SUM_TOTAL_MEM, _SUM_USED_MEM, _SUM_TOTAL_CORES, _SUM_USED_CORES = (
    columns.ROW_FIELDS.index(f)
    for f in ("ncards", "first_mem", "sum_total_mem", "sum_used_mem", "sum_total_cores", "sum_used_cores")
)
DEFAULT_MEMORY_WEIGHT = 0.6
DEFAULT_CORES_WEIGHT = 0.4


def weights(args: Mapping[str, float]) -> tuple[float, float]:
    """Memory and cores weights from policy args ``memory`` / ``cores``, normalised to sum 1."""
    unknown = set(args) - {"memory", "cores"}
    if unknown:
        raise ValueError(f"unknown usage weights {sorted(unknown)}")
    wm = float(args.get("memory", DEFAULT_MEMORY_WEIGHT))
    wc = float(args.get("cores", DEFAULT_CORES_WEIGHT))
    if wm < 0 or wc < 0 or wm + wc <= 0:
        raise ValueError("usage weights must be non-negative with a positive sum")
    return wm / (wm + wc), wc / (wm + wc)


def _ratio(used: int, total: int) -> float:
    return 0.0 if total <= 0 else min(1.0, used / total)


def card_key(state: nodes.NodeState, i: int, req: requests.ContainerRequest, wm: float, wc: float) -> float:
    """Usage of card i after the request is placed on it."""
    dev = state.inventory.devices[i]
    u = state.usage[i]
    return wm * _ratio(u.memory_mib + req.memory_on(dev.memory_mib), dev.memory_mib) + wc * _ratio(
        u.cores + req.cores_clamped, dev.cores
    )


def node_usage_score(state: nodes.NodeState, pod: requests.PodRequest, wm: float, wc: float) -> int:
    """The node's weighted usage after placing the pod, as an integer 0..100."""
    devs = state.inventory.devices
    if not devs:
        return 0
    total_mem = sum(d.memory_mib for d in devs)
    total_cores = sum(d.cores for d in devs)
    used_mem = sum(u.memory_mib for u in state.usage)
    used_cores = sum(u.cores for u in state.usage)
    pod_mem, pod_cores = fit.demand(pod, devs[0].memory_mib)
    u = wm * _ratio(used_mem + pod_mem, total_mem) + wc * _ratio(used_cores + pod_cores, total_cores)
    return min(api.MAX_SCORE, math.floor(api.MAX_SCORE * u + 0.5))


def hami_card_key(
    state: nodes.NodeState, i: int, req: requests.ContainerRequest, w: requests.ScoringWeights
) -> float:
    """HAMi's card score with ``hami.io/device-scoring-weights``, request terms included.

    ``Ws * (used_slots + 1) / slots + Wc * (used_cores + cores) / card_cores
    + Wm * (used_mem + mem) / card_mem`` (a term whose capacity is 0 counts 0). HAMi itself never
    adds the request terms for NVIDIA cards (``pkg/scheduler/policy/gpu_policy.go`` compares the
    request type ``NVIDIA`` with the model name, so they never match); gpuslice does.
    """
    dev = state.inventory.devices[i]
    u = state.usage[i]
    return (
        w.slot * _ratio(u.slots + 1, dev.split_count)
        + w.core * _ratio(u.cores + req.cores_clamped, dev.cores)
        + w.memory * _ratio(u.memory_mib + req.memory_on(dev.memory_mib), dev.memory_mib)
    )


def ranking_key(
    state: nodes.NodeState,
    req: requests.ContainerRequest,
    wm: float,
    wc: float,
    card_weights: requests.ScoringWeights | None,
) -> Callable[[int], float]:
    """A card's rank key: its usage after the request lands on it.

    HAMi's weighted card score when the pod gives ``card_weights``, else the weighted usage
    ``card_key``.
    """
    if card_weights is not None:
        return lambda i: hami_card_key(state, i, req, card_weights)
    return lambda i: card_key(state, i, req, wm, wc)


def choose_by_key(
    state: nodes.NodeState,
    req: requests.ContainerRequest,
    eligible: tuple[int, ...],
    wm: float,
    wc: float,
    fullest: bool,
    card_weights: requests.ScoringWeights | None = None,
) -> tuple[int, ...]:
    """The ``req.count`` fullest (or emptiest) eligible cards by ``ranking_key``; ties by card index."""
    sign = -1.0 if fullest else 1.0
    key = ranking_key(state, req, wm, wc, card_weights)
    ranked = sorted(eligible, key=lambda i: (sign * key(i), i))
    return tuple(ranked[: req.count])


def node_usage_scores(
    cols: columns.NodeColumns, rows: columns.IntArray, pod: requests.PodRequest, wm: float, wc: float
) -> columns.IntArray:
    """``node_usage_score`` for many rows at once (same float operations, same results)."""
    node = cols.nodes[rows]
    tm, um = node[:, _SUM_TOTAL_MEM], node[:, _SUM_USED_MEM]
    tc, uc = node[:, _SUM_TOTAL_CORES], node[:, _SUM_USED_CORES]
    if any(
        c is not None and c.memory_mib <= 0 and c.memory_percentage != requests.MEMORY_PERCENTAGE_UNSET
        for c in pod.containers
    ):
        uniq, inverse = np.unique(node[:, _FIRST_MEM], return_inverse=True)
        per = np.array([fit.demand(pod, int(m)) for m in uniq], np.int64).reshape(-1, 2)
        dm, dc = per[inverse, 0], per[inverse, 1]
    else:
        dm_, dc_ = fit.demand(pod, 0)
        dm, dc = np.int64(dm_), np.int64(dc_)
    with np.errstate(divide="ignore", invalid="ignore"):
        r_mem = np.where(tm > 0, np.minimum(1.0, (um + dm) / np.where(tm > 0, tm, 1)), 0.0)
        r_cores = np.where(tc > 0, np.minimum(1.0, (uc + dc) / np.where(tc > 0, tc, 1)), 0.0)
    u = wm * r_mem + wc * r_cores
    out = np.minimum(api.MAX_SCORE, np.floor(api.MAX_SCORE * u + 0.5)).astype(np.int64)
    out[node[:, _NCARDS] == 0] = 0
    return out
