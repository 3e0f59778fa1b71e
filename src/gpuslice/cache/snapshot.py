"""The immutable view of the cluster that one filter/score request works on."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping

import msgspec

from gpuslice.model import nodes
from gpuslice.policy import columns, registry
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
        capacity: the nodes' cards per model, sorted by model (``registry.Context.capacity``).
    """

    generation: int
    nodes: Mapping[str, _NodeState]
    columns: _Columns
    quotas: Mapping[str, _QuotaView] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    workload: registry.Workload | None = None
    orphans: tuple[Orphan, ...] = ()
    capacity: tuple[tuple[str, int], ...] = ()

    def quota(self, namespace: str) -> _QuotaView | None:
        """The namespace's quota view, or None when it has no limits."""
        return self.quotas.get(namespace)


def from_states(states: list[nodes.NodeState], generation: int = 0) -> Snapshot:
    """A snapshot of plain node states (tests and the simulator)."""
    by_name = {s.name: s for s in states}
    return Snapshot(
        generation=generation,
        nodes=types.MappingProxyType(by_name),
        columns=columns.build(states),
        capacity=registry.model_capacity(d.type for s in states for d in s.inventory.devices),
    )
