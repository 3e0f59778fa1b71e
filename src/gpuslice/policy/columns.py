"""Packed per-card arrays for many nodes, so the filter can judge hundreds of nodes in one numpy pass.

Row r holds one node; column k its card k (``k < ncards[r]``); padding cards are ``CARD_ABSENT``.
Five arrays, laid out for one gather per request:

* ``cards`` (rows, K, ``len(CARD_FIELDS)``) int32 (clipped to its range): every per-card number
  (capacities, usage, state, NUMA node, and the card's type and mode as indices into ``types`` /
  ``modes``).
* ``hot`` (rows, K, ``len(HOT_FIELDS)``) int32: what the vectorised filter reads. ``flag`` is
  ``FREE`` (usable, idle), ``SHARED`` (usable, in use) or, for a card no request can take, the
  first reason in ``cards`` order: ``ABSENT``, ``UNHEALTHY``, ``CORDONED``, ``SLOTS_FULL``,
  ``HELD`` (all cores taken: no request is eligible, but its reason depends on the request, so
  ``vectorfit`` codes it like a card in use); then free memory, free cores, total memory, total cores, and
  ``idle_ok`` (1 when the card would be usable with no usage: healthy, uncordoned, split > 0).
* ``nodes`` (rows, ``len(ROW_FIELDS)``) int64: per-node sums, host resources, the node's
  card-pair tables as an index into ``links`` (``linktables``; nodes with equal tables share one),
  the sum of its cards' free milli-GPU, its GPU-pod tag set as an index into ``tag_sets``, and
  how many of its cards register no memory or no cores (``nocap_cards``) and how many have a
  headroom (``head_cards``).
* ``heads`` (rows, K) float64: each card's thermal/power headroom (``thermal.headroom``; NaN
  without readings, and for padding).
* ``telemetry_at`` (rows,) float64: when the node's telemetry was read
  (``NodeInventory.telemetry_at``, Unix seconds; NaN when unknown, and for free rows), for the age
  rule on ``heads`` (``thermal.stale_rows``).

Per card, ``free_milli`` is ``shares.card_free_milli`` (the paper policies' unit) and the row's
``tags_id`` names ``shares.node_tags`` of the state as given (recorded tags for a
``shares.TaggedNodeState``, estimated from usage otherwise). Fields are only ever appended, so
indices taken with ``CARD_FIELDS.index`` / ``ROW_FIELDS.index`` (and ``hot`` by position) stay valid.

``ColumnsBuilder`` is the mutable side (the cache rewrites rows as nodes change); ``freeze`` hands
out an immutable ``NodeColumns`` with read-only copies.
"""

from __future__ import annotations

import dataclasses
import operator
import types
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from gpuslice.model import devices, nodes
from gpuslice.policy import cards as card_checks
from gpuslice.policy import linktables, shares, thermal

IntArray = npt.NDArray[np.int64]
Int32Array = npt.NDArray[np.int32]
FloatArray = npt.NDArray[np.float64]

CARD_OK, CARD_UNHEALTHY, CARD_CORDONED, CARD_ABSENT = 0, 1, 2, 3
CARD_FIELDS = (
    "total_mem",
    "used_mem",
    "total_cores",
    "used_cores",
    "split",
    "used_slots",
    "card_state",
    "type_id",
    "mode_id",
    "numa",
    "free_milli",
)
ROW_FIELDS = (
    "ncards",
    "first_mem",
    "sum_total_mem",
    "sum_used_mem",
    "sum_total_cores",
    "sum_used_cores",
    "cpu_total",
    "cpu_used",
    "hmem_total",
    "hmem_used",
    "links_id",
    "sum_free_milli",
    "tags_id",
    "nocap_cards",
    "head_cards",
)
FREE, SHARED = 0, 1
ABSENT, UNHEALTHY, CORDONED, SLOTS_FULL, HELD = 10, 11, 12, 13, 14
BLOCKED = ABSENT  # flags >= BLOCKED: no request can take the card
HOT_FIELDS = ("flag", "free_mem", "free_cores", "total_mem", "total_cores", "idle_ok")
_C = {f: k for k, f in enumerate(CARD_FIELDS)}
_R = {f: k for k, f in enumerate(ROW_FIELDS)}


@dataclasses.dataclass(frozen=True, slots=True)
class NodeColumns:
    """Read-only packed view of many nodes (see the module docstring)."""

    row_of: Mapping[str, int]
    cards: Int32Array
    hot: Int32Array
    nodes: IntArray
    heads: FloatArray
    telemetry_at: FloatArray
    types: tuple[str, ...]
    modes: tuple[str, ...]
    links: tuple[linktables.LinkTables, ...]
    tag_sets: tuple[frozenset[str], ...]
    _rows: dict[str, int] = dataclasses.field(repr=False, compare=False)

    def card(self, field: str) -> Int32Array:
        """One per-card field as a (rows, K) view, e.g. ``card("used_mem")``."""
        return self.cards[:, :, _C[field]]

    def node(self, field: str) -> IntArray:
        """One per-node field as a (rows,) view, e.g. ``node("ncards")``."""
        return self.nodes[:, _R[field]]

    @property
    def has_mig(self) -> bool:
        """True when a card in MIG mode was ever packed.

        The vectorised checks cannot judge MIG instances (``policy.mig``), so callers take the
        exact path (``fit.place``).
        """
        return devices.MODE_MIG in self.modes

    def rows(self, names: list[str] | tuple[str, ...]) -> IntArray:
        """Rows of the named nodes; -1 for a name not in the view."""
        if len(names) > 1:
            try:
                return np.array(operator.itemgetter(*names)(self._rows), dtype=np.int64)
            except KeyError:
                pass
        get = self._rows.get
        return np.array([get(n, -1) for n in names], dtype=np.int64)


class ColumnsBuilder:
    """Mutable packed arrays with a row per node; rows of removed nodes are reused."""

    def __init__(self, rows: int = 64, cards: int = 8) -> None:
        """Start with room for ``rows`` nodes of up to ``cards`` cards (both grow on demand)."""
        self._row_of: dict[str, int] = {}
        self._free: list[int] = []
        self._types: dict[str, int] = {}
        self._modes: dict[str, int] = {}
        self._links: dict[linktables.LinkTables, int] = {}
        self._tag_sets: dict[frozenset[str], int] = {}
        self._frozen_rows: dict[str, int] | None = None
        self._cards = np.zeros((rows, cards, len(CARD_FIELDS)), np.int32)
        self._cards[:, :, _C["card_state"]] = CARD_ABSENT
        self._hot = np.zeros((rows, cards, len(HOT_FIELDS)), np.int32)
        self._hot[:, :, 0] = ABSENT
        self._nodes = np.zeros((rows, len(ROW_FIELDS)), np.int64)
        self._heads = np.full((rows, cards), np.nan, np.float64)
        # rows holding readings -> what was written; the frozen copy is reused while none changes
        self._head_rows: dict[int, tuple[float | None, ...]] = {}
        self._frozen_heads: FloatArray | None = None
        # rows with a known telemetry time -> that time; the frozen copy is reused while none changes
        self._at = np.full(rows, np.nan, np.float64)
        self._at_rows: dict[int, float] = {}
        self._frozen_at: FloatArray | None = None

    def _grow(self, rows: int, k: int) -> None:
        old_rows, old_k = self._cards.shape[:2]
        c = np.zeros((rows, k, len(CARD_FIELDS)), np.int32)
        c[:, :, _C["card_state"]] = CARD_ABSENT
        c[:old_rows, :old_k] = self._cards
        h = np.zeros((rows, k, len(HOT_FIELDS)), np.int32)
        h[:, :, 0] = ABSENT
        h[:old_rows, :old_k] = self._hot
        n = np.zeros((rows, len(ROW_FIELDS)), np.int64)
        n[:old_rows] = self._nodes
        t = np.full((rows, k), np.nan, np.float64)
        t[:old_rows, :old_k] = self._heads
        self._cards, self._hot, self._nodes, self._heads = c, h, n, t
        self._frozen_heads = None
        if rows > len(self._at):
            at = np.full(rows, np.nan, np.float64)
            at[: len(self._at)] = self._at
            self._at = at
            self._frozen_at = None

    def set(self, state: nodes.NodeState) -> None:
        """Write (or overwrite) the node's row."""
        name = state.inventory.name
        row = self._row_of.get(name)
        if row is None:
            row = self._free.pop() if self._free else len(self._row_of)
            self._row_of[name] = row
            self._frozen_rows = None
        devs = state.inventory.devices
        cap, k = self._cards.shape[:2]
        if row >= cap or len(devs) > k:
            self._grow(max(cap, 2 * (row + 1)), max(k, len(devs)))
        self._clear(row)
        cordoned = state.inventory.cordoned
        crow = self._cards[row]
        hrow = self._hot[row]
        free = shares.free_milli(state)
        heads = tuple(thermal.headrooms(state)) if state.inventory.telemetry else None
        self._set_heads(row, heads)
        self._set_at(row, state.inventory.telemetry_at)
        for i, (d, u) in enumerate(zip(devs, state.usage, strict=True)):
            st = CARD_UNHEALTHY if not d.health else CARD_CORDONED if d.uuid in cordoned else CARD_OK
            type_id = self._types.setdefault(d.type, len(self._types))
            mode_id = self._modes.setdefault(d.mode, len(self._modes))
            crow[i] = (  # registered numbers are int32 by decoding; usage sums over pods may not be
                d.memory_mib,
                _clip32(u.memory_mib),
                d.cores,
                _clip32(u.cores),
                d.split_count,
                _clip32(u.slots),
                st,
                type_id,
                mode_id,
                d.numa,
                _clip32(free[i]),
            )
            if st == CARD_UNHEALTHY:
                flag = UNHEALTHY
            elif st == CARD_CORDONED:
                flag = CORDONED
            elif u.slots >= d.split_count:
                flag = SLOTS_FULL
            elif card_checks.held_exclusively(d, u):
                flag = HELD
            else:
                flag = SHARED if u.slots > 0 else FREE
            hrow[i] = (
                flag,
                _clip32(d.memory_mib - u.memory_mib),
                _clip32(d.cores - u.cores),
                _clip32(d.memory_mib),
                _clip32(d.cores),
                int(st == CARD_OK and d.split_count > 0),
            )
        self._nodes[row] = (
            len(devs),
            devs[0].memory_mib if devs else 0,
            sum(d.memory_mib for d in devs),
            sum(u.memory_mib for u in state.usage),
            sum(d.cores for d in devs),
            sum(u.cores for u in state.usage),
            state.inventory.cpu_milli,
            state.cpu_used_milli,
            state.inventory.memory_mib,
            state.memory_used_mib,
            self._links.setdefault(linktables.of(state.inventory), len(self._links)),
            sum(free),
            self._tag_sets.setdefault(shares.node_tags(state), len(self._tag_sets)),
            sum(1 for d in devs if d.memory_mib <= 0 or d.cores <= 0),
            0 if heads is None else sum(1 for h in heads if h is not None),
        )

    def _clear(self, row: int) -> None:
        self._cards[row] = 0
        self._cards[row, :, _C["card_state"]] = CARD_ABSENT
        self._hot[row] = 0
        self._hot[row, :, 0] = ABSENT
        self._nodes[row] = 0

    def _set_heads(self, row: int, heads: tuple[float | None, ...] | None) -> None:
        """Write the row's headrooms (None: no readings), only when they changed."""
        if self._head_rows.get(row) == heads:
            return
        self._heads[row] = np.nan
        if heads is None:
            self._head_rows.pop(row, None)
        else:
            self._head_rows[row] = heads
            for i, h in enumerate(heads):
                if h is not None:
                    self._heads[row, i] = h
        self._frozen_heads = None

    def _set_at(self, row: int, at: float | None) -> None:
        """Write the row's telemetry time (None: unknown), only when it changed."""
        if self._at_rows.get(row) == at:
            return
        if at is None:
            self._at_rows.pop(row, None)
            self._at[row] = np.nan
        else:
            self._at_rows[row] = at
            self._at[row] = at
        self._frozen_at = None

    def remove(self, name: str) -> None:
        """Drop the node's row (it becomes free for reuse)."""
        row = self._row_of.pop(name, None)
        if row is not None:
            self._clear(row)
            self._set_heads(row, None)
            self._set_at(row, None)
            self._free.append(row)
            self._frozen_rows = None

    def freeze(self) -> NodeColumns:
        """An immutable copy of the current arrays (rows in use only)."""
        used = len(self._row_of) + len(self._free)
        c, h, n = self._cards[:used].copy(), self._hot[:used].copy(), self._nodes[:used].copy()
        t = self._frozen_heads
        if t is None or len(t) != used:
            t = self._frozen_heads = self._heads[:used].copy()
        at = self._frozen_at
        if at is None or len(at) != used:
            at = self._frozen_at = self._at[:used].copy()
        for a in (c, h, n, t, at):
            a.flags.writeable = False
        if self._frozen_rows is None:
            self._frozen_rows = dict(self._row_of)
        rows = self._frozen_rows
        return NodeColumns(
            row_of=types.MappingProxyType(rows),
            cards=c,
            hot=h,
            nodes=n,
            heads=t,
            telemetry_at=at,
            types=tuple(self._types),
            modes=tuple(self._modes),
            links=tuple(self._links),
            tag_sets=tuple(self._tag_sets),
            _rows=rows,
        )


def _clip32(v: int) -> int:
    return max(-(2**31), min(2**31 - 1, v))


def build(states: Mapping[str, nodes.NodeState] | list[nodes.NodeState]) -> NodeColumns:
    """Columns for a list or mapping of node states (tests, the simulator)."""
    b = ColumnsBuilder(rows=max(1, len(states)))
    for s in states.values() if isinstance(states, Mapping) else states:
        b.set(s)
    return b.freeze()
