"""Filter and prioritize as plain functions of a pod's ``cycle.Cycle``: no I/O, no clock, no HTTP.

The wire mapping of outcomes is fixed here, in ``_reject``: ``UNSCHEDULABLE`` goes to
``FailedNodes`` (preemption may help), ``UNRESOLVABLE`` and ``ERROR`` to
``FailedAndUnresolvableNodes``. Messages are the reason codes alone, never node names, so
kube-scheduler's ``0/N nodes are available: 3 InsufficientGPUMemory, ...`` histogram stays short.

Which node wins follows one total order, the simulator's: the higher policy score (after the
policy's candidate step, e.g. BestFit's normalisation), then the lower node name
(``batch.best_first``).
With ``node_choice: extender`` the filter answers only the first node in that order that the card
policy accepts; with ``rank`` prioritize answers that order as ranks (``docs/node-choice.md``).
With a ``lock_margin``, the nodes whose HAMi node lock is busy for the pod (``busy``, from
``extender.lockview``) count too: among the nodes within the margin of the best score a free one
goes first (``policy.lockchoice``; ``lock_aware``), as in the simulator's lock-window model.

Which policies act for the pod (its overrides, the workload fallback while the learned workload
is untrusted) the cycle decides once (``profile.Profile``, ``cycle.Cycle``).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from gpuslice.framework import cycle as cycles
from gpuslice.framework import logs, view
from gpuslice.framework import profile as profiles
from gpuslice.model import nodes, requests, status
from gpuslice.policy import api, batch, fit, lockchoice, shares

FEASIBLE = "Feasible"

UNFIT = cycles.UNFIT
"""The internal score of a node the pod does not fit (``score_nodes``)."""


def rank_scores(names: Sequence[str], scores: np.ndarray, levels: int) -> np.ndarray:
    """Ranks in ``batch.best_first`` order: ``levels`` for the best node, one less for each next, then 0.

    ``UNFIT`` nodes get 0 and take no rank.
    """
    out = np.zeros(len(names), np.int64)
    if len(names):
        order = np.lexsort((np.asarray(names), -np.asarray(scores)))[:levels]
        order = order[scores[order] > UNFIT]
        out[order] = np.arange(levels, levels - len(order), -1)
    return out


@dataclasses.dataclass
class FilterOutcome:
    """A filter answer before encoding, plus the counts for events and metrics."""

    feasible: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    reasons: collections.Counter[str]
    scores: np.ndarray | None = None
    """Internal 0..100 scores of ``feasible`` (same order, from the batch evaluation), when computed."""
    lock_moved: bool = False
    """The node chosen (``node_choice: extender``) is not the best-scoring one: its lock was busy."""
    chosen: bool = False
    """``feasible`` holds only the node the extender chose (``node_choice: extender``) out of
    ``reasons[FEASIBLE]`` nodes the pod fits."""
    candidates: tuple[list[str], np.ndarray] | None = None
    """When ``chosen``: every node the pod fits and its internal score, the choice's candidates
    (kube-scheduler runs no prioritize for a single feasible node; the bind event names these)."""


def reject_all(names: Sequence[str], reason: str) -> FilterOutcome:
    """Every node unresolvable for one pod-level reason (e.g. an invalid request)."""
    return FilterOutcome([], {}, dict.fromkeys(names, reason), collections.Counter({reason: len(names)}))


def planned(names: Sequence[str], node: str, reason: str) -> FilterOutcome:
    """Only ``node`` feasible (a gang member's planned node); every other one unresolvable for ``reason``."""
    others = {n: reason for n in names if n != node}
    counts = collections.Counter({FEASIBLE: 1})
    if others:
        counts[reason] = len(others)
    return FilterOutcome([node], {}, others, counts)


def filter_nodes(
    cyc: cycles.Cycle,
    names: Sequence[str],
    log: logs.Log,
    invalid: Collection[str] = (),
    excluded: Mapping[str, str] | None = None,
    busy: Collection[str] = (),
) -> FilterOutcome:
    """Which of ``names`` can hold the cycle's pod, and why the others cannot.

    Uses the vectorised evaluation (``Cycle.evaluate``: identical to ``fit.place`` node by node),
    which also scores the feasible nodes; the scores are kept in the outcome so prioritize can
    reuse them. At ``-v 5`` every node goes through ``fit.place`` so each card can be logged.
    Nodes in ``excluded`` (node -> reason code: a stale device-plugin handshake, a stuck node lock)
    fail with that reason without being evaluated. ``busy`` names the nodes whose lock is busy for
    the pod; with ``node_choice: extender`` and a ``lock_margin`` the choice prefers the others
    (``lock_aware``).
    """
    if not cyc.pod.wants_gpu:
        return FilterOutcome(list(names), {}, {}, collections.Counter({FEASIBLE: len(names)}))
    skipped: dict[str, str] = {}
    if excluded:
        skipped = {n: excluded[n] for n in names if n in excluded}
        if skipped:
            names = [n for n in names if n not in skipped]
    out = _evaluate(cyc, names, log, invalid)
    if cyc.profile.extender_decides and len(out.feasible) > 1:
        _keep_choice(out, cyc, log, busy)
    for name, reason in skipped.items():
        out.failed[name] = reason
        out.reasons[reason] += 1
    return out


def _evaluate(
    cyc: cycles.Cycle, names: Sequence[str], log: logs.Log, invalid: Collection[str]
) -> FilterOutcome:
    """The filter over nodes that are not excluded."""
    if log.enabled(5):
        return _filter_verbose(cyc, names, log, invalid)
    ev = cyc.evaluate(names)
    out = FilterOutcome([], {}, {}, collections.Counter())
    if log.enabled(4):
        _log_evaluation(log, cyc.pod, ev)
    # Feasible nodes in bulk (the common case), then the failures one by one.
    idx = np.flatnonzero(ev.feasible)
    names_ = ev.names
    out.feasible = list(names_) if len(idx) == len(names_) else [names_[i] for i in idx.tolist()]
    out.scores = ev.scores[idx]
    if out.feasible:
        out.reasons[FEASIBLE] = len(out.feasible)
    for name, (st, _) in ev.failures.items():
        _reject(out, cyc, name, st, invalid)
    return out


def _keep_choice(out: FilterOutcome, cyc: cycles.Cycle, log: logs.Log, busy: Collection[str] = ()) -> None:
    """Narrow ``out.feasible`` to the node the extender chooses (``Cycle.first_placed``).

    The vectorised filter decides feasibility without asking the card policy, so the winner is
    placed once here; a node whose cards the policy refuses gives way to the next. Nodes in
    ``busy`` give way to free ones within the lock margin (``lock_aware``).
    """
    names = out.feasible
    scores = out.scores if out.scores is not None else score_nodes(cyc, names, log)
    stepped = cyc.stepped(scores)
    keys = lock_aware(names, stepped, busy, cyc.profile)
    won = cyc.first_placed(names, keys)
    if won is not None:
        i = won[0]
        out.candidates = (names, scores)
        out.feasible, out.scores = [names[i]], scores[i : i + 1]
        out.chosen = True
        out.lock_moved = keys is not stepped and i != next(batch.best_first(names, stepped))
        if out.lock_moved and log.enabled(3):
            log.v(3, "lock margin: chose a node with a free lock", pod=cyc.pod.name, node=names[i])


def locked_near(names: Sequence[str], scores: np.ndarray, busy: Collection[str], margin: float) -> np.ndarray:
    """True where the node is in ``busy``, looked up for the nodes near the best only.

    ``lockchoice`` ignores the locks of the nodes outside the margin, so they are not looked up.
    """
    locked = np.zeros(len(names), np.bool_)
    if busy:
        for i in lockchoice.near_best(scores, margin).tolist():
            locked[i] = names[i] in busy
    return locked


def lock_aware(
    names: Sequence[str], scores: np.ndarray, busy: Collection[str], profile: profiles.Profile
) -> np.ndarray:
    """What the choice goes by once the node locks count (``Profile.lock_margin``).

    ``scores`` are the candidates' internal scores after the candidate step (``UNFIT`` where the
    pod does not fit). Where the order is what counts (``extender``, ``rank``): keys that put the
    free nodes within the margin of the best first (``lockchoice.prefer_free``). Where the scores
    themselves go on the wire (``blend``): scores with the busy nodes within the margin lowered
    below the free ones (``lockchoice.demote_busy``). Margin 0, no busy node, or nothing to change:
    ``scores`` itself.
    """
    margin = profile.lock_margin
    if not margin > 0 or not busy or not len(names):
        return scores
    locked = locked_near(names, scores, busy, margin)
    if profile.ranks:
        return lockchoice.prefer_free(scores, locked, margin)
    return lockchoice.demote_busy(scores, locked, margin)


def _log_evaluation(log: logs.Log, pod: requests.PodRequest, ev: batch.Evaluation) -> None:
    for i, name in enumerate(ev.names):
        if ev.feasible[i]:
            log.v(4, "filter node", pod=pod.name, node=name, feasible=True, score=int(ev.scores[i]))
        else:
            st, card_reasons = ev.failures[name]
            why = " ".join(f"{n}x{r}" for r, n in card_reasons) or ",".join(st.reasons)
            log.v(4, "filter node", pod=pod.name, node=name, feasible=False, reason=why)


def _reject(
    out: FilterOutcome, cyc: cycles.Cycle, name: str, st: status.Status, invalid: Collection[str]
) -> None:
    """File a rejected node under the right map with its reason code."""
    if cyc.state(name) is None:
        reason = view.node_problem(name, invalid)
        out.unresolvable[name] = reason
    else:
        reason = ",".join(st.reasons) or status.INVALID_REQUEST
        bucket = out.failed if st.code is status.Code.UNSCHEDULABLE else out.unresolvable
        bucket[name] = reason
    out.reasons[reason] += 1


def _filter_verbose(
    cyc: cycles.Cycle, names: Sequence[str], log: logs.Log, invalid: Collection[str]
) -> FilterOutcome:
    """The filter node by node with ``fit.place``, logging every node and card."""
    pod = cyc.pod
    out = FilterOutcome([], {}, {}, collections.Counter())
    for name in names:
        state = cyc.state(name)
        if state is None:
            _reject(out, cyc, name, status.SUCCESS, invalid)
            log.v(4, "filter node", pod=pod.name, node=name, feasible=False, reason=out.unresolvable[name])
            continue
        placement = cyc.place(state)
        if placement.status.ok:
            out.feasible.append(name)
            out.reasons[FEASIBLE] += 1
        else:
            _reject(out, cyc, name, placement.status, invalid)
        log.v(4, "filter node", pod=pod.name, node=name, feasible=placement.status.ok, reason=_why(placement))
        _log_cards(log, state, pod, placement)
    return out


def _why(placement: fit.Placement) -> str:
    if placement.status.ok:
        return ""
    return " ".join(f"{n}x{r}" for r, n in placement.card_reasons) or ",".join(placement.status.reasons)


def _log_cards(
    log: logs.Log, state: nodes.NodeState, pod: requests.PodRequest, placement: fit.Placement
) -> None:
    chosen = set()
    if placement.allocation is not None:
        chosen = {g.uuid for grants in placement.allocation.containers for g in grants}
    for i, dev in enumerate(state.inventory.devices):
        for req in pod.containers:
            if req is None:
                continue
            log.v(
                5,
                "filter card",
                node=state.name,
                uuid=dev.uuid,
                free_mem=state.free_memory(i),
                free_cores=state.free_cores(i),
                free_slots=state.free_slots(i),
                req_mem=req.memory_on(dev.memory_mib),
                req_cores=req.cores_clamped,
                chosen=dev.uuid in chosen,
            )


def score_nodes(cyc: cycles.Cycle, names: Sequence[str], log: logs.Log) -> np.ndarray:
    """Internal 0..100 scores of ``names`` (int64, same order), ``UNFIT`` where the pod does not fit.

    Nodes the pod does not fit (unknown, removed, registered without cards, full) are ``UNFIT`` and
    GPU-less pods score 0, at every log level: ``-v 4`` logs the same scores, it does not compute
    others. The wire gives an unfit node 0 (``wire.extender_scores`` clips; ranks skip it).
    """
    pod = cyc.pod
    if not pod.wants_gpu:
        return np.zeros(len(names), np.int64)
    ev = cyc.evaluate(names)
    scores = ev.scores
    if log.enabled(4):
        for name, score, fits in zip(ev.names, scores.tolist(), ev.feasible.tolist(), strict=True):
            log.v(4, "score node", pod=pod.name, node=name, policy=cyc.node.name, score=score, fits=fits)
    return scores


@dataclasses.dataclass(frozen=True)
class Filtered:
    """What a filter computed for one pod, kept for its prioritize.

    Attributes:
        resource_version: the pod's resourceVersion when filtered (a changed pod is a miss).
        nodes: the snapshot's node map then; unchanged nodes keep the same ``NodeState`` object.
        names: the feasible nodes, in the order returned to kube-scheduler.
        scores: their internal scores, same order.
        names_json: ``names`` as the JSON array sent (prioritize compares its raw ``NodeNames``).
    """

    resource_version: str
    nodes: Mapping[str, Any]
    names: list[str]
    scores: np.ndarray
    names_json: bytes = b""

    def weigh(self) -> int:
        """Bytes it holds for a memo's budget: its names (list, strings, JSON), scores and node map.

        The node map is usually shared with the snapshot and other entries; it is counted anyway,
        so entries that pin old snapshots stay within the budget too.
        """
        return 16 * len(self.nodes) + 58 * len(self.names) + 2 * len(self.names_json) + self.scores.nbytes


def rescore(cyc: cycles.Cycle, names: Sequence[str], log: logs.Log, filtered: Filtered) -> np.ndarray:
    """Scores from the filter's evaluation, recomputed only for nodes whose state changed since.

    Unchanged nodes keep the very same ``NodeState`` object across snapshots, so an identity check
    tells which scores are still exact. The common case (the same snapshot and the filter's own
    answer as candidates) returns the filter's array as is.
    """
    if not cyc.pod.wants_gpu:
        return np.zeros(len(names), np.int64)
    nodes_now = cyc.states
    if nodes_now is filtered.nodes and names == filtered.names:
        return filtered.scores  # the same snapshot and nodes: nothing changed
    old_nodes = filtered.nodes
    old_scores = dict(zip(filtered.names, filtered.scores.tolist(), strict=True))
    out = np.zeros(len(names), np.int64)
    stale: list[int] = []
    for i, name in enumerate(names):
        score = old_scores.get(name)
        state = nodes_now.get(name)
        if score is not None and state is not None and state is old_nodes.get(name):
            out[i] = score
        else:
            stale.append(i)
    if stale:
        out[stale] = score_nodes(cyc, [names[i] for i in stale], log)
    return out


def shape(snap: view.Snapshot, pod: requests.PodRequest, names: Sequence[str]) -> api.Shape:
    """The pod's shape for the workload histogram (shares relative to the first known node's cards)."""
    card_memory = 0
    for name in names:
        state = view.node_state(snap, name)
        if state is not None and state.inventory.devices:
            card_memory = state.inventory.devices[0].memory_mib
            break
    return shares.shape_of(shares.demand(pod, card_memory))


def summary(outcome: FilterOutcome) -> str:
    """``3/5 nodes feasible, 2 InsufficientGPUMemory`` for events and logs.

    When the extender chose the node (``FilterOutcome.chosen``) the count is of the nodes the pod
    fits, with the choice said apart: ``2/3 nodes feasible (1 chosen), 1 InsufficientGPUMemory``.
    """
    total = sum(outcome.reasons.values())
    fits = outcome.reasons[FEASIBLE] if outcome.chosen else len(outcome.feasible)
    parts = [
        f"{fits}/{total} nodes feasible" + (f" ({len(outcome.feasible)} chosen)" if outcome.chosen else "")
    ]
    parts += [
        f"{n} {r}"
        for r, n in sorted(outcome.reasons.items(), key=lambda rn: (-rn[1], rn[0]))
        if r != FEASIBLE
    ]
    return ", ".join(parts)
