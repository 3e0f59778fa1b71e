"""Gangs in the FGD benchmark: a group of pods placed all together or not at all (``--gangs``).

A gang is a set of positions in the arrival sequence. Where the gangs come from:

* ``trace``: the pod list's ``job`` column. Pods of one job form a gang. The benchmark's arrival
  sequence may hold a pod more than once (inflation to ``--tune`` draws with replacement), so the
  c-th copy of each member joins the job's c-th gang: a gang is ``(job, c)``. Pods with an empty
  job arrive on their own. The public openb pod lists carry no job column, so this mode needs a
  pod list that adds one.
* ``generated``: consecutive GPU arrivals grouped into gangs, for a trace without jobs. Walking the
  arrival sequence in order, the next gang takes the next ``s`` pods that ask for a GPU, with ``s``
  drawn uniformly from the integers ``lo..hi`` (``--gang-sizes``, default 2-16) by a generator
  seeded with ``[seed, GANG_STREAM]`` (so the arrivals and the node ranks of the seed do not move);
  the last gang takes what is left, so it may be smaller. Pods without GPUs arrive on their own.
  Consecutive arrivals in the benchmark's shuffled order make mixed gangs (a gang of one shape
  would change the trace's demand mix, which the gangs-off run keeps).

When a gang is placed: at the arrival of its last member (the members before it wait; their GPU
demand counts as arrived when each arrives, as kube-scheduler's Coscheduling Permit waits for its
quorum). Then ``framework.gangs.place_all`` places every member, largest first, on a working copy
of the simulator's cluster with the ``Placer``'s profile (its node and card policies, the fallback
while an online workload is untrusted) and its target workload, each member judged by its own
cycle as the extender judges it. Either every member fits and all are committed to the cluster, or
``place_all`` answers ``Short``, nothing is committed and every member counts as failed. The
benchmark has no departures, so a rejected gang is not retried.

Pods arriving on their own are placed by ``engine.Placer`` exactly as with gangs off.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import msgspec
import numpy as np

from gpuslice.cache import shapes
from gpuslice.framework import gangs as framework_gangs
from gpuslice.model import allocations, nodes
from gpuslice.policy import api, shares
from gpuslice.policy import columns as policy_columns
from gpuslice.policy import quota as quotas
from gpuslice.sim import cluster, engine, trace

MODES = ("off", "trace", "generated")
"""``--gangs``: no gangs (the paper's protocol), the pod list's ``job`` column, or generated gangs."""
DEFAULT_SIZES = (2, 16)
"""Generated gang sizes: uniform on these integers, both included."""
GANG_STREAM = 7
"""Second word of the generated gangs' seed (``[seed, GANG_STREAM]``)."""
MAX_SIZE = 4096
"""Largest gang size ``--gang-sizes`` accepts."""


_NodeState = nodes.NodeState  # the view's ``nodes`` property shadows the module in its body
_JobOnNode = nodes.JobOnNode


class GangError(ValueError):
    """A gang setting or a trace that cannot make gangs."""


@dataclasses.dataclass(frozen=True)
class GangSpec:
    """Where a run's gangs come from (``MODES``, never ``off``), generated gangs' sizes, the planner."""

    mode: str
    sizes: tuple[int, int] = DEFAULT_SIZES
    planner: str = "place_all"

    def as_json(self) -> dict[str, object]:
        """The setting as the JSON record shows it."""
        out: dict[str, object] = {"mode": self.mode}
        if self.mode == "generated":
            out["sizes"] = list(self.sizes)
        out["planner"] = self.planner
        return out


def parse_sizes(text: str) -> tuple[int, int]:
    """``2-16`` (uniform on 2..16) or ``8`` (always 8) as ``(lo, hi)``.

    Raises:
        GangError: not one or two integers with ``1 <= lo <= hi <= MAX_SIZE``.
    """
    lo_text, sep, hi_text = text.strip().partition("-")
    try:
        lo = int(lo_text)
        hi = int(hi_text) if sep else lo
    except ValueError:
        raise GangError(f"bad gang sizes {text!r}: want LO-HI or N") from None
    if not 1 <= lo <= hi <= MAX_SIZE:
        raise GangError(f"bad gang sizes {text!r}: want 1 <= LO <= HI <= {MAX_SIZE}")
    return lo, hi


def generated(
    pods: Sequence[trace.TracePod], seq: np.ndarray, sizes: tuple[int, int], seed: int, first: int = 0
) -> list[list[int]]:
    """The generated gangs of the arrival sequence (module docstring): lists of positions in ``seq``.

    Positions before ``first`` (the replay's time-0 population, already running) are in no gang.
    """
    rng = np.random.default_rng([seed, GANG_STREAM])
    lo, hi = sizes
    out: list[list[int]] = []
    current: list[int] = []
    want = 0
    for k, i in enumerate(seq.tolist()):
        if k < first or pods[i].count <= 0:
            continue
        if not current:
            want = int(rng.integers(lo, hi + 1))
        current.append(k)
        if len(current) == want:
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def by_job(pods: Sequence[trace.TracePod], seq: np.ndarray) -> list[list[int]]:
    """The trace's gangs (module docstring): positions by ``(job, copy)``, in order of first arrival."""
    copies: dict[int, int] = {}
    found: dict[tuple[str, int], list[int]] = {}
    for k, i in enumerate(seq.tolist()):
        job = pods[i].job
        if not job:
            continue
        c = copies.get(i, 0)
        copies[i] = c + 1
        found.setdefault((job, c), []).append(k)
    return list(found.values())


def groups(spec: GangSpec, pods: Sequence[trace.TracePod], seq: np.ndarray, seed: int) -> list[list[int]]:
    """The run's gangs as lists of positions in ``seq``.

    Raises:
        GangError: an unknown mode, or ``trace`` on a pod list without jobs.
    """
    if spec.mode == "generated":
        return generated(pods, seq, spec.sizes, seed)
    if spec.mode == "trace":
        if not any(p.job for p in pods):
            raise GangError("--gangs trace: the pod list has no job column (or every job is empty)")
        return by_job(pods, seq)
    raise GangError(f"unknown gang mode {spec.mode!r}; known: {', '.join(MODES)}")


class ClusterView:
    """The simulator's cluster as the ``framework.view.Snapshot`` that ``place_all`` reads.

    Node states by name (the live ones; ``place_all`` never changes them), the placer's target
    workload and capacity; no jobs, no quotas (the trace has neither).
    """

    def __init__(self, live: cluster.Cluster, ctx: api.Context) -> None:
        """A view of ``live`` with ``ctx``'s workload and capacity."""
        self._live = live
        self._ctx = ctx
        self._nodes = {state.name: state for state in live.states}

    @property
    def generation(self) -> int:
        """The sum of the node versions (changes whenever a node does)."""
        return int(self._live.version.sum())

    @property
    def nodes(self) -> Mapping[str, _NodeState]:
        """Node name -> its state now."""
        return self._nodes

    @property
    def columns(self) -> policy_columns.NodeColumns:
        """The nodes as columns (``place_all`` judges node by node and does not read them)."""
        return engine.LiveColumns(self._live).current()

    @property
    def workload(self) -> api.Workload | None:
        """The placer's target workload (None while an online one is untrusted)."""
        return self._ctx.workload

    @property
    def capacity(self) -> tuple[tuple[str, int], ...]:
        """Cards per model."""
        return self._ctx.capacity

    @property
    def jobs(self) -> Mapping[str, Mapping[str, _JobOnNode]]:
        """No job index: trace pods have no job the policies read."""
        return {}

    def quota(self, namespace: str) -> quotas.QuotaView | None:
        """Unlimited."""
        return None


def largest_first(members: Sequence[trace.TracePod]) -> list[int]:
    """Member indices, larger first: cards, then GPU share (as ``framework.gangs`` orders a plan).

    A trace pod asks ``d / 10`` % of memory and cores per card, so ``framework.gangs._weight``'s
    order (cards, MiB, percent, cores) is (cards, n x d) here; ties keep arrival order.
    """
    return sorted(range(len(members)), key=lambda m: (-members[m].count, -members[m].gpu_milli))


PLANNERS = ("place_all", "trial")
"""How a gang is placed: ``framework.gangs.place_all`` on a view of the cluster (the extender's
code), or ``trial``: the ``engine.Placer`` places the members one by one in the same order (its
cached, vectorised scores) and takes them all off again when one does not fit. Both place each
member on its policy's best node as the members before it left the cluster; a unit test holds them
to the same placements. ``trial`` is much faster on a large cluster: ``place_all`` judges every node
node by node, for every member."""


class GangPlacer:
    """Places whole gangs on the cluster of an ``engine.Placer`` (``PLANNERS``)."""

    def __init__(self, placer: engine.Placer, planner: str = "place_all") -> None:
        """Place on ``placer``'s cluster with its profile and context, with ``planner``."""
        if planner not in PLANNERS:
            raise GangError(f"unknown gang planner {planner!r}; known: {', '.join(PLANNERS)}")
        self.placer = placer
        self.planner = planner
        self._index = {state.name: j for j, state in enumerate(placer.live.states)}

    def place(
        self, members: Sequence[trace.TracePod], observed: bool = False
    ) -> list[tuple[int, allocations.PodAllocation]] | framework_gangs.Short:
        """Every member on the cluster, (node index, allocation) in ``members`` order; or ``Short``.

        On ``Short`` the cluster is unchanged. Each member is observed by the online workload first,
        as a pod the extender's filter sees (``observed``: the caller did).
        """
        placer = self.placer
        if not observed:
            for pod in members:
                placer.observe(pod)
        if self.planner == "trial":
            return self._trial(members)
        live = placer.live
        order = largest_first(members)
        cand = [live.feasible(members[m]) for m in order]
        # A node a member cannot take now it cannot take after other members went on: judging only
        # the nodes some member fits now gives the same choices, in rank order.
        rows = np.unique(np.concatenate(cand)) if cand else np.zeros(0, np.int64)
        names = [live.states[j].name for j in rows.tolist()]
        snap = ClusterView(live, placer.ctx)
        got = framework_gangs.place_all(placer.profile, snap, [members[m].request for m in order], names)
        if isinstance(got, framework_gangs.Short):
            return got
        out: list[tuple[int, allocations.PodAllocation] | None] = [None] * len(members)
        for m, alloc in zip(order, got, strict=True):
            j = self._index[alloc.node]
            live.commit(j, alloc, shares.demand(members[m].request).tag)
            out[m] = (j, alloc)
        return [p for p in out if p is not None]

    def _trial(
        self, members: Sequence[trace.TracePod]
    ) -> list[tuple[int, allocations.PodAllocation]] | framework_gangs.Short:
        """``place`` by the placer itself, member by member, undone when one does not fit."""
        placer = self.placer
        order = largest_first(members)
        done: list[tuple[int, tuple[int, allocations.PodAllocation]]] = []
        for m in order:
            got = placer.place_observed(members[m])
            if got is None:
                for n, (j, alloc) in reversed(done):
                    placer.remove(j, members[n], alloc)
                return framework_gangs.Short(len(done), len(members), members[m].request, ())
            done.append((m, got))
        out = dict(done)
        return [out[m] for m in range(len(members))]


@dataclasses.dataclass
class GangStats:
    """What the gangs of one run did.

    Attributes:
        offered: gangs whose last member arrived.
        placed: gangs placed whole.
        rejected: gangs ``place_all`` found no room for (none of their members placed).
        members_offered: pods in the offered gangs.
        members_placed: pods in the placed gangs.
        demand_offered_milli: GPU demand (n x d) of the offered gangs.
        demand_placed_milli: GPU demand of the placed gangs.
        singles: pods that arrived on their own (no gang).
    """

    offered: int = 0
    placed: int = 0
    rejected: int = 0
    members_offered: int = 0
    members_placed: int = 0
    demand_offered_milli: int = 0
    demand_placed_milli: int = 0
    singles: int = 0

    def as_json(self) -> dict[str, object]:
        """The record's ``gangs`` figures (GPU demand in GPUs)."""
        return {
            "offered": self.offered,
            "placed": self.placed,
            "rejected": self.rejected,
            "members_offered": self.members_offered,
            "members_placed": self.members_placed,
            "gpu_demand_offered": self.demand_offered_milli / 1000,
            "gpu_demand_placed": self.demand_placed_milli / 1000,
            "single_pods": self.singles,
        }


@dataclasses.dataclass
class GangOutcome:
    """A gang run: the engine's figures, the gangs' figures and where each arrival went.

    Attributes:
        outcome: as ``engine.run`` reports it (``failed`` in arrival order).
        stats: the gangs' figures.
        gangs: the gangs, as positions in the arrival sequence.
        placements: arrival position -> (node index, allocation), for every placed pod.
        live: the cluster at the end.
    """

    outcome: engine.Outcome
    stats: GangStats
    gangs: list[list[int]]
    placements: dict[int, tuple[int, allocations.PodAllocation]]
    live: cluster.Cluster


def rank_named(inventories: Sequence[nodes.NodeInventory]) -> list[nodes.NodeInventory]:
    """The nodes (in rank order) renamed ``r000000-NAME``, ``r000001-NAME``, ...: names in rank order.

    Among nodes of equal score ``place_all`` (``policy.batch.best_first``, the extender's order)
    takes the lowest name and the ``engine.Placer`` the lowest rank; these names make them agree.
    Card UUIDs keep the original name.
    """
    width = max(6, len(str(len(inventories))))
    return [
        msgspec.structs.replace(inv, name=f"r{j:0{width}d}-{inv.name}") for j, inv in enumerate(inventories)
    ]


def run(
    inventories: Sequence[nodes.NodeInventory],
    pods: Sequence[trace.TracePod],
    seq: np.ndarray,
    gangs: Sequence[Sequence[int]],
    policy: api.Policy,
    ctx: api.Context,
    histogram: shapes.ShapeHistogram | None = None,
    planner: str = "place_all",
) -> GangOutcome:
    """``engine.run`` with gangs: each gang placed whole at its last member's arrival, or not at all.

    The nodes are renamed in rank order (``rank_named``) so ``place_all``'s tie-break (the lower
    node name) is the simulator's (the lower rank).
    """
    placer = engine.Placer(cluster.Cluster(rank_named(inventories)), policy, ctx, histogram)
    gang_placer = GangPlacer(placer, planner)
    gang_of: dict[int, int] = {}
    last: dict[int, int] = {}
    for n, gang in enumerate(gangs):
        for q in gang:
            if q in gang_of:
                raise GangError(f"arrival {q} is in two gangs")
            gang_of[q] = n
        if gang:
            last[n] = max(gang)
    arrived = np.zeros(len(seq), np.int64)
    used = np.zeros(len(seq), np.int64)
    failed: list[int] = []
    placements: dict[int, tuple[int, allocations.PodAllocation]] = {}
    stats = GangStats()
    total_arrived = total_used = 0
    order = seq.tolist()
    for k, i in enumerate(order):
        pod = pods[i]
        total_arrived += pod.gpu_milli
        g = gang_of.get(k)
        if g is None:
            stats.singles += 1
            got = placer.place(pod)
            if got is None:
                failed.append(k)
            else:
                placements[k] = got
                total_used += pod.gpu_milli
        elif last[g] == k:
            positions = list(gangs[g])
            members = [pods[order[q]] for q in positions]
            demand = sum(p.gpu_milli for p in members)
            stats.offered += 1
            stats.members_offered += len(members)
            stats.demand_offered_milli += demand
            result = gang_placer.place(members)
            if isinstance(result, framework_gangs.Short):
                stats.rejected += 1
                failed.extend(positions)
            else:
                stats.placed += 1
                stats.members_placed += len(members)
                stats.demand_placed_milli += demand
                total_used += demand
                placements.update(zip(positions, result, strict=True))
        arrived[k] = total_arrived
        used[k] = total_used
    failed.sort()
    outcome = engine.Outcome(
        arrived,
        used,
        failed,
        placer.live.capacity_milli,
        placer.score_calls,
        0 if histogram is None else histogram.snapshots,
        placer.fallback_pods,
    )
    return GangOutcome(outcome, stats, [list(g) for g in gangs], placements, placer.live)
