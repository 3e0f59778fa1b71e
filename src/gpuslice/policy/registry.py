"""One registry of placement policies, at node level and at card level.

A policy is an object with two pure methods:

* ``score_node(state, pod, ctx) -> Scored``: how good the node is for the pod, an integer
  0..``MAX_SCORE`` (higher is better) plus an optional secondary key for ties. Called only on
  nodes that passed the filter.
* ``choose_cards(state, request, eligible, ctx) -> tuple[int, ...] | None``: which of the
  eligible cards (indices into ``state.inventory.devices``) one container gets; exactly
  ``request.count`` of them, or None when the policy refuses every choice.

The node policy and the card policy are chosen separately (config defaults, per-pod override by
``hami.io/node-scheduler-policy`` / ``hami.io/gpu-scheduler-policy``), so any registered policy can
serve at either level. Unknown names fail when the registry is asked, i.e. at startup.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple, Protocol

import msgspec
import numpy as np

from gpuslice.model import nodes, requests

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
    """

    workload: Workload | None = None
    rng: np.random.Generator | None = None
    card_weights: requests.ScoringWeights | None = None
    capacity: tuple[tuple[str, int], ...] = ()
    now: float | None = None
    telemetry_max_age_s: float | None = None
    job: str = ""
    job_nodes: Mapping[str, nodes.JobOnNode] = dataclasses.field(default_factory=lambda: NO_JOB_NODES)


EMPTY_CONTEXT = Context()


def model_capacity(models: Iterable[str]) -> tuple[tuple[str, int], ...]:
    """``Context.capacity`` from the model of every card in the cluster (empty names skipped)."""
    counts: dict[str, int] = {}
    for m in models:
        if m:
            counts[m] = counts.get(m, 0) + 1
    return tuple(sorted(counts.items()))


class Filtered:
    """Base of card policies that also restrict which cards are eligible (HAMi's filters).

    Attributes:
        idle_only: only cards no task uses are eligible (HAMi's ``mutex``); a card in use is
            rejected with ``ExclusiveConflict`` (HAMi's ``ExclusiveDeviceAllocateConflict``).
    """

    idle_only: bool = False


class Learned:
    """Base of node policies that score against ``Context.workload`` (FGD and its kin).

    Callers that learn the workload online (the extender's cache, the simulator's online mode) give
    such a policy no workload until the histogram is trusted, and score with a fallback policy
    meanwhile (``learns_workload``).
    """


def learns_workload(policy: Policy) -> bool:
    """True when the policy scores against the target workload (``Learned``)."""
    return isinstance(policy, Learned)


def acting(policy: Policy, fallback: Policy | None, workload: Workload | None) -> Policy:
    """The policy that decides under ``workload``: ``fallback`` while a learning one's is untrusted.

    A policy that learns the workload (``learns_workload``) gives way to ``fallback`` while the
    workload is untrusted (None); any other policy, or no fallback (``workload_fallback: pod``:
    the learning policy scores with no workload), keeps ``policy``.
    """
    if workload is None and fallback is not None and learns_workload(policy):
        return fallback
    return policy


def idle_only(policy: Policy) -> bool:
    """True when the card policy admits only idle cards."""
    return isinstance(policy, Filtered) and policy.idle_only


class Scored(NamedTuple):
    """A node's score: integer 0..100 (ties go to the lower node name, or the lower rank in the simulator)."""

    score: int


class Policy(Protocol):
    """A placement policy (see the module docstring)."""

    @property
    def name(self) -> str:
        """The registry name."""
        ...

    def score_node(self, state: nodes.NodeState, pod: requests.PodRequest, ctx: Context) -> Scored:
        """Score a feasible node for the pod."""
        ...

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: Context,
    ) -> tuple[int, ...] | None:
        """Pick ``request.count`` cards among ``eligible`` for one container."""
        ...


PolicyFactory = Callable[[Mapping[str, float]], Policy]
"""Builds a policy from its numeric arguments (validated at construction time)."""

_FACTORIES: dict[str, PolicyFactory] = {}


class UnknownPolicyError(ValueError):
    """A policy name that is not registered."""


def register(name: str, factory: PolicyFactory) -> None:
    """Register a policy factory under a name (each module registers its policies on import)."""
    if name in _FACTORIES:
        raise ValueError(f"policy {name!r} registered twice")
    _FACTORIES[name] = factory


def names() -> tuple[str, ...]:
    """All registered policy names, sorted."""
    _load_builtin()
    return tuple(sorted(_FACTORIES))


def get(name: str, args: Mapping[str, float] | None = None) -> Policy:
    """Build the policy registered under ``name``; raises ``UnknownPolicyError`` if none is."""
    _load_builtin()
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise UnknownPolicyError(
            f"scoring policy {name!r} is not supported; known: {', '.join(names())}"
        ) from None
    return factory(args or {})


def _load_builtin() -> None:
    """Import the modules that register the built-in policies (idempotent)."""
    from gpuslice.policy import builtin  # noqa: F401  (imported for its registrations)
