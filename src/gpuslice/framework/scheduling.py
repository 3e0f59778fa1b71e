"""Filter and prioritize as plain functions of a snapshot: no I/O, no clock, no HTTP.

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

While the learned target workload is untrusted (the snapshot's workload is None, see
``cache.shapes``), a policy that learns it (``registry.learns_workload``: fgd, fgd-lookahead) is
replaced by the configured ``workload_fallback`` policy, at node level (``Policies.node`` given the
context) and at card level (``Policies.card`` wraps it to choose by the context it is asked with),
as the simulator's ``engine.Placer`` does; docs/workload.md.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np

from gpuslice.codec import keys
from gpuslice.framework import logs, view
from gpuslice.model import config as model_config
from gpuslice.model import nodes, requests, status
from gpuslice.policy import batch, chains, fit, lockchoice, registry, shares

FEASIBLE = "Feasible"


@dataclasses.dataclass(frozen=True)
class Policies:
    """Every registered policy built once at startup, and the configured defaults.

    The card default and ``hami.io/gpu-scheduler-policy`` may also be HAMi chains
    (``binpack,numa``, ``mutex``; ``policy.chains``), built on first use and kept. A per-pod
    override that names no policy is ignored and the configured default applies, as HAMi does
    (``GetGPUSchedulerPolicyByPod``); ``ignored`` says why, for a Warning event.
    """

    by_name: Mapping[str, registry.Policy]
    node_default: str
    card_default: str
    choice: str = model_config.DEFAULT_NODE_CHOICE
    """How the node choice reaches kube-scheduler (``model.config.NODE_CHOICES``)."""
    fallback: str = model_config.DEFAULT_WORKLOAD.fallback
    """The policy standing in for learning ones while the workload is untrusted (``pod``: none)."""
    job_label: str = ""
    """The pod label naming a pod's job (``requests.PodRequest.job``; '' = its controller owner)."""
    telemetry_max_age_s: float | None = None
    """Telemetry older than this counts as absent (``registry.Context.telemetry_max_age_s``)."""
    clock: Callable[[], float] | None = None
    """Wall-clock seconds for ``context`` (injected by ``serve``; None = no clock: nothing is stale)."""
    lock_margin: float = model_config.DEFAULT_LOCK_MARGIN
    """Near the best score by this fraction of the scale, prefer a free node lock (``lock_aware``)."""

    @classmethod
    def build(
        cls,
        node_default: str,
        card_default: str,
        choice: str = model_config.DEFAULT_NODE_CHOICE,
        fallback: str = model_config.DEFAULT_WORKLOAD.fallback,
    ) -> Policies:
        """Build all registered policies (unknown defaults or fallback raise ``UnknownPolicyError``)."""
        if choice not in model_config.NODE_CHOICES:
            raise ValueError(f"node choice must be one of {', '.join(model_config.NODE_CHOICES)}")
        built = {name: registry.get(name) for name in registry.names()}
        registry.get(node_default), chains.card_policy(card_default)
        if fallback != model_config.WORKLOAD_FALLBACK_POD:
            registry.get(fallback)
        return cls(built, node_default, card_default, choice, fallback)

    @property
    def extender_decides(self) -> bool:
        """True when the filter answers only the node the extender chooses."""
        return self.choice == "extender"

    @property
    def ranks(self) -> bool:
        """True when prioritize answers ranks (``extender`` and ``rank``), False for ``blend``."""
        return self.choice != "blend"

    def node(self, pod: requests.PodRequest, ctx: registry.Context | None = None) -> registry.Policy:
        """The pod's node policy: its override when registered, else the configured default.

        Given the context the pod is scored with, a policy that learns the workload gives way to the
        fallback while the context has no workload (the histogram is untrusted).
        """
        policy = self.by_name.get(pod.node_policy) if pod.node_policy else None
        policy = policy or self.by_name[self.node_default]
        if ctx is not None and ctx.workload is None:
            return self._untrusted(policy)
        return policy

    def _untrusted(self, policy: registry.Policy) -> registry.Policy:
        """``policy`` while the workload is untrusted: the fallback when it learns the workload."""
        fallback = (
            None if self.fallback == model_config.WORKLOAD_FALLBACK_POD else self.by_name[self.fallback]
        )
        return registry.acting(policy, fallback, None)

    def card(self, pod: requests.PodRequest) -> registry.Policy:
        """The pod's card policy (its override when valid, else the default), bound to the pod.

        Binding it to the pod gives pod-aware card rules (FGD weighs the host CPU the pod takes
        too) the same view the simulator gives them; chains need no pod and are not wrapped.
        """
        name = pod.card_policy or self.card_default
        if self._card_problem(name) is not None:
            name = self.card_default
        policy = self.by_name.get(name)
        if policy is None:
            return chains.card_policy(name)
        fallback = self._untrusted(policy)
        if fallback is not policy:
            return UntilTrusted(shares.PodBound(policy, pod), shares.PodBound(fallback, pod))
        return shares.PodBound(policy, pod)

    def ignored(self, pod: requests.PodRequest) -> list[str]:
        """Why the pod's policy overrides are ignored (empty when they are valid or absent)."""
        out: list[str] = []
        if pod.node_policy and pod.node_policy not in self.by_name:
            out.append(
                f"{keys.NODE_SCHEDULER_POLICY}: unknown policy {pod.node_policy!r}, "
                f"using {self.node_default!r}"
            )
        problem = self._card_problem(pod.card_policy) if pod.card_policy else None
        if problem is not None:
            out.append(f"{keys.GPU_SCHEDULER_POLICY}: {problem}; using {self.card_default!r}")
        return out

    def _card_problem(self, name: str) -> str | None:
        """Why ``name`` is neither a registered policy nor a valid chain; None when it is one."""
        if name in self.by_name:
            return None
        try:
            chains.card_policy(name)
        except registry.UnknownPolicyError as err:
            return str(err)
        return None


class UntilTrusted:
    """A card policy that learns the workload, handing each call to ``fallback`` while it is untrusted.

    The context each call gets says which: no workload (``ctx.workload`` None) is untrusted. So
    filter, bind and preempt, which all ask with the snapshot's context, choose alike.
    """

    def __init__(self, learned: registry.Policy, fallback: registry.Policy) -> None:
        self.learned = learned
        self.fallback = fallback

    @property
    def name(self) -> str:
        """The learning policy's name."""
        return self.learned.name

    def score_node(
        self, state: nodes.NodeState, pod: requests.PodRequest, ctx: registry.Context
    ) -> registry.Scored:
        """The score of whichever policy applies under ``ctx``."""
        return self._under(ctx).score_node(state, pod, ctx)

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: registry.Context,
    ) -> tuple[int, ...] | None:
        """The cards whichever policy applies under ``ctx`` chooses."""
        return self._under(ctx).choose_cards(state, request, eligible, ctx)

    def _under(self, ctx: registry.Context) -> registry.Policy:
        return self.learned if ctx.workload is not None else self.fallback


UNFIT = -1
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


def candidate_step(policy: registry.Policy, scores: np.ndarray, ctx: registry.Context) -> np.ndarray:
    """Apply a policy's batch step over the scores of the nodes of one prioritize request.

    Some policies are defined relative to the candidates (BestFit's min-max normalization, Random's
    single winner); the simulator applies the same step over its feasible nodes, and so does this
    over the nodes the pod fits (``UNFIT`` ones stay so).
    """
    fit_ = scores > UNFIT
    if not fit_.any():
        return scores
    if fit_.all():
        return shares.normalize(policy, scores, ctx)
    out = scores.copy()
    out[fit_] = shares.normalize(policy, scores[fit_], ctx)
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


def context(
    snap: view.Snapshot, pod: requests.PodRequest | None = None, policies: Policies | None = None
) -> registry.Context:
    """The policy context: the recent-request workload and the cards per model, for FGD-style policies.

    Given the pod and the policies, also the time and telemetry age limit (``Policies.clock``,
    ``Policies.telemetry_max_age_s``) and the pod's job with the nodes holding its other pods, for
    ``balanced`` (docs/topology.md).
    """
    if pod is None or policies is None:
        return registry.Context(
            workload=view.workload(snap), capacity=view.capacity(snap), job_nodes=registry.NO_JOB_NODES
        )
    job = pod.job(policies.job_label)
    return registry.Context(
        workload=view.workload(snap),
        capacity=view.capacity(snap),
        now=None if policies.clock is None else policies.clock(),
        telemetry_max_age_s=policies.telemetry_max_age_s,
        job=job,
        job_nodes=view.job_nodes(snap, job),
    )


def reject_all(names: Sequence[str], reason: str) -> FilterOutcome:
    """Every node unresolvable for one pod-level reason (e.g. an invalid request)."""
    return FilterOutcome([], {}, dict.fromkeys(names, reason), collections.Counter({reason: len(names)}))


def filter_nodes(
    snap: view.Snapshot,
    pod: requests.PodRequest,
    names: Sequence[str],
    policies: Policies,
    log: logs.Log,
    invalid: Collection[str] = (),
    excluded: Mapping[str, str] | None = None,
    busy: Collection[str] = (),
) -> FilterOutcome:
    """Which of ``names`` can hold the pod, and why the others cannot.

    Uses the vectorised ``batch.evaluate`` (identical to ``fit.place`` node by node), which also
    scores the feasible nodes; the scores are kept in the outcome so prioritize can reuse them.
    At ``-v 5`` every node goes through ``fit.place`` so each card can be logged. Nodes in
    ``excluded`` (node -> reason code: a stale device-plugin handshake, a stuck node lock) fail
    with that reason without being evaluated. ``busy`` names the nodes whose lock is busy for the
    pod; with ``node_choice: extender`` and a ``lock_margin`` the choice prefers the others
    (``lock_aware``).
    """
    if not pod.wants_gpu:
        return FilterOutcome(list(names), {}, {}, collections.Counter({FEASIBLE: len(names)}))
    card_policy = policies.card(pod)
    ctx = context(snap, pod, policies)
    node_policy = policies.node(pod, ctx)
    skipped: dict[str, str] = {}
    if excluded:
        skipped = {n: excluded[n] for n in names if n in excluded}
        if skipped:
            names = [n for n in names if n not in skipped]
    out = _evaluate(snap, pod, names, node_policy, card_policy, log, invalid, ctx)
    if policies.extender_decides and len(out.feasible) > 1:
        _keep_choice(out, snap, pod, policies, log, ctx, busy)
    for name, reason in skipped.items():
        out.failed[name] = reason
        out.reasons[reason] += 1
    return out


def _evaluate(
    snap: view.Snapshot,
    pod: requests.PodRequest,
    names: Sequence[str],
    node_policy: registry.Policy,
    card_policy: registry.Policy,
    log: logs.Log,
    invalid: Collection[str],
    ctx: registry.Context | None = None,
) -> FilterOutcome:
    """The filter over nodes that are not excluded."""
    if log.enabled(5):
        return _filter_verbose(snap, pod, names, card_policy, log, invalid, ctx)
    ctx = ctx or context(snap)
    quota = view.quota(snap, pod.namespace)
    ev = batch.evaluate(snap.nodes, view.columns(snap), names, pod, node_policy, card_policy, ctx, quota)
    out = FilterOutcome([], {}, {}, collections.Counter())
    if log.enabled(4):
        _log_evaluation(log, pod, ev)
    # Feasible nodes in bulk (the common case), then the failures one by one.
    idx = np.flatnonzero(ev.feasible)
    names_ = ev.names
    out.feasible = list(names_) if len(idx) == len(names_) else [names_[i] for i in idx.tolist()]
    out.scores = ev.scores[idx]
    if out.feasible:
        out.reasons[FEASIBLE] = len(out.feasible)
    for name, (st, _) in ev.failures.items():
        _reject(out, snap, name, st, invalid)
    return out


def _keep_choice(
    out: FilterOutcome,
    snap: view.Snapshot,
    pod: requests.PodRequest,
    policies: Policies,
    log: logs.Log,
    ctx: registry.Context,
    busy: Collection[str] = (),
) -> None:
    """Narrow ``out.feasible`` to the node the extender chooses (``batch.first_placed``).

    The vectorised filter decides feasibility without asking the card policy, so the winner is
    placed once here; a node whose cards the policy refuses gives way to the next. ``ctx`` is the
    filter's own context (``context(snap, pod, policies)``, built once per filter). Nodes in
    ``busy`` give way to free ones within the lock margin (``lock_aware``).
    """
    names = out.feasible
    scores = out.scores if out.scores is not None else score_nodes(snap, pod, names, policies, log)
    stepped = candidate_step(policies.node(pod, ctx), scores, ctx)
    keys = lock_aware(names, stepped, busy, policies)
    card_policy = policies.card(pod)
    quota = view.quota(snap, pod.namespace)
    won = batch.first_placed(snap.nodes, names, keys, pod, card_policy, ctx, quota)
    if won is not None:
        i = won[0]
        out.feasible, out.scores = [names[i]], scores[i : i + 1]
        out.lock_moved = keys is not stepped and i != next(batch.best_first(names, stepped))
        if out.lock_moved and log.enabled(3):
            log.v(3, "lock margin: chose a node with a free lock", pod=pod.name, node=names[i])


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
    names: Sequence[str], scores: np.ndarray, busy: Collection[str], policies: Policies
) -> np.ndarray:
    """What the choice goes by once the node locks count (``Policies.lock_margin``).

    ``scores`` are the candidates' internal scores after the candidate step (``UNFIT`` where the
    pod does not fit). Where the order is what counts (``extender``, ``rank``): keys that put the
    free nodes within the margin of the best first (``lockchoice.prefer_free``). Where the scores
    themselves go on the wire (``blend``): scores with the busy nodes within the margin lowered
    below the free ones (``lockchoice.demote_busy``). Margin 0, no busy node, or nothing to change:
    ``scores`` itself.
    """
    margin = policies.lock_margin
    if not margin > 0 or not busy or not len(names):
        return scores
    locked = locked_near(names, scores, busy, margin)
    if policies.ranks:
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
    out: FilterOutcome, snap: view.Snapshot, name: str, st: status.Status, invalid: Collection[str]
) -> None:
    """File a rejected node under the right map with its reason code."""
    if view.node_state(snap, name) is None:
        reason = view.node_problem(name, invalid)
        out.unresolvable[name] = reason
    else:
        reason = ",".join(st.reasons) or status.INVALID_REQUEST
        bucket = out.failed if st.code is status.Code.UNSCHEDULABLE else out.unresolvable
        bucket[name] = reason
    out.reasons[reason] += 1


def _filter_verbose(
    snap: view.Snapshot,
    pod: requests.PodRequest,
    names: Sequence[str],
    card_policy: registry.Policy,
    log: logs.Log,
    invalid: Collection[str],
    ctx: registry.Context | None = None,
) -> FilterOutcome:
    """The filter node by node with ``fit.place``, logging every node and card."""
    ctx = ctx or context(snap)
    quota = view.quota(snap, pod.namespace)
    out = FilterOutcome([], {}, {}, collections.Counter())
    for name in names:
        state = view.node_state(snap, name)
        if state is None:
            _reject(out, snap, name, status.SUCCESS, invalid)
            log.v(4, "filter node", pod=pod.name, node=name, feasible=False, reason=out.unresolvable[name])
            continue
        placement = fit.place(state, pod, card_policy, ctx, quota)
        if placement.status.ok:
            out.feasible.append(name)
            out.reasons[FEASIBLE] += 1
        else:
            _reject(out, snap, name, placement.status, invalid)
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


def score_nodes(
    snap: view.Snapshot,
    pod: requests.PodRequest,
    names: Sequence[str],
    policies: Policies,
    log: logs.Log,
) -> np.ndarray:
    """Internal 0..100 scores of ``names`` (int64, same order), ``UNFIT`` where the pod does not fit.

    Nodes the pod does not fit (unknown, removed, registered without cards, full) are ``UNFIT`` and
    GPU-less pods score 0, at every log level: ``-v 4`` logs the same scores, it does not compute
    others. The wire gives an unfit node 0 (``wire.extender_scores`` clips; ranks skip it).
    """
    if not pod.wants_gpu:
        return np.zeros(len(names), np.int64)
    ctx = context(snap, pod, policies)
    node_policy = policies.node(pod, ctx)
    card_policy = policies.card(pod)
    quota = view.quota(snap, pod.namespace)
    ev = batch.evaluate(snap.nodes, view.columns(snap), names, pod, node_policy, card_policy, ctx, quota)
    scores = ev.scores
    if log.enabled(4):
        for name, score, fits in zip(ev.names, scores.tolist(), ev.feasible.tolist(), strict=True):
            log.v(4, "score node", pod=pod.name, node=name, policy=node_policy.name, score=score, fits=fits)
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


def rescore(
    snap: view.Snapshot,
    pod: requests.PodRequest,
    names: Sequence[str],
    policies: Policies,
    log: logs.Log,
    filtered: Filtered,
) -> np.ndarray:
    """Scores from the filter's evaluation, recomputed only for nodes whose state changed since.

    Unchanged nodes keep the very same ``NodeState`` object across snapshots, so an identity check
    tells which scores are still exact. The common case (the same snapshot and the filter's own
    answer as candidates) returns the filter's array as is.
    """
    if not pod.wants_gpu:
        return np.zeros(len(names), np.int64)
    nodes_now = snap.nodes
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
        out[stale] = score_nodes(snap, pod, [names[i] for i in stale], policies, log)
    return out


def shape(snap: view.Snapshot, pod: requests.PodRequest, names: Sequence[str]) -> registry.Shape:
    """The pod's shape for the workload histogram (shares relative to the first known node's cards)."""
    card_memory = 0
    for name in names:
        state = view.node_state(snap, name)
        if state is not None and state.inventory.devices:
            card_memory = state.inventory.devices[0].memory_mib
            break
    return shares.shape_of(shares.demand(pod, card_memory))


def summary(outcome: FilterOutcome) -> str:
    """``3/5 nodes feasible, 2 InsufficientGPUMemory`` for events and logs."""
    total = sum(outcome.reasons.values())
    parts = [f"{len(outcome.feasible)}/{total} nodes feasible"]
    parts += [
        f"{n} {r}"
        for r, n in sorted(outcome.reasons.items(), key=lambda rn: (-rn[1], rn[0]))
        if r != FEASIBLE
    ]
    return ", ".join(parts)
