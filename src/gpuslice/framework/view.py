"""The extender's narrow view of the cache: every read of a ``Snapshot`` goes through here.

Handlers never touch the cache's types directly, so a change in the cache's snapshot layout is a
change in this one module.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Protocol

from gpuslice.model import allocations, nodes, status
from gpuslice.policy import api
from gpuslice.policy import columns as policy_columns
from gpuslice.policy import quota as quotas

_JobOnNode = nodes.JobOnNode  # the Protocol's ``nodes`` property shadows the module in its body


class Snapshot(Protocol):
    """What the extender reads of a cache snapshot (``cache.snapshot.Snapshot`` satisfies it)."""

    @property
    def generation(self) -> int:
        """The cache generation the snapshot reflects."""
        ...

    @property
    def nodes(self) -> Mapping[str, nodes.NodeState]:
        """Node name -> state, for nodes with a valid GPU registration."""
        ...

    @property
    def columns(self) -> policy_columns.NodeColumns:
        """The same nodes packed for the vectorised filter."""
        ...

    @property
    def workload(self) -> api.Workload | None:
        """Recently seen pod shapes (FGD's target workload), None if none yet."""
        ...

    @property
    def capacity(self) -> tuple[tuple[str, int], ...]:
        """The nodes' cards per model (``api.Context.capacity``)."""
        ...

    @property
    def jobs(self) -> Mapping[str, Mapping[str, _JobOnNode]]:
        """The job index: job -> node name -> the job's pods there (``NodeState.jobs``)."""
        ...

    def quota(self, namespace: str) -> quotas.QuotaView | None:
        """The namespace's GPU quota with its current usage, or None when unlimited."""
        ...


class Cache(Protocol):
    """The cache operations the extender uses."""

    def snapshot(self) -> Snapshot:
        """An immutable view of nodes, usage, quotas and the recent-request histogram."""
        ...

    def assume(
        self, key: str, uid: str, allocation: allocations.PodAllocation, now: float, job: str = ""
    ) -> status.Status:
        """Reserve an allocation for a pod before its binding is confirmed (atomically checked).

        ``job``: the pod's job (``PodRequest.job``), counted on the node for ``balanced``.
        """
        ...

    def finish_binding(self, key: str, now: float) -> None:
        """Mark the assumed pod's binding as done (its TTL starts)."""
        ...

    def forget(self, key: str) -> bool:
        """Drop an assumption (bind failed); False when the pod was not assumed."""
        ...

    def observe_request(self, shape: api.Shape) -> None:
        """Record a requested pod shape for the target-workload histogram."""
        ...


def observe(cache: Cache, shape: api.Shape) -> None:
    """Feed the cache's recent-request histogram (FGD's target workload)."""
    cache.observe_request(shape)


def node_state(snap: Snapshot, name: str) -> nodes.NodeState | None:
    """The node's state, or None when the node has no valid GPU registration."""
    return snap.nodes.get(name)


def node_problem(name: str, invalid: Collection[str] = ()) -> str:
    """Why a node without a state is unusable: invalid registration or none at all."""
    if name in invalid:
        return status.NODE_REGISTRATION_INVALID
    return status.NODE_UNREGISTERED


def columns(snap: Snapshot) -> policy_columns.NodeColumns:
    """The snapshot's nodes packed for the vectorised filter."""
    return snap.columns


def generation(snap: Snapshot) -> int:
    """The cache generation the snapshot reflects."""
    return snap.generation


def states(snap: Snapshot) -> Iterable[nodes.NodeState]:
    """Every registered node's state."""
    return snap.nodes.values()


def quota(snap: Snapshot, namespace: str) -> quotas.QuotaView | None:
    """The namespace's GPU quota with its current usage, or None when unlimited."""
    return snap.quota(namespace)


def workload(snap: Snapshot) -> api.Workload | None:
    """The recent-request histogram as an FGD target workload, when the cache keeps one."""
    return snap.workload


def capacity(snap: Snapshot) -> tuple[tuple[str, int], ...]:
    """The nodes' cards per model."""
    return snap.capacity


def job_nodes(snap: Snapshot, job: str) -> Mapping[str, nodes.JobOnNode]:
    """Node name -> the job's pods there, for every node holding some (empty for '' or none)."""
    if not job:
        return api.NO_JOB_NODES
    return snap.jobs.get(job, api.NO_JOB_NODES)
