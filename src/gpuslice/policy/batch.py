"""Judge many nodes for one pod at once: vectorised fast path, exact fallback.

``evaluate`` gives, for every named node, exactly what ``fit.place`` would say (code, reasons and
card reasons) plus a node score for feasible ones. The fast path (``vectorfit``) covers the common
pod shapes: one GPU container, no GPU init containers, no UUID lists or ``numa_bind`` (type, mode
and NUMA-hint selectors and quota are fine). It evaluates the card checks of ``cards`` as numpy
expressions over ``columns.NodeColumns`` in the same order. Any other pod goes through
``fit.place`` node by node. The fast path decides feasibility only; the allocation
for the chosen node still comes from ``fit.place`` (which asks the card policy), so a card policy
that refuses a choice on an otherwise feasible node is caught there (``choose`` moves on).

Node scores are vectorised for node policies that are ``api.BatchScorer`` (binpack, spread, the
topology-aware family, ...; ``api.Plugin.batch``), and computed per feasible node otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from gpuslice.model import allocations, nodes, requests, status
from gpuslice.policy import api, columns, fit, vectorfit
from gpuslice.policy import mig as migs
from gpuslice.policy import quota as quotas

IntArray = columns.IntArray

_UNKNOWN = -1  # key of a name the columns do not hold


class Evaluation(NamedTuple):
    """Per-node outcome of one pod against many nodes, in input order.

    Attributes:
        names: the nodes judged.
        feasible: True where the pod fits.
        scores: node scores where feasible, -1 elsewhere.
        failures: for every infeasible node, its status and card reasons.
    """

    names: tuple[str, ...]
    feasible: np.ndarray
    scores: IntArray
    failures: Mapping[str, tuple[status.Status, fit.CardReasons]]

    def ranked(self) -> list[str]:
        """Feasible nodes, best first (``best_first``)."""
        idx = np.flatnonzero(self.feasible)
        names = [self.names[i] for i in idx.tolist()]
        return [names[k] for k in best_first(names, self.scores[idx])]


def evaluate(
    states: Mapping[str, nodes.NodeState],
    cols: columns.NodeColumns | None,
    names: Sequence[str],
    pod: requests.PodRequest,
    node_policy: api.Plugin,
    card_policy: api.CardChooser,
    ctx: api.Context = api.EMPTY_CONTEXT,
    quota: quotas.QuotaView | None = None,
) -> Evaluation:
    """Judge every named node (see the module docstring); unknown names are unregistered nodes."""
    names = tuple(names)
    n = len(names)
    req = None
    # No registered node at all (an extender that started before any GPU node registered): the
    # loop below names every node unregistered; the columns have no row to index.
    if (
        cols is not None
        and cols.hot.shape[0] > 0
        and cols.hot.shape[1] <= vectorfit.MAX_CARDS
        and not cols.has_mig  # MIG placements are judged by ``fit.place`` only
    ):
        req = vectorfit.request_of(pod, quota)
    failures: dict[str, tuple[status.Status, fit.CardReasons]] = {}
    scores = np.full(n, -1, np.int64)
    if req is not None and cols is not None:
        rows = cols.rows(names)
        known = rows >= 0
        feasible, keys = vectorfit.judge(
            cols, np.where(known, rows, 0), pod, req, quota, card_policy.idle_only
        )
        feasible &= known
        keys[~known] = _UNKNOWN
        bad = np.flatnonzero(~feasible)
        if len(bad):
            uniq, inverse = np.unique(keys[bad], return_inverse=True)
            decoded = [_UNREGISTERED if u == _UNKNOWN else vectorfit.decode(u) for u in uniq.tolist()]
            failures = dict(
                zip([names[i] for i in bad.tolist()], [decoded[j] for j in inverse.tolist()], strict=True)
            )
        ok_idx = np.flatnonzero(feasible)
        if node_policy.batch is not None:
            scores[ok_idx] = node_policy.batch.score_columns(cols, rows[ok_idx], pod, ctx)
        else:
            for i in ok_idx:
                scores[i] = node_policy.score_node(states[names[i]], pod, ctx).score
        return Evaluation(names, feasible, scores, failures)
    feasible = np.zeros(n, np.bool_)
    for j, name in enumerate(names):
        state = states.get(name)
        if state is None:
            failures[name] = _UNREGISTERED
            continue
        p = fit.place(state, pod, card_policy, ctx, quota)
        if p.status.ok:
            feasible[j] = True
            scores[j] = node_policy.score_node(state, pod, ctx).score
            if ctx.mig_rule == migs.FRAGMENTATION and p.allocation is not None:
                scores[j] = migs.node_score(state, p.allocation, scores[j], ctx)
        else:
            failures[name] = (p.status, p.card_reasons)
    return Evaluation(names, feasible, scores, failures)


_UNREGISTERED = (status.Status(status.Code.UNRESOLVABLE, (status.NODE_UNREGISTERED,)), ())


def best_first(names: Sequence[str], scores: np.ndarray) -> Iterator[int]:
    """Positions of ``names`` best first: the higher score, then the lower node name.

    This is the extender's order of nodes (the simulator's too, its nodes being named in rank
    order where the two are compared). The first position costs one pass over the scores (the
    common case); the full order is sorted only when a caller asks past it.
    """
    n = len(names)
    if n == 0:
        return
    top = np.flatnonzero(scores == scores.max()).tolist()
    first = top[0] if len(top) == 1 else min(top, key=names.__getitem__)
    yield first
    if n > 1:
        order = np.lexsort((np.asarray(names), -np.asarray(scores)))
        yield from (i for i in order.tolist() if i != first)


def first_placed(
    states: Mapping[str, nodes.NodeState],
    names: Sequence[str],
    scores: np.ndarray,
    pod: requests.PodRequest,
    card_policy: api.CardChooser,
    ctx: api.Context = api.EMPTY_CONTEXT,
    quota: quotas.QuotaView | None = None,
) -> tuple[int, allocations.PodAllocation] | None:
    """The best node (``best_first`` by ``scores``) whose cards the card policy accepts, and its cards.

    ``names`` are nodes the pod fits (an evaluation's feasible ones) and ``scores`` theirs, after
    the node policy's candidate step where the caller applies one. Each in turn goes through
    ``fit.place``; a node the card policy refuses (or without a state) gives way to the next.
    Returns the winner's position in ``names`` and its allocation, or None when none places.
    """
    for i in best_first(names, scores):
        state = states.get(names[i])
        if state is None:
            continue
        alloc = fit.place(state, pod, card_policy, ctx, quota).allocation
        if alloc is not None:
            return i, alloc
    return None


def choose(
    states: Mapping[str, nodes.NodeState],
    evaluation: Evaluation,
    pod: requests.PodRequest,
    card_policy: api.CardChooser,
    ctx: api.Context = api.EMPTY_CONTEXT,
    quota: quotas.QuotaView | None = None,
) -> fit.Placement | None:
    """The placement on the first feasible node (``best_first``) whose cards the card policy accepts."""
    idx = np.flatnonzero(evaluation.feasible)
    names = [evaluation.names[i] for i in idx.tolist()]
    won = first_placed(states, names, evaluation.scores[idx], pod, card_policy, ctx, quota)
    return None if won is None else fit.Placement(status.SUCCESS, won[1])
