"""The scheduling loop of the FGD benchmark (fgd-experiment.md section 4) around registered policies.

For each pod: pre-filter all nodes at once, score the feasible ones with the policy, apply its batch
step, take the best score (then the lowest rank), and let ``fit.place``
choose the cards with the policy's card rule.

Scores are pure functions of a node's state, the pod's shape and the policy context, so ``Scorer``
caches them per (cpu, d, n, types) and rescores only the nodes whose version changed since that shape
was last scored there; a new target workload in the context (``Scorer.set_context``) drops them all.
When many nodes are stale (a shape not seen for a while, a new workload) and the policy scores
columns (``api.BatchScorer``, identical to ``score_node`` by contract, as the extender's filter
relies on), they are scored in one numpy pass over a ``columns.NodeColumns`` mirror of the cluster
(``LiveColumns``) instead of node by node.
Host memory enters the pre-filter only: no simulated policy scores by it.

The target workload of the FGD-style policies comes either from the whole trace (the paper's
oracle, the default: ``ctx.workload`` is fixed for the run) or, with a ``ShapeHistogram`` given to
``Placer`` / ``run`` ("online"), the way ``gpuslice serve`` builds it: a decayed histogram that
starts empty and observes each arriving GPU pod's shape (``shares.shape_of(shares.demand(pod,
first card memory))``) before the pod is scored. The extender sees a pod only when kube-scheduler's
own filters (host CPU and memory) leave it a node, so a pod that no node can host is not observed.
The policies get the histogram's snapshot (``ShapeHistogram.workload``), which changes only when the
live weights drift far enough, so cached scores survive between snapshots. While the histogram is
untrusted (fewer than ``min_count`` requests), a policy that learns the workload
(``api.Policy.learns_workload``) is replaced, for node scores and card choice, by the settings'
``fallback`` policy, as the extender's ``profile.Profile`` does (``pod``: kept, with no workload).
The cards come from the pod's ``cycle.Cycle``, as in the extender.

With a ``lockwindow.LockModel`` the pods arrive in bursts on a clock and each GPU placement holds
its node's HAMi lock for a window; the choice then goes through the extender's lock-aware rule
(``policy.lockchoice``) with the model's margin (margin 0: the same placements).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from gpuslice.cache import shapes
from gpuslice.framework import cycle as cycles
from gpuslice.framework import profile as profiles
from gpuslice.framework import registry
from gpuslice.model import allocations, nodes
from gpuslice.model import config as model_config
from gpuslice.policy import api, columns, shares, vectorfit
from gpuslice.sim import cluster, lockwindow, trace

ShapeKey = tuple[int, int, int, tuple[str, ...]]

VECTOR_MIN = 48
"""Stale nodes from which a column-scoring policy scores them in one pass (below: node by node)."""
ADAPTIVE = True
"""Take the column pass only while it has cost less per node than node-by-node scoring (both give
the same scores; tests turn this off to exercise the column pass whatever it costs)."""
PROBE_EVERY = 256
"""While node by node is cheaper, one eligible rescoring in this many still takes the column pass,
so the cost estimate follows the cluster (node-by-node is re-measured whenever it runs)."""


_NO_STATES: dict[str, nodes.NodeState] = {}
"""The nodes a placement cycle reads by name: none (the simulator hands it the node to place on)."""


class PlacementMismatchError(RuntimeError):
    """The pre-filter admitted a node that ``fit.place`` rejected (a bug, never expected)."""


@dataclasses.dataclass
class _Entry:
    score: np.ndarray
    seen: np.ndarray


class LiveColumns:
    """A ``columns.NodeColumns`` mirror of a live cluster, built on first use, then kept current.

    Only the nodes whose version changed since the last ``current()`` are rewritten.
    """

    def __init__(self, live: cluster.Cluster) -> None:
        self.live = live
        self._builder: columns.ColumnsBuilder | None = None
        self._seen = np.full(len(live), -1, np.int64)
        self._frozen: columns.NodeColumns | None = None
        self._rows: np.ndarray | None = None

    @property
    def usable(self) -> bool:
        """True when the vectorised kernels take nodes this wide (``vectorfit.MAX_CARDS``)."""
        return bool(self.live.free.shape[1] <= vectorfit.MAX_CARDS)

    @property
    def rows(self) -> np.ndarray:
        """The row of each node (by rank)."""
        if self._rows is None:
            self._rows = self.current().rows([state.inventory.name for state in self.live.states])
        return self._rows

    def current(self) -> columns.NodeColumns:
        """The columns of the cluster as it is now."""
        if self._builder is None:
            self._builder = columns.ColumnsBuilder(rows=max(1, len(self.live)), cards=self.live.free.shape[1])
        changed = np.flatnonzero(self._seen != self.live.version)
        if len(changed) or self._frozen is None:
            states = self.live.states
            for j in changed.tolist():
                self._builder.set(states[j])
            self._seen[changed] = self.live.version[changed]
            self._frozen = self._builder.freeze()
        return self._frozen


def _ema(old: float, new: float) -> float:
    """A moving average that starts at the first value."""
    return new if not old else 0.8 * old + 0.2 * new


class Scorer:
    """Cached node scores of one policy over one cluster.

    Args:
        policy: the node policy.
        ctx: its context.
        live: the cluster.
        mirror: the cluster's column mirror (shared by the scorers of one ``Placer``); None: built
            on first use.
    """

    def __init__(
        self,
        policy: api.Policy,
        ctx: api.Context,
        live: cluster.Cluster,
        mirror: LiveColumns | None = None,
    ) -> None:
        plugin = api.Plugin.of(policy)
        self.policy = plugin
        self.ctx = ctx
        self.live = live
        self._cache: dict[ShapeKey, _Entry] = {}
        self._mirror = mirror
        self._score_columns = None if plugin.batch is None else plugin.batch.score_columns
        self._cpu_columns = True  # until the column scorer refuses a CPU-only pod
        self._node_cost = 0.0  # seconds per node, node by node (moving average; 0: not measured)
        self._col_cost = 0.0  # seconds per node, column pass with the mirror's upkeep (likewise)
        self._probes = 0
        self.calls = 0

    def set_context(self, ctx: api.Context) -> None:
        """Score with ``ctx`` from now on; a different target workload invalidates every cached score."""
        if ctx.workload is not self.ctx.workload and ctx.workload != self.ctx.workload:
            self._cache.clear()
        self.ctx = ctx

    def best(self, pod: trace.TracePod, cand: np.ndarray) -> int:
        """The chosen node among the feasible ``cand`` (ascending rank)."""
        return int(cand[int(np.argmax(self.stepped(pod, cand)))])  # the first maximum: the lowest rank

    def stepped(self, pod: trace.TracePod, cand: np.ndarray) -> np.ndarray:
        """The scores of the feasible ``cand`` (ascending rank), after the policy's candidate step."""
        key = (pod.cpu_milli, pod.share, pod.count, pod.types)
        entry = self._cache.get(key)
        n = len(self.live)
        if entry is None:
            entry = _Entry(np.zeros(n, np.int64), np.full(n, -1, np.int64))
            self._cache[key] = entry
        version = self.live.version
        stale = cand[entry.seen[cand] != version[cand]]
        if len(stale):
            req = pod.request
            ctx = self.ctx
            if len(stale) < VECTOR_MIN or not self._prefer_columns() or not self._columns(stale, pod, entry):
                start = time.perf_counter()
                states = self.live.states
                score_node = self.policy.score_node
                for j in stale.tolist():
                    entry.score[j] = score_node(states[j], req, ctx).score
                self._node_cost = _ema(self._node_cost, (time.perf_counter() - start) / len(stale))
            entry.seen[stale] = version[stale]
            self.calls += len(stale)
        stepped: np.ndarray = self.policy.normalize(entry.score[cand], self.ctx)
        return stepped

    @property
    def mirror(self) -> LiveColumns:
        """The column mirror (built on first use)."""
        if self._mirror is None:
            self._mirror = LiveColumns(self.live)
        return self._mirror

    def _columns(self, stale: np.ndarray, pod: trace.TracePod, entry: _Entry) -> bool:
        """Score the ``stale`` nodes in one column pass when the policy can; False when it cannot.

        A GPU pod qualifies as in ``batch.evaluate`` (``vectorfit.request_of``). A CPU-only pod (which
        the extender never scores) is tried too: a policy whose column scorer refuses it raises
        ``ValueError`` and is asked no more; the column scorers that accept one score it exactly
        (``tests/unit/sim/test_online_workload.py`` checks every registered policy).
        """
        score_columns = self._score_columns
        if score_columns is None or not self.mirror.usable or self.mirror.current().has_mig:
            return False
        if pod.count <= 0:
            if not self._cpu_columns:
                return False
        elif vectorfit.request_of(pod.request, None) is None:
            return False
        mirror = self.mirror
        start = time.perf_counter()
        try:
            entry.score[stale] = score_columns(mirror.current(), mirror.rows[stale], pod.request, self.ctx)
        except ValueError:
            if pod.count > 0:
                raise
            self._cpu_columns = False
            return False
        self._col_cost = _ema(self._col_cost, (time.perf_counter() - start) / len(stale))
        return True

    def _prefer_columns(self) -> bool:
        """Whether the column pass is worth taking now (``ADAPTIVE``); it is measured first."""
        if not ADAPTIVE or not self._col_cost or not self._node_cost or self._col_cost < self._node_cost:
            return True
        self._probes += 1
        return self._probes % PROBE_EVERY == 0


class Placer:
    """Places pods one at a time on a live cluster with one policy (shared by the benchmark and replay).

    Args:
        live: the cluster.
        policy: node and card policy.
        ctx: the policy context; its workload is the fixed (oracle) target workload.
        histogram: when given, the online target workload (see the module docstring): each GPU pod's
            shape is observed before the pod is scored, ``ctx.workload`` is the histogram's
            snapshot, and its settings' ``fallback`` stands in for a learning policy until it is
            trusted.
        locks: when given, HAMi's node lock (``lockwindow``): a GPU pod goes where the lock-aware
            rule puts it at the clock ``locks.now`` (``NodeLocks.arrive``) and takes its node's lock.
    """

    def __init__(
        self,
        live: cluster.Cluster,
        policy: api.Policy,
        ctx: api.Context,
        histogram: shapes.ShapeHistogram | None = None,
        locks: lockwindow.NodeLocks | None = None,
    ) -> None:
        self.live = live
        self.locks = locks
        self.policy = api.Plugin.of(policy)
        self.ctx = ctx
        self.histogram = histogram
        self.fallback: api.Plugin | None = None
        self.fallback_pods = 0
        """GPU pods placed by the fallback policy (online, while the histogram was untrusted)."""
        if histogram is not None:
            self.ctx = ctx = dataclasses.replace(ctx, workload=histogram.workload())
            name = histogram.settings.fallback
            if self.policy.learns_workload and name != model_config.WORKLOAD_FALLBACK_POD:
                self.fallback = registry.get(name)
        scoring = [p for p in (self.policy, self.fallback) if p is not None]
        mirror = LiveColumns(live) if any(p.batch is not None for p in scoring) else None
        self.profile = profiles.Profile.of_plugins(self.policy, self.fallback)
        self.scorer = Scorer(self.policy, ctx, live, mirror)
        self._fallback_scorer = None if self.fallback is None else Scorer(self.fallback, ctx, live, mirror)

    def observe(self, pod: trace.TracePod) -> None:
        """Hand the pod's shape to the online histogram, as the extender does (no-op if oracle).

        A GPU pod is observed as the extender's filter observes it; a pod without GPUs as the
        extender's pod feed does, when it first sees the pod pending (before any filter).
        """
        histogram = self.histogram
        if histogram is None:
            return
        if pod.count <= 0:
            self._take(histogram, api.Shape(cpu_milli=pod.cpu_milli, share_milli=0, count=0))
            return
        live = self.live
        host = np.flatnonzero((live.cpu_free >= pod.cpu_milli) & (live.mem_free >= pod.memory_mib))
        if not len(host):
            return  # kube-scheduler's own filters leave no node: the extender is not asked
        card_memory = shares.card_memory(live.states[int(host[0])])
        self._take(histogram, shares.shape_of(shares.demand(pod.request, card_memory)))

    def _take(self, histogram: shapes.ShapeHistogram, shape: api.Shape) -> None:
        """Observe one shape; a new snapshot becomes the context's workload."""
        histogram.observe(shape)
        workload = histogram.workload()
        if workload is not self.ctx.workload:  # a new snapshot (the same object otherwise)
            self.ctx = dataclasses.replace(self.ctx, workload=workload)
            self.scorer.set_context(self.ctx)

    @property
    def score_calls(self) -> int:
        """Nodes scored so far, by the policy and by its fallback."""
        fb = self._fallback_scorer
        return self.scorer.calls + (0 if fb is None else fb.calls)

    def current(self) -> tuple[api.Plugin, Scorer]:
        """The policy placing the next pod and its scorer: the fallback while the workload is untrusted."""
        if self._fallback_scorer is not None and self.ctx.workload is None:
            return self._fallback_scorer.policy, self._fallback_scorer
        return self.policy, self.scorer

    def place(self, pod: trace.TracePod) -> tuple[int, allocations.PodAllocation] | None:
        """Put the pod on the best feasible node; (node index, allocation), or None if none fits."""
        self.observe(pod)
        return self.place_observed(pod)

    def place_observed(self, pod: trace.TracePod) -> tuple[int, allocations.PodAllocation] | None:
        """``place`` for a pod the online workload has observed already (a gang's member)."""
        cand = self.live.feasible(pod)
        if not len(cand):
            return None
        policy, scorer = self.current()
        if scorer is not self.scorer:
            self.fallback_pods += 1
        locks = self.locks if pod.count > 0 else None  # a pod without GPUs takes no node lock
        moved = False
        if locks is None:
            j = scorer.best(pod, cand)
        else:
            k, moved = locks.choose(scorer.stepped(pod, cand), cand)
            j = int(cand[k])
        state = self.live.states[j]
        placed = cycles.Cycle.detached(self.profile, pod.request, self.ctx, _NO_STATES).place(state)
        if placed.allocation is None:
            raise PlacementMismatchError(f"pod {pod.name} on {state.name}: {placed.status.reasons}")
        self.live.commit(j, placed.allocation, shares.demand(pod.request).tag)
        if locks is not None:
            locks.take(j, moved)
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
        score_calls: how many times the policy (or its fallback) scored a node.
        snapshots: target-workload snapshots taken (online; 0 for the oracle).
        fallback_pods: pods placed by the fallback policy (online, histogram untrusted).
        locks: what the node locks did (``lockwindow.Stats``), when the run modelled them.
    """

    arrived: np.ndarray
    used: np.ndarray
    failed: list[int]
    capacity_milli: int
    score_calls: int
    snapshots: int = 0
    fallback_pods: int = 0
    locks: lockwindow.Stats | None = None


def run(
    inventories: Sequence[nodes.NodeInventory],
    pods: Sequence[trace.TracePod],
    seq: np.ndarray,
    policy: api.Policy,
    ctx: api.Context,
    histogram: shapes.ShapeHistogram | None = None,
    lock: lockwindow.LockModel | None = None,
) -> Outcome:
    """Place ``pods[seq[0]], pods[seq[1]], ...`` once each on the nodes (given in rank order).

    With ``histogram``, the target workload is built online from the arriving pods (``Placer``).
    With ``lock``, the pods arrive in bursts and every placement locks its node for a window; the
    choice is lock-aware with the model's margin (``lockwindow``).
    """
    locks = None if lock is None else lockwindow.NodeLocks(len(inventories), lock)
    placer = Placer(cluster.Cluster(inventories), policy, ctx, histogram, locks)
    arrived = np.zeros(len(seq), np.int64)
    used = np.zeros(len(seq), np.int64)
    failed: list[int] = []
    total_arrived = 0
    total_used = 0
    for k, i in enumerate(seq.tolist()):
        pod = pods[i]
        total_arrived += pod.gpu_milli
        if locks is not None:
            locks.arrive(k)
        if placer.place(pod) is None:
            failed.append(k)
        else:
            total_used += pod.gpu_milli
        arrived[k] = total_arrived
        used[k] = total_used
    snapshots = 0 if histogram is None else histogram.snapshots
    if locks is not None:
        locks.finish()
    return Outcome(
        arrived,
        used,
        failed,
        placer.live.capacity_milli,
        placer.score_calls,
        snapshots,
        placer.fallback_pods,
        None if locks is None else locks.stats,
    )
