"""Judge many nodes for one pod at once: vectorised fast path, exact fallback.

``evaluate`` gives, for every named node, exactly what ``fit.place`` would say (code, reasons and
card reasons) plus a node score for feasible ones. The fast path applies to the common pod shape:
one GPU container (no GPU init containers), no selectors, no quota limit. It evaluates the card
checks of ``cards`` as numpy expressions over ``columns.NodeColumns`` in the same order. Any other
pod goes through ``fit.place`` node by node. The fast path decides feasibility only; the allocation
for the chosen node still comes from ``fit.place`` (which asks the card policy), so a card policy
that refuses a choice on an otherwise feasible node is caught there (``choose`` moves on).

Node scores are vectorised for policies with a ``score_columns(cols, rows, pod)`` method (binpack,
spread), and computed per feasible node otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from gpuslice.model import nodes, requests, status
from gpuslice.policy import columns, fit, registry
from gpuslice.policy import quota as quotas

IntArray = columns.IntArray

# Card codes of the fast path, in check order; 0 = eligible, -1 = no card (padding).
_CARD_REASONS = (
    status.DEVICE_UNHEALTHY,
    status.DEVICE_CORDONED,
    status.GPU_SLOTS_EXHAUSTED,
    status.EXCLUSIVE_CONFLICT,
    status.INSUFFICIENT_GPU_MEMORY,
    status.INSUFFICIENT_GPU_CORES,
)
_ORDER = {r: k for k, r in enumerate(status.ALL_REASONS)}
# Node-level outcomes of the fast path (before the card counts).
_K_CARDS, _K_CPU, _K_HMEM, _K_UNREG, _K_COUNT = range(5)
_KIND_REASON = {
    _K_CPU: status.INSUFFICIENT_CPU,
    _K_HMEM: status.INSUFFICIENT_HOST_MEMORY,
    _K_UNREG: status.NODE_UNREGISTERED,
    _K_COUNT: status.INSUFFICIENT_GPU_COUNT,
}
_BITS = 7  # bits per reason count in the packed outcome key (cards per node < 128)


@runtime_checkable
class ColumnScorer(Protocol):
    """A node policy that can score many rows at once (identical to its ``score_node``)."""

    def score_columns(self, cols: columns.NodeColumns, rows: IntArray, pod: requests.PodRequest) -> IntArray:
        """Scores 0..100 of the given rows."""
        ...


class Evaluation(NamedTuple):
    """Per-node outcome of one pod against many nodes, in input order.

    Attributes:
        names: the nodes judged.
        feasible: True where the pod fits.
        scores: node scores where feasible, -1 elsewhere.
        tiebreaks: secondary keys (higher wins), 0 where feasible nodes were scored vectorised.
        failures: for every infeasible node, its status and card reasons.
    """

    names: tuple[str, ...]
    feasible: np.ndarray
    scores: IntArray
    tiebreaks: np.ndarray
    failures: Mapping[str, tuple[status.Status, fit.CardReasons]]

    def ranked(self) -> list[str]:
        """Feasible nodes, best first (score, then tiebreak, then input order)."""
        idx = np.flatnonzero(self.feasible)
        order = np.lexsort((idx, -self.tiebreaks[idx], -self.scores[idx]))
        return [self.names[i] for i in idx[order]]


def fast_request(
    pod: requests.PodRequest, quota: quotas.QuotaView | None
) -> requests.ContainerRequest | None:
    """The one GPU request when the pod qualifies for the vectorised path, else None."""
    if quota is not None and not quota.unlimited:
        return None
    if pod.selectors != requests.NO_SELECTORS:
        return None
    found: requests.ContainerRequest | None = None
    for position, c in enumerate(pod.containers):
        if c is None or c.count <= 0:
            continue
        if position < pod.init_count or found is not None:
            return None
        found = c
    return found


def evaluate(
    states: Mapping[str, nodes.NodeState],
    cols: columns.NodeColumns | None,
    names: Sequence[str],
    pod: requests.PodRequest,
    node_policy: registry.Policy,
    card_policy: registry.Policy,
    ctx: registry.Context = registry.EMPTY_CONTEXT,
    quota: quotas.QuotaView | None = None,
) -> Evaluation:
    """Judge every named node (see the module docstring); unknown names are unregistered nodes."""
    names = tuple(names)
    n = len(names)
    req = fast_request(pod, quota) if cols is not None else None
    failures: dict[str, tuple[status.Status, fit.CardReasons]] = {}
    scores = np.full(n, -1, np.int64)
    tiebreaks = np.zeros(n, np.float64)
    if req is not None and cols is not None:
        rows = cols.rows(names)
        known = rows >= 0
        feasible, keys, resolvable = _fast(cols, np.where(known, rows, 0), pod, req)
        feasible &= known
        cache: dict[tuple[int, bool], tuple[status.Status, fit.CardReasons]] = {}
        for i in np.flatnonzero(~feasible):
            if not known[i]:
                failures[names[i]] = _UNREGISTERED
                continue
            k = (int(keys[i]), bool(resolvable[i]))
            got = cache.get(k)
            if got is None:
                got = cache[k] = _decode(*k)
            failures[names[i]] = got
        ok_idx = np.flatnonzero(feasible)
        if isinstance(node_policy, ColumnScorer):
            scores[ok_idx] = node_policy.score_columns(cols, rows[ok_idx], pod)
        else:
            for i in ok_idx:
                s = node_policy.score_node(states[names[i]], pod, ctx)
                scores[i], tiebreaks[i] = s.score, s.tiebreak
        return Evaluation(names, feasible, scores, tiebreaks, failures)
    feasible = np.zeros(n, np.bool_)
    for j, name in enumerate(names):
        state = states.get(name)
        if state is None:
            failures[name] = _UNREGISTERED
            continue
        p = fit.place(state, pod, card_policy, ctx, quota)
        if p.status.ok:
            feasible[j] = True
            s = node_policy.score_node(state, pod, ctx)
            scores[j], tiebreaks[j] = s.score, s.tiebreak
        else:
            failures[name] = (p.status, p.card_reasons)
    return Evaluation(names, feasible, scores, tiebreaks, failures)


_UNREGISTERED = (status.Status(status.Code.UNRESOLVABLE, (status.NODE_UNREGISTERED,)), ())


def _fast(
    cols: columns.NodeColumns, rows: IntArray, pod: requests.PodRequest, req: requests.ContainerRequest
) -> tuple[np.ndarray, IntArray, np.ndarray]:
    """Feasibility, packed outcome keys and 'fits the emptied node' for the rows."""
    total_mem = cols.total_mem[rows]
    used_mem = cols.used_mem[rows]
    total_cores = cols.total_cores[rows]
    used_cores = cols.used_cores[rows]
    split = cols.split[rows]
    used_slots = cols.used_slots[rows]
    state = cols.card_state[rows]
    if req.memory_mib > 0 or req.memory_percentage == requests.MEMORY_PERCENTAGE_UNSET:
        mem: IntArray | int = req.memory_mib
    else:
        mem = total_mem * req.memory_percentage // 100
    cores = req.cores_clamped
    in_use = used_slots > 0
    if req.exclusive:
        conflict = in_use
    else:
        conflict = in_use & (total_cores > 0) & (used_cores >= total_cores)
    code = np.select(
        [
            state == columns.CARD_ABSENT,
            state == columns.CARD_UNHEALTHY,
            state == columns.CARD_CORDONED,
            used_slots >= split,
            conflict,
            total_mem - used_mem < mem,
            total_cores - used_cores < cores,
        ],
        [-1, 1, 2, 3, 4, 5, 6],
        0,
    )
    eligible = (code == 0).sum(axis=1)
    ncards = cols.ncards[rows]
    kind = np.full(len(rows), _K_CARDS, np.int64)
    kind[ncards < req.count] = _K_COUNT
    kind[ncards == 0] = _K_UNREG
    cpu_total = cols.cpu_total[rows]
    hmem_total = cols.hmem_total[rows]
    kind[(hmem_total > 0) & (pod.memory_mib > hmem_total - cols.hmem_used[rows])] = _K_HMEM
    kind[(cpu_total > 0) & (pod.cpu_milli > cpu_total - cols.cpu_used[rows])] = _K_CPU
    feasible = (kind == _K_CARDS) & (eligible >= req.count)
    keys = kind << (_BITS * len(_CARD_REASONS))
    for j in range(len(_CARD_REASONS)):
        keys |= (code == j + 1).sum(axis=1) << (_BITS * j)
    empty_ok = (state == columns.CARD_OK) & (split > 0) & (total_mem >= mem) & (total_cores >= cores)
    resolvable = (
        (empty_ok.sum(axis=1) >= req.count)
        & ((cpu_total <= 0) | (pod.cpu_milli <= cpu_total))
        & ((hmem_total <= 0) | (pod.memory_mib <= hmem_total))
    )
    return feasible, keys, resolvable


def _decode(key: int, resolvable: bool) -> tuple[status.Status, fit.CardReasons]:
    """The status and card reasons a packed outcome key stands for (as ``fit.place`` builds them)."""
    code = status.Code.UNSCHEDULABLE if resolvable else status.Code.UNRESOLVABLE
    kind = key >> (_BITS * len(_CARD_REASONS))
    if kind != _K_CARDS:
        return status.Status(code, (_KIND_REASON[kind],)), ()
    mask = (1 << _BITS) - 1
    counts = [(r, (key >> (_BITS * j)) & mask) for j, r in enumerate(_CARD_REASONS)]
    ordered = tuple(sorted(((r, c) for r, c in counts if c > 0), key=lambda rc: _ORDER[rc[0]]))
    top = max(c for _, c in ordered)
    return status.Status(code, tuple(r for r, c in ordered if c == top)), ordered


def choose(
    states: Mapping[str, nodes.NodeState],
    evaluation: Evaluation,
    pod: requests.PodRequest,
    card_policy: registry.Policy,
    ctx: registry.Context = registry.EMPTY_CONTEXT,
    quota: quotas.QuotaView | None = None,
) -> fit.Placement | None:
    """The placement on the best feasible node whose cards the card policy accepts, or None."""
    for name in evaluation.ranked():
        p = fit.place(states[name], pod, card_policy, ctx, quota)
        if p.status.ok:
            return p
    return None
