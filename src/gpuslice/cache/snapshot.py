"""The immutable view of the cluster that one filter/score request works on."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping

import msgspec

from gpuslice.model import nodes
from gpuslice.policy import api, columns
from gpuslice.policy import quota as quotas


class Orphan(msgspec.Struct, frozen=True, order=True):
    """A pod's grant on a card the cache cannot account: its node or the card UUID is unknown.

    Kept (not dropped) so that a node re-registering the card gets the usage back, and reported
    so an operator sees allocations that point nowhere.
    """

    node: str
    uuid: str
    pod: str


_NodeState = nodes.NodeState
_Columns = columns.NodeColumns
_QuotaView = quotas.QuotaView
_JobOnNode = nodes.JobOnNode


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a scheduling cycle reads, frozen at one cache generation.

    Attributes:
        generation: the cache generation this snapshot reflects.
        nodes: node name -> state (a read-only mapping of frozen states).
        columns: the same nodes packed for the vectorised filter (read-only arrays).
        quotas: namespace -> quota view (limits plus current usage) for namespaces with limits.
        workload: recently seen pod shapes, for fragmentation-aware policies (None if none yet).
        orphans: grants on unknown nodes or cards.
        capacity: the nodes' cards per model, sorted by model (``api.Context.capacity``).
        jobs: the job index: job -> node name -> the job's pods there (``nodes.JobOnNode``), over
            every node's ``NodeState.jobs`` (``api.Context.job_nodes``); read-only, and kept
            by the cache node by node (the mappings of jobs no node change touched are shared
            between snapshots).
    """

    generation: int
    nodes: Mapping[str, _NodeState]
    columns: _Columns
    quotas: Mapping[str, _QuotaView] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    workload: api.Workload | None = None
    orphans: tuple[Orphan, ...] = ()
    capacity: tuple[tuple[str, int], ...] = ()
    jobs: Mapping[str, Mapping[str, _JobOnNode]] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )

    def job_nodes(self, job: str) -> Mapping[str, _JobOnNode]:
        """Node name -> the job's pods there, for every node holding some (empty for '' or none)."""
        return self.jobs.get(job, api.NO_JOB_NODES) if job else api.NO_JOB_NODES

    def quota(self, namespace: str) -> _QuotaView | None:
        """The namespace's quota view, or None when it has no limits."""
        return self.quotas.get(namespace)


def job_index(states: Mapping[str, nodes.NodeState]) -> Mapping[str, Mapping[str, nodes.JobOnNode]]:
    """``Snapshot.jobs`` by a scan of every node's ``NodeState.jobs`` (what the cache keeps incrementally)."""
    out: dict[str, dict[str, nodes.JobOnNode]] = {}
    for name, state in states.items():
        for j in state.jobs:
            out.setdefault(j.job, {})[name] = j
    return types.MappingProxyType({job: types.MappingProxyType(on) for job, on in out.items()})


def from_states(states: list[nodes.NodeState], generation: int = 0) -> Snapshot:
    """A snapshot of plain node states (tests and the simulator)."""
    by_name = {s.name: s for s in states}
    return Snapshot(
        generation=generation,
        nodes=types.MappingProxyType(by_name),
        columns=columns.build(states),
        capacity=api.model_capacity(d.type for s in states for d in s.inventory.devices),
        jobs=job_index(by_name),
    )
