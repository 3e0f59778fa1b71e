"""The plugin API of placement policies: what a policy is given, what it answers, what it may offer.

Every policy is a ``Policy``: a name, two declared capabilities (``idle_only``: HAMi's ``mutex``
card filter; ``learns_workload``: it scores against the learned target workload) and two pure
methods, ``score_node`` (0..``MAX_SCORE``, higher is better, asked only of nodes the pod fits) and
``choose_cards`` (which of the eligible cards one container gets). A policy may also offer
optional abilities, each a protocol of its own, in the manner of kube-scheduler's one interface
per extension point (``staging/src/k8s.io/kube-scheduler/framework/interface.go``):

* ``BatchScorer``: ``score_columns``, the same scores for many rows of ``columns.NodeColumns``;
* ``Normalizer``: ``normalize``, a step over the scores of all candidate nodes (BestFit, Random);
* ``PodAwareCardChooser``: ``choose_cards_for_pod``, a card rule that sees the whole pod (FGD).

``Plugin.of`` checks these once, when a policy is built (as kube-scheduler's profile does with
``Implements`` per extension point), into a typed record; nothing probes a policy at call time.
``CardRule`` is a plugin bound to one pod: what ``fit.place`` asks for cards, with the filter it
declares carried along.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import msgspec
import numpy as np

from gpuslice.model import nodes, requests

if TYPE_CHECKING:
    from gpuslice.policy import columns

MAX_SCORE = 100
"""Internal scores are integers in 0..MAX_SCORE; the extender rescales to 0..10 at the wire."""


class Shape(msgspec.Struct, frozen=True):
    """A pod shape of the target workload (FGD): per-GPU share, GPU count, CPU and model set.

    Attributes:
        cpu_milli: CPU request.
        share_milli: per-GPU share in milli-GPU (1000 = a whole card; 0 for CPU-only shapes).
        count: number of GPUs.
        types: allowed models (empty = any).
    """

    cpu_milli: int
    share_milli: int
    count: int
    types: tuple[str, ...] = ()


class Workload(msgspec.Struct, frozen=True):
    """A target workload: shapes with their probabilities (summing to 1)."""

    shapes: tuple[Shape, ...]
    weights: tuple[float, ...]


NO_JOB_NODES: Mapping[str, nodes.JobOnNode] = types.MappingProxyType({})
"""``Context.job_nodes`` of a pod without a job, or whose job has no placed pod."""


@dataclasses.dataclass(frozen=True, slots=True)
class Context:
    """Inputs a policy may use besides the node and the pod. Nothing here is global.

    Attributes:
        workload: the target workload for fragmentation-aware policies (from the trace in the
            simulator, from recently seen requests in the extender); None = not available.
        rng: random source for the ``random`` policy; None = deterministic (first choice).
        capacity: the cluster's cards per model, sorted by model (``model_capacity``); fgd-lookahead
            weighs a model-constrained shape by the share of the cluster it can use. Empty = unknown
            (every shape counts as able to use every card).
        card_weights: the pod's card-score weights (``hami.io/device-scoring-weights``); the
            usage-ordered card policies (binpack, spread and chains of them) rank cards by HAMi's
            weighted card score when set. ``fit.place`` fills it in from the pod.
        now: the time the pod is judged at (Unix seconds), given by the caller (policies never
            read the clock); None = no clock (the simulator): telemetry never counts as stale.
        telemetry_max_age_s: telemetry older than this at ``now`` counts as absent
            (``thermal.fresh``; the vectorised scores apply the same rule to the rows of
            ``columns.NodeColumns`` by their ``telemetry_at`` column); None = no limit.
        job: the pod's job (``requests.PodRequest.job``; '' = none): ``balanced``'s task affinity.
        job_nodes: the nodes holding pods of ``job`` (node name -> the job's share there,
            ``nodes.JobOnNode``; the extender takes it from its cache snapshot's job index);
            empty when the job has no other placed pod.
        mig_rule: how instances are chosen on MIG cards (``policy.mig``): ``fragmentation``
            (fewest stranded slices) or ``first-fit`` (HAMi's rule).
    """

    workload: Workload | None = None
    rng: np.random.Generator | None = None
    card_weights: requests.ScoringWeights | None = None
    capacity: tuple[tuple[str, int], ...] = ()
    now: float | None = None
    telemetry_max_age_s: float | None = None
    job: str = ""
    job_nodes: Mapping[str, nodes.JobOnNode] = dataclasses.field(default_factory=lambda: NO_JOB_NODES)
    mig_rule: str = "fragmentation"


EMPTY_CONTEXT = Context()


def model_capacity(models: Iterable[str]) -> tuple[tuple[str, int], ...]:
    """``Context.capacity`` from the model of every card in the cluster (empty names skipped)."""
    counts: dict[str, int] = {}
    for m in models:
        if m:
            counts[m] = counts.get(m, 0) + 1
    return tuple(sorted(counts.items()))


class Scored(NamedTuple):
    """A node's score: integer 0..100 (ties go to the lower node name, or the lower rank in the simulator)."""

    score: int


class CardChooser(Protocol):
    """What ``fit.place`` asks for cards: a rule choosing one container's cards, and its filter."""

    @property
    def name(self) -> str:
        """The policy's name (for logs and explanations)."""
        ...

    @property
    def idle_only(self) -> bool:
        """Only cards no task uses are eligible (HAMi's ``mutex``; ``ExclusiveConflict`` otherwise)."""
        ...

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: Context,
    ) -> tuple[int, ...] | None:
        """Pick ``request.count`` cards among ``eligible`` (indices into the node's devices), or None."""
        ...


class Policy(CardChooser, Protocol):
    """A placement policy (module docstring): it scores nodes and chooses cards.

    ``idle_only`` and ``learns_workload`` are declared by every policy (class attributes), so no
    wrapper can drop them.
    """

    @property
    def learns_workload(self) -> bool:
        """It scores against ``Context.workload`` (FGD and kin).

        Callers that learn the workload online give it a fallback until the histogram is trusted.
        """
        ...

    def score_node(self, state: nodes.NodeState, pod: requests.PodRequest, ctx: Context) -> Scored:
        """Score a feasible node for the pod."""
        ...


@runtime_checkable
class BatchScorer(Protocol):
    """A node policy that scores many rows at once, identically to its ``score_node``.

    For a pod without cards (CPU-only) ``score_columns`` either scores exactly as well or raises
    ``ValueError``; the simulator's column pass relies on that to fall back to ``score_node``.
    """

    def score_columns(
        self, cols: columns.NodeColumns, rows: np.ndarray, pod: requests.PodRequest, ctx: Context
    ) -> np.ndarray:
        """Scores 0..100 (int64) of the given rows."""
        ...


@runtime_checkable
class Normalizer(Protocol):
    """A node policy defined relative to the candidates (BestFit's min-max, Random's single winner).

    The simulator applies it over the feasible nodes, the extender over the nodes of one request.
    """

    def normalize(self, scores: np.ndarray, ctx: Context) -> np.ndarray:
        """The candidates' scores after the policy's step."""
        ...


@runtime_checkable
class PodAwareCardChooser(Protocol):
    """A card rule that needs the whole pod (FGD weighs the host CPU the pod takes as well)."""

    def choose_cards_for_pod(
        self,
        state: nodes.NodeState,
        pod: requests.PodRequest,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: Context,
    ) -> tuple[int, ...] | None:
        """As ``choose_cards``, knowing the pod the container belongs to."""
        ...


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Plugin:
    """A built policy with its optional abilities resolved once (``of``); a ``Policy`` itself.

    Attributes:
        policy: the policy.
        batch: the policy as a ``BatchScorer`` when it is one, else None.
        normalizer: the policy as a ``Normalizer`` when it is one, else None.
        pod_aware: the policy as a ``PodAwareCardChooser`` when it is one, else None.
    """

    policy: Policy
    batch: BatchScorer | None
    normalizer: Normalizer | None
    pod_aware: PodAwareCardChooser | None

    @classmethod
    def of(cls, policy: Policy) -> Plugin:
        """Resolve the policy's optional abilities (the only place they are checked)."""
        if isinstance(policy, Plugin):
            return policy
        return cls(
            policy,
            policy if isinstance(policy, BatchScorer) else None,
            policy if isinstance(policy, Normalizer) else None,
            policy if isinstance(policy, PodAwareCardChooser) else None,
        )

    @property
    def name(self) -> str:
        """The registry name."""
        return self.policy.name

    @property
    def idle_only(self) -> bool:
        """The policy's card filter (HAMi's ``mutex``)."""
        return self.policy.idle_only

    @property
    def learns_workload(self) -> bool:
        """The policy scores against the learned workload."""
        return self.policy.learns_workload

    def score_node(self, state: nodes.NodeState, pod: requests.PodRequest, ctx: Context) -> Scored:
        """The policy's node score."""
        return self.policy.score_node(state, pod, ctx)

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: Context,
    ) -> tuple[int, ...] | None:
        """The policy's card rule for a container seen alone (``for_pod`` sees the whole pod)."""
        return self.policy.choose_cards(state, request, eligible, ctx)

    def normalize(self, scores: np.ndarray, ctx: Context) -> np.ndarray:
        """The candidate step when the policy has one, else ``scores`` as they are."""
        if self.normalizer is None:
            return scores
        return self.normalizer.normalize(scores, ctx)

    def for_pod(self, pod: requests.PodRequest) -> CardRule:
        """The card rule for the containers of ``pod``."""
        return CardRule(self, pod)


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class CardRule:
    """A plugin's card rule bound to one pod: the pod-aware rule when the policy has one.

    It carries the plugin's declared filter (``idle_only``), so binding a policy to a pod never
    loses HAMi's ``mutex``.
    """

    plugin: Plugin
    pod: requests.PodRequest

    @property
    def name(self) -> str:
        """The policy's name."""
        return self.plugin.name

    @property
    def idle_only(self) -> bool:
        """The policy's card filter."""
        return self.plugin.idle_only

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: Context,
    ) -> tuple[int, ...] | None:
        """The pod-aware card rule when the policy has one, else its plain rule."""
        aware = self.plugin.pod_aware
        if aware is not None:
            return aware.choose_cards_for_pod(state, self.pod, request, eligible, ctx)
        return self.plugin.policy.choose_cards(state, request, eligible, ctx)


PolicyFactory = Callable[[Mapping[str, float]], Policy]
"""Builds a policy from its numeric arguments (validated at construction time)."""


class UnknownPolicyError(ValueError):
    """A policy name that is not registered."""
