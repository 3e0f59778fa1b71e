"""Packed per-card arrays for many nodes, so the filter can judge hundreds of nodes in one numpy pass.

Row r holds one node; column k its card k (``k < ncards[r]``). Padding cards have zero capacity
and are not usable. ``ColumnsBuilder`` is the mutable side (the cache updates rows as nodes
change); ``freeze`` hands out an immutable ``NodeColumns`` (read-only arrays) for a snapshot.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from gpuslice.model import nodes

IntArray = npt.NDArray[np.int64]

_CARD_FIELDS = ("total_mem", "used_mem", "total_cores", "used_cores", "split", "used_slots", "card_state")
CARD_OK = 0
CARD_UNHEALTHY = 1
CARD_CORDONED = 2
CARD_ABSENT = 3
_ROW_FIELDS = ("ncards", "first_mem", "cpu_total", "cpu_used", "hmem_total", "hmem_used")


@dataclasses.dataclass(frozen=True, slots=True)
class NodeColumns:
    """Read-only packed view of many nodes (see the module docstring).

    Attributes:
        row_of: node name -> row.
        total_mem, used_mem, total_cores, used_cores, split, used_slots: (rows, K) card arrays.
        card_state: (rows, K) ``CARD_OK``, ``CARD_UNHEALTHY``, ``CARD_CORDONED`` or ``CARD_ABSENT``.
        ncards, first_mem, cpu_total, cpu_used, hmem_total, hmem_used: (rows,) node arrays
            (``first_mem`` is card 0's memory, used for percentage requests in node scores).
    """

    row_of: Mapping[str, int]
    total_mem: IntArray
    used_mem: IntArray
    total_cores: IntArray
    used_cores: IntArray
    split: IntArray
    used_slots: IntArray
    card_state: IntArray
    ncards: IntArray
    first_mem: IntArray
    cpu_total: IntArray
    cpu_used: IntArray
    hmem_total: IntArray
    hmem_used: IntArray

    def rows(self, names: list[str] | tuple[str, ...]) -> IntArray:
        """Rows of the named nodes; -1 for a name not in the view."""
        get = self.row_of.get
        return np.fromiter((get(n, -1) for n in names), dtype=np.int64, count=len(names))


class ColumnsBuilder:
    """Mutable packed arrays with a row per node; rows of removed nodes are reused."""

    def __init__(self, rows: int = 64, cards: int = 8) -> None:
        """Start with room for ``rows`` nodes of up to ``cards`` cards (both grow on demand)."""
        self._row_of: dict[str, int] = {}
        self._free: list[int] = []
        self._cap = rows
        self._k = cards
        self._a: dict[str, IntArray] = {f: np.zeros((rows, cards), np.int64) for f in _CARD_FIELDS}
        self._a["card_state"][:] = CARD_ABSENT
        self._r: dict[str, IntArray] = {f: np.zeros(rows, np.int64) for f in _ROW_FIELDS}

    def _grow(self, rows: int, cards: int) -> None:
        def resize(a: IntArray, fill: int = 0) -> IntArray:
            shape = (rows, cards) if a.ndim == 2 else (rows,)
            out = np.full(shape, fill, a.dtype)
            out[tuple(slice(0, s) for s in a.shape)] = a
            return out

        self._a = {f: resize(a, CARD_ABSENT if f == "card_state" else 0) for f, a in self._a.items()}
        self._r = {f: resize(a) for f, a in self._r.items()}
        self._cap, self._k = rows, cards

    def set(self, state: nodes.NodeState) -> None:
        """Write (or overwrite) the node's row."""
        name = state.inventory.name
        row = self._row_of.get(name)
        if row is None:
            row = self._free.pop() if self._free else len(self._row_of)
            self._row_of[name] = row
        devs = state.inventory.devices
        if row >= self._cap or len(devs) > self._k:
            self._grow(
                max(self._cap, (row + 1) * 2 if row >= self._cap else self._cap), max(self._k, len(devs))
            )
        a = self._a
        for f in _CARD_FIELDS:
            a[f][row, :] = 0
        a["card_state"][row, :] = CARD_ABSENT
        cordoned = state.inventory.cordoned
        for k, (d, u) in enumerate(zip(devs, state.usage, strict=True)):
            a["total_mem"][row, k] = d.memory_mib
            a["used_mem"][row, k] = u.memory_mib
            a["total_cores"][row, k] = d.cores
            a["used_cores"][row, k] = u.cores
            a["split"][row, k] = d.split_count
            a["used_slots"][row, k] = u.slots
            a["card_state"][row, k] = (
                CARD_UNHEALTHY if not d.health else CARD_CORDONED if d.uuid in cordoned else CARD_OK
            )
        r = self._r
        r["ncards"][row] = len(devs)
        r["first_mem"][row] = devs[0].memory_mib if devs else 0
        r["cpu_total"][row] = state.inventory.cpu_milli
        r["cpu_used"][row] = state.cpu_used_milli
        r["hmem_total"][row] = state.inventory.memory_mib
        r["hmem_used"][row] = state.memory_used_mib

    def remove(self, name: str) -> None:
        """Drop the node's row (it becomes free for reuse)."""
        row = self._row_of.pop(name, None)
        if row is None:
            return
        for a in self._a.values():
            a[row, :] = 0
        self._a["card_state"][row, :] = CARD_ABSENT
        for r in self._r.values():
            r[row] = 0
        self._free.append(row)

    def freeze(self) -> NodeColumns:
        """An immutable copy of the current arrays."""

        def ro(a: IntArray) -> IntArray:
            c = a.copy()
            c.flags.writeable = False
            return c

        return NodeColumns(
            row_of=types.MappingProxyType(dict(self._row_of)),
            **{f: ro(a) for f, a in self._a.items()},
            **{f: ro(a) for f, a in self._r.items()},
        )


def build(states: Mapping[str, nodes.NodeState] | list[nodes.NodeState]) -> NodeColumns:
    """Columns for a list or mapping of node states (tests, the simulator)."""
    b = ColumnsBuilder(rows=max(1, len(states)))
    for s in states.values() if isinstance(states, Mapping) else states:
        b.set(s)
    return b.freeze()
