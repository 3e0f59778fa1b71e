"""The extender's narrow view of the cache: every read of a ``Snapshot`` goes through here.

Handlers never touch the cache's types directly, so a change in the cache's snapshot layout is a
change in this one module.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any, Protocol

from gpuslice.model import allocations, nodes, status
from gpuslice.policy import columns as policy_columns
from gpuslice.policy import quota as quotas
from gpuslice.policy import registry


class Cache(Protocol):
    """The cache operations the extender uses."""

    def snapshot(self) -> Any:
        """An immutable view of nodes, usage, quotas and the recent-request histogram."""
        ...

    def assume(self, key: str, uid: str, allocation: allocations.PodAllocation, now: float) -> Any:
        """Reserve an allocation for a pod before its binding is confirmed."""
        ...

    def finish_binding(self, key: str, now: float) -> Any:
        """Mark the assumed pod's binding as done (its TTL starts)."""
        ...

    def forget(self, key: str) -> Any:
        """Drop an assumption (bind failed)."""
        ...


def observe(cache: Cache, shape: registry.Shape) -> None:
    """Feed the cache's recent-request histogram, when it keeps one."""
    observe_request = getattr(cache, "observe_request", None)
    if observe_request is not None:
        observe_request(shape)


def node_state(snap: Any, name: str) -> nodes.NodeState | None:
    """The node's state, or None when the node has no valid GPU registration."""
    state: nodes.NodeState | None = snap.nodes.get(name)
    return state


def node_problem(snap: Any, name: str, invalid: Collection[str] = ()) -> str:
    """Why a node without a state is unusable: invalid registration or none at all."""
    if name in invalid or name in getattr(snap, "invalid_nodes", ()):
        return status.NODE_REGISTRATION_INVALID
    return status.NODE_UNREGISTERED


def columns(snap: Any) -> policy_columns.NodeColumns | None:
    """The snapshot's nodes packed for the vectorised filter, when the cache builds them."""
    cols: policy_columns.NodeColumns | None = getattr(snap, "columns", None)
    return cols


def generation(snap: Any) -> int | None:
    """The cache generation the snapshot reflects, when known."""
    gen: int | None = getattr(snap, "generation", None)
    return gen


def states(snap: Any) -> Iterable[nodes.NodeState]:
    """Every registered node's state."""
    out: Iterable[nodes.NodeState] = snap.nodes.values()
    return out


def quota(snap: Any, namespace: str) -> quotas.QuotaView | None:
    """The namespace's GPU quota with its current usage, or None when unlimited."""
    getter = getattr(snap, "quota", None)
    if getter is None:
        return None
    view: quotas.QuotaView | None = getter(namespace) if callable(getter) else getter.get(namespace)
    return view


def workload(snap: Any) -> registry.Workload | None:
    """The recent-request histogram as an FGD target workload, when the cache keeps one."""
    w: registry.Workload | None = getattr(snap, "workload", None)
    return w
