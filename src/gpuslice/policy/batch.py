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

import functools
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
_I32 = 2**31 - 1
_RESOLVABLE_BIT = _BITS * len(_CARD_REASONS) + 4
_UNKNOWN = -1  # key of a name the columns do not hold
# Card codes in the failure path: 0 eligible, 1 absent (not counted), then _CARD_REASONS in order.
_ABSENT, _FIRST_REASON = 1, 2
_EXCLUSIVE, _MEMORY, _CORES = 5, 6, 7
_NCODES = 8
_SHIFTS = np.arange(len(_CARD_REASONS), dtype=np.int64) * _BITS
assert columns.HELD - columns.BLOCKED + _ABSENT == _EXCLUSIVE
_NCARDS, _CPU_TOTAL, _CPU_USED, _HMEM_TOTAL, _HMEM_USED = (
    columns.ROW_FIELDS.index(f) for f in ("ncards", "cpu_total", "cpu_used", "hmem_total", "hmem_used")
)


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
        feasible, keys = _fast(cols, np.where(known, rows, 0), pod, req)
        feasible &= known
        keys[~known] = _UNKNOWN
        bad = np.flatnonzero(~feasible)
        if len(bad):
            uniq, inverse = np.unique(keys[bad], return_inverse=True)
            decoded = [_UNREGISTERED if u == _UNKNOWN else _decode(u) for u in uniq.tolist()]
            failures = dict(
                zip([names[i] for i in bad.tolist()], [decoded[j] for j in inverse.tolist()], strict=True)
            )
        ok_idx = np.flatnonzero(feasible)
        score_columns = getattr(node_policy, "score_columns", None)  # ColumnScorer (isinstance is slow)
        if score_columns is not None:
            scores[ok_idx] = score_columns(cols, rows[ok_idx], pod)
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
) -> tuple[np.ndarray, IntArray]:
    """Feasibility for the rows, and for infeasible rows a packed outcome key (see ``_decode``)."""
    hot = cols.hot[rows]
    node = cols.nodes[rows]
    flag, free_mem, free_cores = hot[:, :, 0], hot[:, :, 1], hot[:, :, 2]
    if req.memory_mib > 0 or req.memory_percentage == requests.MEMORY_PERCENTAGE_UNSET:
        mem: np.ndarray | int = min(req.memory_mib, _I32)
    else:
        mem = hot[:, :, 3].astype(np.int64) * req.memory_percentage // 100
    cores = req.cores_clamped
    ok = (flag == columns.FREE) if req.exclusive else (flag < columns.BLOCKED)
    ok &= (free_mem >= mem) & (free_cores >= cores)
    eligible = ok.sum(axis=1)
    ncards = node[:, _NCARDS]
    cpu_total = node[:, _CPU_TOTAL]
    hmem_total = node[:, _HMEM_TOTAL]
    kind = np.full(len(rows), _K_CARDS, np.int64)
    kind[ncards < req.count] = _K_COUNT
    kind[ncards == 0] = _K_UNREG
    if pod.memory_mib > 0:
        kind[(hmem_total > 0) & (pod.memory_mib > hmem_total - node[:, _HMEM_USED])] = _K_HMEM
    if pod.cpu_milli > 0:
        kind[(cpu_total > 0) & (pod.cpu_milli > cpu_total - node[:, _CPU_USED])] = _K_CPU
    feasible = (kind == _K_CARDS) & (eligible >= req.count)
    keys = np.zeros(len(rows), np.int64)
    bad = np.flatnonzero(~feasible)
    if len(bad) == 0:
        return feasible, keys
    # Per-card reason codes of the infeasible rows, in ``cards`` order (0 = eligible).
    h = hot[bad]
    bflag = h[:, :, 0]
    bmem = mem[bad] if isinstance(mem, np.ndarray) else mem
    code = np.where(bflag >= columns.BLOCKED, bflag - (columns.BLOCKED - _ABSENT), 0)
    if req.exclusive:
        code[(code == 0) & (bflag == columns.SHARED)] = _EXCLUSIVE
    code[(code == 0) & (h[:, :, 1] < bmem)] = _MEMORY
    code[(code == 0) & (h[:, :, 2] < cores)] = _CORES
    nb, k = code.shape
    counts = np.bincount((code + np.arange(nb)[:, None] * _NCODES).ravel(), minlength=nb * _NCODES)
    counts = counts.reshape(nb, _NCODES)[:, _FIRST_REASON:]
    key = (counts << _SHIFTS).sum(axis=1) | (kind[bad] << (_BITS * len(_CARD_REASONS)))
    idle_ok = (h[:, :, 5] == 1) & (h[:, :, 3] >= bmem) & (h[:, :, 4] >= cores)
    ct, ht = cpu_total[bad], hmem_total[bad]
    resolvable = (
        (idle_ok.sum(axis=1) >= req.count)
        & ((ct <= 0) | (pod.cpu_milli <= ct))
        & ((ht <= 0) | (pod.memory_mib <= ht))
    )
    keys[bad] = key | (resolvable.astype(np.int64) << _RESOLVABLE_BIT)
    return feasible, keys


@functools.lru_cache(maxsize=4096)
def _decode(key: int) -> tuple[status.Status, fit.CardReasons]:
    """The status and card reasons a packed outcome key stands for (as ``fit.place`` builds them).

    Bits: 7 per card reason count (``_CARD_REASONS`` order), then the node-level kind, then the
    'fits the emptied node' bit that makes the code UNSCHEDULABLE rather than UNRESOLVABLE.
    """
    code = status.Code.UNSCHEDULABLE if key >> _RESOLVABLE_BIT & 1 else status.Code.UNRESOLVABLE
    kind = key >> (_BITS * len(_CARD_REASONS)) & 0xF
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
    if not evaluation.feasible.any():
        return None
    key = np.where(evaluation.feasible, evaluation.scores, -1)
    best = np.flatnonzero(key == key.max())
    if len(best) == 1 or not evaluation.tiebreaks[best].any():
        p = fit.place(states[evaluation.names[best[0]]], pod, card_policy, ctx, quota)
        if p.status.ok:
            return p
    for name in evaluation.ranked():
        p = fit.place(states[name], pod, card_policy, ctx, quota)
        if p.status.ok:
            return p
    return None
