"""FGD and fgd-lookahead node scores for many nodes at once, equal to their ``score_node``.

``score_rows`` reads each row's free milli per card from ``columns.NodeColumns`` (as
``shares.card_free_milli`` computes it from free and total cores and memory), its free CPU and its
model (the first card's type), and returns ``fragmentation.fgd_choice``'s score for every row. F is
the exact integer of ``fragscore``, so equal means equal, not close.

Notation: a row's cards in descending order ``c_0 >= c_1 >= ...`` (padding cards are 0), total R.
Both measures are ``F = W * R - B`` with W the sum of all weights (CPU-only shapes included) and
``B = sum_s w_s * (the m_s largest cards)``, where ``m_s`` is how many cards shape s can use: for
FGD every card reaching its share if one task fits, else none; for fgd-lookahead's sharing shapes,
the cards of as many tasks as fit. Summing over card positions instead of shapes,
``B = sum_u c_{u-1} * N(u)`` with ``N(u)`` the weight of the shapes using at least u cards, which
``Plan`` reads from one table per count class: K lookups per row, whatever the number of shapes.

A whole-card pod leaves one state per row (its lowest-numbered fully free cards emptied): F of both.
A sharing pod may take any card with ``c >= d``; its score is that of ``F_old - min F_after`` over
the candidates (one per distinct value; the table is monotone). Taking d from a card moves one value
down the sorted order, so F_after is the row's F plus the change in a window of positions
(``Plan._sharing``): a few gathers per candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from gpuslice.model import requests
from gpuslice.policy import columns, fragscore, shares

IntArray = columns.IntArray
BoolArray = npt.NDArray[np.bool_]
ShapeUnits = tuple[int, int, int, int, tuple[str, ...]]
"""A GPU shape of a measure: (weight in ``fragscore.UNIT``, CPU milli, share milli, count, types)."""
Weights = tuple[int, tuple[int, ...]]
"""The weights a measure sums on one model's nodes: (CPU-only shapes, each GPU shape in order)."""

_FLAG, _FREE_MEM, _FREE_CORES, _TOTAL_MEM, _TOTAL_CORES = (
    columns.HOT_FIELDS.index(f) for f in ("flag", "free_mem", "free_cores", "total_mem", "total_cores")
)
_NCARDS, _FIRST_MEM, _CPU_TOTAL, _CPU_USED = (
    columns.ROW_FIELDS.index(f) for f in ("ncards", "first_mem", "cpu_total", "cpu_used")
)
_TYPE_ID = columns.CARD_FIELDS.index("type_id")
_FULL = shares.FULL
_NONE = np.iinfo(np.int64).max
_VALUES = np.arange(_FULL + 1)


class View(NamedTuple):
    """What the measures read of some rows.

    Attributes:
        free: (rows, K) free milli per card in card order, 0 for padding.
        ncards: cards per row.
        cpu: free CPU milli (total - used).
        type_ids: the node model: the first card's type (index into ``NodeColumns.types``; any for
            a node without cards, whose F is 0 before and after whatever its model).
        first_mem: the first card's memory (the demand's reference).
    """

    free: IntArray
    ncards: IntArray
    cpu: IntArray
    type_ids: IntArray
    first_mem: IntArray

    def take(self, sel: IntArray) -> View:
        """The view of some of its rows."""
        return View(self.free[sel], self.ncards[sel], self.cpu[sel], self.type_ids[sel], self.first_mem[sel])

    def each(self, types: tuple[str, ...]) -> Iterator[tuple[tuple[int, ...], int, str, int]]:
        """Per row (free milli of its cards, free CPU, model, first card memory), for the exact path."""
        for free, n, cpu, t, mem in zip(
            self.free.tolist(),
            self.ncards.tolist(),
            self.cpu.tolist(),
            self.type_ids.tolist(),
            self.first_mem.tolist(),
            strict=True,
        ):
            yield tuple(free[:n]), cpu, types[t] if n else "", mem


def read(cols: columns.NodeColumns, rows: IntArray) -> View:
    """The rows' free milli per card (``shares.card_free_milli``), free CPU, model and card memory.

    ``card_free_milli`` is 0 on unhealthy, cordoned and slot-full cards (and padding), on cards
    without cores or memory, and (by its formula) on cards whose cores are all taken; otherwise
    ``max(0, min(1000 * fc // tc, 1000 * fm // tm))``. Each quotient here is one correctly rounded
    division of integers below 2**53, so its floor is exact whenever the quotient is at most 1000
    (the gap to the next integer, at least ``1 / tc``, is far above the rounding error); a card
    showing more than 1000 sends the caller to the exact path.
    """
    hot = cols.hot[rows]
    node = cols.nodes[rows]
    tm = hot[:, :, _TOTAL_MEM]
    tc = hot[:, :, _TOTAL_CORES]
    # HELD cards (all cores taken) would be usable but have no core share left: 0 either way
    usable = (hot[:, :, _FLAG] <= columns.SHARED) & (tm > 0) & (tc > 0)
    by_cores = np.multiply(hot[:, :, _FREE_CORES], float(_FULL))
    by_cores /= np.maximum(tc, 1)
    by_mem = np.multiply(hot[:, :, _FREE_MEM], float(_FULL))
    by_mem /= np.maximum(tm, 1)
    np.minimum(by_cores, by_mem, out=by_cores)
    np.floor(by_cores, out=by_cores)
    np.maximum(by_cores, 0, out=by_cores)
    free = np.where(usable, by_cores, 0).astype(np.int64)
    return View(
        free,
        node[:, _NCARDS],
        node[:, _CPU_TOTAL] - node[:, _CPU_USED],
        cols.cards[rows, 0, _TYPE_ID].astype(np.int64),
        node[:, _FIRST_MEM],
    )


def score_rows(
    cols: columns.NodeColumns,
    rows: IntArray,
    pod: requests.PodRequest,
    plan_for: Callable[[shares.Demand], Plan],
) -> IntArray | None:
    """FGD's score of every row for the pod (``plan_for`` gives the measure's tables for a demand).

    None when a card shows more than a whole card free (usage below zero): the caller then takes the
    node-by-node path, whose Python integers cannot overflow.
    """
    n = len(rows)
    if n == 0:
        return np.zeros(0, np.int64)
    view = read(cols, rows)
    if int(view.free.max()) > _FULL:
        return None
    mem = view.first_mem
    first = int(mem[0])
    if bool((mem == first).all()):
        d = shares.demand(pod, first)
        return plan_for(d).scores(view, d)
    out = np.empty(n, np.int64)
    for m in np.unique(mem).tolist():
        sel = np.flatnonzero(mem == m)
        d = shares.demand(pod, m)
        out[sel] = plan_for(d).scores(view.take(sel), d)
    return out


class _Class(NamedTuple):
    """Shapes of one count class, in share order, and their table (see ``Plan``)."""

    positions: IntArray | None  # (K, 1) card position whose value decides u (None: u - 1; K: none)
    below: IntArray  # below[x] * width: shapes of the class with share <= x, x in 0..FULL; 0 at FULL + 1
    table: IntArray  # flat (models * levels, S + 1, width): prefix sums over the shapes
    stride: int  # (S + 1) * width
    width: int  # K when the entries depend on u, else 1
    lowest: int  # the least share (a share <= 0 is reached by a padding card, which must not count)


class Plan:
    """A measure's tables for nodes of at most ``width`` cards whose card models are ``types``.

    Every measure is ``F = W * R - B`` with ``B = sum_s w_s * P[m_s] = sum_u c_{u-1} * N(u)``, where
    ``N(u) = sum_s w_s [m_s >= u]`` (u = 1..K) is the weight of the shapes using at least u cards:

    * FGD shape of count k: ``m_s >= u`` iff it fits (CPU and model: the weight at the row's level)
      and card ``max(u, k)`` reaches its share, i.e. ``c_{max(u,k)-1} >= d_s``;
    * repeated shape of count k: ``m_s >= u`` iff ``k * tasks_s(CPU) >= u`` (at the row's level) and
      ``cnt_s >= ceil(u / k) * k``, i.e. card ``ceil(u / k) * k`` reaches its share.

    So with the shapes of one count class in share order, ``N(u)`` is a prefix of the class, cut
    where the deciding card's value stops reaching: ``table[level, below[c_pos(u)], u]``. Shapes of
    count 1 (FGD or repeated) decide on ``c_{u-1}`` and form one class. A row costs K lookups per
    class, for any number of shapes; so does a sharing pod's candidate (its cards after the move).

    The level of a free CPU is the number of boundaries it reaches: the FGD shapes' CPUs and the
    repeated shapes' multiples ``t * cpu_s`` (t <= K), between which neither test changes.

    The weights may differ by model (``weights``: fgd-lookahead's model-aware measure), so ``W`` is
    per row, read from the row's model like the tables.

    Args:
        gpu: the measure's GPU shapes.
        weights: the weights on a model's nodes (``Fragmentation.model_weights``).
        repeated: fgd-lookahead's measure (sharing shapes counted as repeated tasks).
        width: cards per row of the columns.
        types: the columns' card models (the tables have one slice per model when shapes are typed).
    """

    def __init__(
        self,
        gpu: Sequence[ShapeUnits],
        weights: Callable[[str], Weights],
        repeated: bool,
        width: int,
        types: tuple[str, ...],
    ) -> None:
        k = width
        self.width = k
        self._u = np.arange(k)[:, None]
        self.typed = any(s[4] for s in gpu) and bool(types)
        models = types if self.typed else ("",)
        per_model = [weights(name) for name in models]
        self._wsums = np.array([c + sum(w) for c, w in per_model], np.int64)
        self.wsum = int(self._wsums[0])
        keep = [i for i, s in enumerate(gpu) if s[3] <= k]  # a shape of more cards than any node never fits
        self._w_models = np.array([[w[i] for i in keep] for _, w in per_model], np.int64).reshape(
            len(models), len(keep)
        )
        kept = [gpu[i] for i in keep]
        columns_ = list(zip(*kept, strict=True)) or [(), (), (), (), ()]
        numbers = np.array(columns_[:4], np.int64).reshape(4, len(kept))  # w, cpu, share, count
        rep = (numbers[2] < _FULL) if repeated else np.zeros(len(kept), np.bool_)
        cpu = numbers[1]
        steps = cpu[rep & (cpu > 0)][:, None] * np.arange(1, k + 1)
        self._bounds = np.unique(np.concatenate((cpu[~rep], steps.ravel())))
        self.levels = len(self._bounds) + 1
        floors = np.concatenate(([-(1 << 62)], self._bounds))  # the least free CPU of each level
        if self.typed:
            allowed = np.array(
                [[not s[4] or shares.type_allowed(name, s[4]) for s in kept] for name in types], np.bool_
            ).reshape(len(types), len(kept))
        else:
            allowed = np.ones((1, len(kept)), np.bool_)
        classes: dict[tuple[int, bool], list[int]] = {}
        for i, (count, r) in enumerate(zip(columns_[3], rep.tolist(), strict=True)):
            classes.setdefault((1, False) if count == 1 else (count, r), []).append(i)
        self._classes = [
            self._class(numbers, rep, allowed, idx, count, r, floors)
            for (count, r), idx in sorted(classes.items())
        ]

    def _class(
        self,
        numbers: IntArray,
        rep: BoolArray,
        allowed: BoolArray,
        idx: list[int],
        count: int,
        repeated: bool,
        floors: IntArray,
    ) -> _Class:
        k = self.width
        part = np.array(idx, np.int64)
        part = part[np.argsort(numbers[2, part], kind="stable")]  # share order
        cpu, share = numbers[1, part], numbers[2, part]
        is_rep = rep[part]
        width = k if is_rep.any() else 1
        # A shape counts at CPU level l for u cards iff the level's least CPU reaches a threshold:
        # FGD shapes their CPU (any u); repeated ones ceil(u / count) tasks' CPU (none without CPU).
        tasks = -(-np.arange(1, width + 1) // count)
        need = np.where(cpu[:, None] > 0, tasks[None, :] * cpu[:, None], -(1 << 63))
        need = np.where(is_rep[:, None], need, cpu[:, None])  # (S, width)
        counts = floors[:, None, None] >= need[None]  # (levels, S, width)
        weights = allowed[:, part] * self._w_models[:, part]  # (models, S)
        table = np.zeros((len(weights) * self.levels, len(part) + 1, width), np.int64)
        np.cumsum(
            (counts[None] * weights[:, None, :, None]).reshape(len(weights) * self.levels, len(part), width),
            axis=1,
            out=table[:, 1:],
        )
        if count == 1:
            positions = None
        elif repeated:
            positions = np.minimum(tasks * count - 1, k)[:, None]
        else:
            positions = (np.maximum(np.arange(1, k + 1), count) - 1)[:, None]
        below = np.zeros(_FULL + 2, np.int64)
        below[: _FULL + 1] = np.searchsorted(share, _VALUES, side="right") * width
        return _Class(positions, below, table.ravel(), (len(part) + 1) * width, width, int(share[0]))

    def level(self, cpu: IntArray, models: IntArray | None) -> IntArray:
        """Each row's (model, CPU level) index into the tables."""
        level = np.searchsorted(self._bounds, cpu, side="right")
        if models is not None:
            level = level + models * self.levels
        return level

    def _weights(self, cls: _Class, look: IntArray, level: IntArray) -> IntArray:
        """``N(u)`` of one class per card position (row u - 1) and column of ``look`` ((K, X))."""
        base = level * cls.stride
        if cls.width > 1:
            base = base + self._u
        if cls.positions is None:
            index = cls.below[look] + base
        else:  # the deciding card of u; position K (no such card) reads 0
            j = np.zeros((look.shape[0] + 1, look.shape[1]), np.int64)
            j[:-1] = cls.below[look]
            index = j[cls.positions, np.arange(look.shape[1])] + base
        out: IntArray = cls.table[index]
        return out

    def used(self, desc: IntArray, look: IntArray, level: IntArray, classes: Sequence[_Class]) -> IntArray:
        """``B = sum_u c_{u-1} * N(u)`` over some classes, per column of ``desc`` ((K, X), descending).

        ``look`` is ``desc`` with padding cards replaced by FULL + 1 (below = 0) where a share <= 0
        could count them, else ``desc`` itself.
        """
        n_u: IntArray | None = None
        for cls in classes:
            got = self._weights(cls, look, level)
            n_u = got if n_u is None else n_u + got
        if n_u is None:
            return np.zeros(desc.shape[1], np.int64)
        out: IntArray = np.einsum("ij,ij->j", desc, n_u)
        return out

    def scores(self, view: View, d: shares.Demand) -> IntArray:
        """FGD's score of each row of the view for a pod of demand ``d``."""
        free = view.free
        n, k = free.shape
        models = view.type_ids if self.typed else None
        # A padding card (value 0) reaches a share <= 0: mask it where such a share can count it.
        masked = any(cls.lowest <= 0 for cls in self._classes) or (d.sharing and d.share_milli <= 0)
        valid = np.arange(k)[:, None] < view.ncards if masked else None
        level = self.level(view.cpu, models)
        after_level = level if not d.cpu_milli else self.level(view.cpu - d.cpu_milli, models)
        wsum = self._wsums[models] if models is not None else self.wsum
        asc = np.sort(free, axis=1)
        desc = _descending(asc)
        look = _look(desc, valid)
        total = desc.sum(axis=0)
        if not d.sharing:
            after = free
            if d.gpus:
                full = free >= _FULL  # padding holds 0
                after = np.where(full & (np.cumsum(full, axis=1) <= d.gpus), 0, free)
            moved = _descending(np.sort(after, axis=1))
            old = wsum * total - self.used(desc, look, level, self._classes)
            new = wsum * moved.sum(axis=0) - self.used(moved, _look(moved, valid), after_level, self._classes)
            return fragscore.scores(old - new)
        return self._sharing(asc, desc, look, valid, total, wsum, level, after_level, d.share_milli)

    def _sharing(
        self,
        asc: IntArray,
        desc: IntArray,
        look: IntArray,
        valid: BoolArray | None,
        total: IntArray,
        wsum: IntArray | int,
        level: IntArray,
        after_level: IntArray,
        share: int,
    ) -> IntArray:
        """The best card's score for a sharing pod: F_old - min over candidates of F_after.

        Taking ``share`` from the card at position p (value f, the last card of that value) moves
        ``v = f - share`` down: ``c'_i = c_{i+1}`` for i from p while ``c_{i+1} >= v``, then v, and
        the rest is unchanged. For the count-1 class a candidate's B is the row's B at the CPU level
        after the pod plus the change over that window (``_window``: a few gathers per candidate);
        other classes read cards elsewhere and are evaluated on the whole moved column.
        """
        k, n = desc.shape
        first, rest = (self._classes[0], self._classes[1:]) if self._classes else (None, [])
        if first is not None and first.positions is not None:
            first, rest = None, self._classes
        old = wsum * total
        new_row = wsum * (total - share)
        terms = None
        if first is not None:
            terms = desc * self._weights(first, look, after_level)
            b_after = terms.sum(axis=0)
            new_row = new_row - b_after
            old = old - (b_after if after_level is level else self.used(desc, look, level, [first]))
        if rest:
            old = old - self.used(desc, look, level, rest)
        cand = desc >= share
        if valid is not None:
            cand &= valid
        cand[:-1] &= desc[:-1] != desc[1:]  # one candidate per distinct value: the last of its run
        at = np.flatnonzero(cand)  # pos * n + col
        pos = at // n
        col = at - pos * n
        v = desc.ravel()[at] - share
        new = new_row[col]
        if first is not None and terms is not None:
            new = new - self._window(first, asc, desc, terms, after_level, pos, col, v)
        if rest:
            cur = desc[:, col]
            nxt = np.full_like(cur, -1)
            nxt[:-1] = cur[1:]
            moved = np.where(np.arange(k)[:, None] < pos, cur, np.maximum(nxt, np.minimum(cur, v)))
            moved_look = _look(moved, None if valid is None else valid[:, col])
            new = new - self.used(moved, moved_look, after_level[col], rest)
        best = np.full(k * n, _NONE, np.int64)
        best[at] = new
        out = fragscore.scores(old - best.reshape(k, n).min(axis=0))
        out[~cand.any(axis=0)] = 0
        return out

    def _window(
        self,
        cls: _Class,
        asc: IntArray,
        desc: IntArray,
        terms: IntArray,
        level: IntArray,
        pos: IntArray,
        col: IntArray,
        v: IntArray,
    ) -> IntArray:
        """Per candidate, B(after) - B(row) of the count-1 class at the CPU level after the pod.

        ``terms[i] = c_i * N(i + 1)`` of the row. The window is ``[p, q]``, ``q + 1`` = the cards
        ``>= v``: each position i < q takes card i + 1 (a row quantity, ``shifted[i]``, so the sum
        over the window is a difference of prefix sums), and position q takes v. When N does not
        depend on u (no repeated shapes in the class) the shifts cancel: only f -> v remains.
        """
        k, n = desc.shape
        tflat = terms.ravel()
        base = level[col] * cls.stride
        if cls.width == 1:
            out: IntArray = v * cls.table[cls.below[v] + base] - tflat[pos * n + col]
            return out
        shifted = np.zeros_like(desc)
        shifted[:-1] = desc[1:]
        gain = _prefix(shifted * self._weights(cls, shifted, level) - terms)  # gain[j]: sum over i < j
        # q + 1 = the row's cards >= v: rank v among the rows' ascending cards laid end to end
        keys = (np.arange(n) * (_FULL + 2))[:, None] + asc
        q = k - 1 - (np.searchsorted(keys.ravel(), col * (_FULL + 2) + v) - col * k)
        at_q = q * n + col
        gflat = gain.ravel()
        window: IntArray = gflat[at_q] - gflat[pos * n + col]
        window += v * cls.table[cls.below[v] + base + q] - tflat[at_q]
        return window


def _look(desc: IntArray, valid: BoolArray | None) -> IntArray:
    """``desc`` with padding cards (``~valid``) at FULL + 1, where no share is reached."""
    return desc if valid is None else np.where(valid, desc, _FULL + 1)


def _descending(asc: IntArray) -> IntArray:
    """(K, N): each row's cards in descending order, card-major, from the rows sorted ascending."""
    out: IntArray = np.ascontiguousarray(asc[:, ::-1].T)
    return out


def _prefix(parts: IntArray) -> IntArray:
    """(K + 1, X): row j sums rows 0..j-1 of ``parts`` (a loop of row adds; cumsum down axis 0 is slow)."""
    out = np.empty((parts.shape[0] + 1, parts.shape[1]), np.int64)
    out[0] = 0
    for j in range(parts.shape[0]):
        np.add(out[j], parts[j], out=out[j + 1])
    return out
