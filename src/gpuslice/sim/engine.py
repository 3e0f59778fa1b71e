"""The scheduling loop of the FGD benchmark (fgd-experiment.md section 4) around registered policies.

For each pod: pre-filter all nodes at once, score the feasible ones with the policy, apply its batch
step, take the best score (then the lowest rank), and let ``fit.place``
choose the cards with the policy's card rule.

Scores are pure functions of a node's state, the pod's shape and the policy context, so ``Scorer``
caches them per (cpu, d, n, types) and rescores only the nodes whose version changed since that shape
was last scored there; a new target workload in the context (``Scorer.set_context``) drops them all.
Host memory enters the pre-filter only: no simulated policy scores by it.

The target workload of the FGD-style policies comes either from the whole trace (the paper's
oracle, the default: ``ctx.workload`` is fixed for the run) or, with a ``ShapeHistogram`` given to
``Placer`` / ``run`` ("online"), the way ``gpuslice serve`` builds it: a decayed histogram that
starts empty and observes each arriving GPU pod's shape (``shares.shape_of(shares.demand(pod,
first card memory))``) before the pod is scored. The extender sees a pod only when kube-scheduler's
own filters (host CPU and memory) leave it a node, so a pod that no node can host is not observed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from gpuslice.cache import shapes
from gpuslice.model import allocations, nodes
from gpuslice.policy import fit, registry, shares
from gpuslice.sim import cluster, trace

ShapeKey = tuple[int, int, int, tuple[str, ...]]


class PlacementMismatchError(RuntimeError):
    """The pre-filter admitted a node that ``fit.place`` rejected (a bug, never expected)."""


@dataclasses.dataclass
class _Entry:
    score: np.ndarray
    seen: np.ndarray


class Scorer:
    """Cached node scores of one policy over one cluster."""

    def __init__(self, policy: registry.Policy, ctx: registry.Context, live: cluster.Cluster) -> None:
        self.policy = policy
        self.ctx = ctx
        self.live = live
        self._cache: dict[ShapeKey, _Entry] = {}
        self.calls = 0

    def set_context(self, ctx: registry.Context) -> None:
        """Score with ``ctx`` from now on; a different target workload invalidates every cached score."""
        if ctx.workload is not self.ctx.workload and ctx.workload != self.ctx.workload:
            self._cache.clear()
        self.ctx = ctx

    def best(self, pod: trace.TracePod, cand: np.ndarray) -> int:
        """The chosen node among the feasible ``cand`` (ascending rank)."""
        key = (pod.cpu_milli, pod.share, pod.count, pod.types)
        entry = self._cache.get(key)
        n = len(self.live)
        if entry is None:
            entry = _Entry(np.zeros(n, np.int64), np.full(n, -1, np.int64))
            self._cache[key] = entry
        version = self.live.version
        stale = cand[entry.seen[cand] != version[cand]]
        if len(stale):
            states = self.live.states
            score_node = self.policy.score_node
            req = pod.request
            ctx = self.ctx
            for j in stale.tolist():
                entry.score[j] = score_node(states[j], req, ctx).score
            entry.seen[stale] = version[stale]
            self.calls += len(stale)
        scores = shares.normalize(self.policy, entry.score[cand], self.ctx)
        return int(cand[int(np.argmax(scores))])  # the first maximum: the lowest rank


class Placer:
    """Places pods one at a time on a live cluster with one policy (shared by the benchmark and replay).

    Args:
        live: the cluster.
        policy: node and card policy.
        ctx: the policy context; its workload is the fixed (oracle) target workload.
        histogram: when given, the online target workload (see the module docstring): each GPU pod's
            shape is observed before the pod is scored and replaces ``ctx.workload``.
    """

    def __init__(
        self,
        live: cluster.Cluster,
        policy: registry.Policy,
        ctx: registry.Context,
        histogram: shapes.ShapeHistogram | None = None,
    ) -> None:
        self.live = live
        self.policy = policy
        self.ctx = ctx
        self.histogram = histogram
        self.scorer = Scorer(policy, ctx, live)

    def observe(self, pod: trace.TracePod) -> None:
        """Hand the pod's shape to the online histogram, as the extender's filter does (no-op if oracle)."""
        if self.histogram is None or pod.count <= 0:
            return
        live = self.live
        host = np.flatnonzero((live.cpu_free >= pod.cpu_milli) & (live.mem_free >= pod.memory_mib))
        if not len(host):
            return  # kube-scheduler's own filters leave no node: the extender is not asked
        card_memory = shares.card_memory(live.states[int(host[0])])
        self.histogram.observe(shares.shape_of(shares.demand(pod.request, card_memory)))
        self.ctx = dataclasses.replace(self.ctx, workload=self.histogram.workload())
        self.scorer.set_context(self.ctx)

    def place(self, pod: trace.TracePod) -> tuple[int, allocations.PodAllocation] | None:
        """Put the pod on the best feasible node; (node index, allocation), or None if none fits."""
        self.observe(pod)
        cand = self.live.feasible(pod)
        if not len(cand):
            return None
        j = self.scorer.best(pod, cand)
        state = self.live.states[j]
        placed = fit.place(state, pod.request, shares.PodBound(self.policy, pod.request), self.ctx)
        if placed.allocation is None:
            raise PlacementMismatchError(f"pod {pod.name} on {state.name}: {placed.status.reasons}")
        self.live.commit(j, placed.allocation, shares.demand(pod.request).tag)
        return j, placed.allocation

    def remove(self, j: int, pod: trace.TracePod, alloc: allocations.PodAllocation) -> None:
        """Take a placed pod off node j."""
        self.live.commit(j, alloc, shares.demand(pod.request).tag, -1)


@dataclasses.dataclass
class Outcome:
    """What one run produced.

    Attributes:
        arrived: cumulative arrived GPU demand (milli) after each pod.
        used: allocated milli-GPU after each pod.
        failed: positions in the arrival sequence of the pods that did not fit.
        capacity_milli: cluster GPU capacity.
        score_calls: how many times the policy scored a node.
    """

    arrived: np.ndarray
    used: np.ndarray
    failed: list[int]
    capacity_milli: int
    score_calls: int


def run(
    inventories: Sequence[nodes.NodeInventory],
    pods: Sequence[trace.TracePod],
    seq: np.ndarray,
    policy: registry.Policy,
    ctx: registry.Context,
    histogram: shapes.ShapeHistogram | None = None,
) -> Outcome:
    """Place ``pods[seq[0]], pods[seq[1]], ...`` once each on the nodes (given in rank order).

    With ``histogram``, the target workload is built online from the arriving pods (``Placer``).
    """
    placer = Placer(cluster.Cluster(inventories), policy, ctx, histogram)
    arrived = np.zeros(len(seq), np.int64)
    used = np.zeros(len(seq), np.int64)
    failed: list[int] = []
    total_arrived = 0
    total_used = 0
    for k, i in enumerate(seq.tolist()):
        pod = pods[i]
        total_arrived += pod.gpu_milli
        if placer.place(pod) is None:
            failed.append(k)
        else:
            total_used += pod.gpu_milli
        arrived[k] = total_arrived
        used[k] = total_used
    return Outcome(arrived, used, failed, placer.live.capacity_milli, placer.scorer.calls)
