"""``balanced``: a weighted multi-dimensional node score.

The pod is placed with ``fit.place`` (this policy's card choice: the emptiest cards by weighted
usage, as ``spread``; ties to the cooler card, then the lower index). With S the chosen cards
(all containers), usage ``u_i = 0.6 * memory_ratio + 0.4 * cores_ratio`` of every card *after*
placement, the score is ``floor(0.4 * U + 0.3 * A + 0.2 * T + 0.1 * F)`` where, each on 0..100:

* U, utilisation balance: ``100 * (1 - 2 * std(u))`` over the node's cards (population std; the
  largest std of values in [0, 1] is 0.5), clipped to 0..100. One card: 100.
* A, task affinity: pods of the same job close together (the design document's meaning). A pod's
  job is ``Context.job`` (its controller owner reference, or a configured label:
  ``requests.PodRequest.job``), and ``Context.job_nodes`` says where the job's other pods are
  (``nodes.NodeState.jobs``, indexed by job in the extender's cache snapshot). When the job has
  placed pods: 0 on a node holding none of them; on a node holding some, ``50 + 50 * close / |S|``
  where a chosen card is close when the job already holds it or it shares an NVLink with a card
  the job holds (``linktables`` p2p 100); every card is close on a node without a topology, or
  when the job's pods there hold no card (same node is the closest known). Without a job, or for
  a job's first pod (nothing to be close to; the simulator's pods, which have no job), like joins
  like, as before: a fractional request (cores < 100 and memory below the whole card) scores the
  share of S already in use before placement (fractional tasks share cards and leave idle cards
  whole); a whole-card request scores the share of the node's other cards that are held exclusively
  (whole-card tasks gather on the same nodes); 100 when S is the whole node.
* T, thermal and power headroom of S from ``inventory.telemetry``: per card the mean of the
  readings present, temperature ``100 * clip((90 - t) / 60)`` (30 C or less = 100, 90 C or more = 0)
  and power ``100 * clip(1 - draw / limit)``; mean over cards with readings; 50 when none has any.
  Readings older than ``Context.telemetry_max_age_s`` at ``Context.now`` count as none
  (``thermal.fresh``; per row of the columns by ``NodeColumns.telemetry_at``).
* F, memory fragmentation: ``100 * (1 - stranded / |S|)``, where a chosen card is stranded when
  its free memory after placement is above 0 but below 10 % of the card (a sliver nobody can use).

``score_columns`` gives the same integer for many rows of ``columns.NodeColumns`` (the batch
filter's fast path). The score is ``floor`` of a float sum, so the two paths must agree to the last
bit: both evaluate the same IEEE-754 operations in the same order on the same operands. Sums run
left to right card by card (an explicit loop here, one array addition per card position there;
not Python's ``sum``, which compensates rounding on Python >= 3.12, nor numpy's pairwise
``sum``); squares are ``d * d`` (not ``** 2``, which goes through ``pow``); integers below 2**53
convert to floats exactly, and division, ``sqrt`` and ``floor`` are correctly rounded in both. The
per-card headroom is computed once by ``thermal.headroom`` for both paths (``columns.heads``). The
card choice is reproduced from the same float keys: the smallest usage after the request, then the
larger headroom (50 without readings), then the lower index. One shortcut, exact by construction: an
eligible card has room for the request, so its ratios after placement are at most 1 and the
``min(1, .)`` of ``usage`` is skipped there; rows with a card that registers no memory or no cores
take ``usage``'s guarded form.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from gpuslice.model import allocations, devices, nodes, requests
from gpuslice.policy import api, cards, columns, fit, linktables, thermal, usage, vectorfit

W_BALANCE, W_AFFINITY, W_THERMAL, W_FRAGMENTATION = 0.4, 0.3, 0.2, 0.1
NEUTRAL = 50.0
HOT_C, COOL_C = thermal.HOT_C, thermal.COOL_C
STRANDED_FRACTION = 0.10
_TM, _UM, _TC, _UC, _SLOTS = (
    columns.CARD_FIELDS.index(f) for f in ("total_mem", "used_mem", "total_cores", "used_cores", "used_slots")
)
_NO_HEADS = np.empty((0, 0), np.float64)  # ``_score_rows`` without readings: never read
_NCARDS, _NOCAP, _HEAD_CARDS, _LINKS_ID = (
    columns.ROW_FIELDS.index(f) for f in ("ncards", "nocap_cards", "head_cards", "links_id")
)


class Balanced:
    """See the module docstring."""

    name = "balanced"
    idle_only = False
    learns_workload = False

    def __init__(self, args: Mapping[str, float]) -> None:
        """Validate the (empty) args."""
        if args:
            raise ValueError(f"balanced takes no args, got {sorted(args)}")

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: api.Context,
    ) -> tuple[int, ...] | None:
        """The emptiest eligible cards after the request; ties to the cooler card, then index."""
        heads = thermal.headrooms(state, ctx.now, ctx.telemetry_max_age_s)
        wm, wc = usage.DEFAULT_MEMORY_WEIGHT, usage.DEFAULT_CORES_WEIGHT
        cool = [NEUTRAL if h is None else h for h in heads]
        ranked = sorted(eligible, key=lambda i: (usage.card_key(state, i, request, wm, wc), -cool[i], i))
        return tuple(ranked[: request.count])

    def score_node(self, state: nodes.NodeState, pod: requests.PodRequest, ctx: api.Context) -> api.Scored:
        """The weighted score of the node after placing the pod."""
        placed = fit.place(state, pod, self, ctx)
        if placed.allocation is None:
            return api.Scored(0)
        return api.Scored(components(state, pod, placed.allocation, ctx)[-1])

    def score_columns(
        self,
        cols: columns.NodeColumns,
        rows: columns.IntArray,
        pod: requests.PodRequest,
        ctx: api.Context = api.EMPTY_CONTEXT,
    ) -> columns.IntArray:
        """``score_node`` for many rows of a pod ``vectorfit`` can judge (module docstring)."""
        req = vectorfit.request_of(pod, None)
        if req is None:
            raise ValueError("score_columns needs a pod with one GPU container (see vectorfit.request_of)")
        return _score_rows(cols, rows, pod, req, ctx)


def components(
    state: nodes.NodeState,
    pod: requests.PodRequest,
    alloc: allocations.PodAllocation,
    ctx: api.Context = api.EMPTY_CONTEXT,
) -> tuple[float, float, float, float, int]:
    """(U, A, T, F, score) for a placement (exposed for tests and explanations)."""
    after = allocations.apply(state, alloc)
    devs = state.inventory.devices
    index = {d.uuid: i for i, d in enumerate(devs)}
    chosen = sorted({index[g.uuid] for c in alloc.containers for g in c if g.uuid in index})
    if not devs or not chosen:
        return (100.0, NEUTRAL, NEUTRAL, 100.0, api.MAX_SCORE)
    wm, wc = usage.DEFAULT_MEMORY_WEIGHT, usage.DEFAULT_CORES_WEIGHT
    u = [_card_usage(d, after.usage[i], wm, wc) for i, d in enumerate(devs)]
    mean = _sum(u) / len(u)
    std = math.sqrt(_sum([(x - mean) * (x - mean) for x in u]) / len(u))
    balance = min(100.0, max(0.0, 100.0 * (1.0 - 2.0 * std)))
    job = _job_affinity(ctx, state, tuple(chosen))
    affinity = _affinity(state, pod, chosen) if job is None else job
    heads = thermal.headrooms(state, ctx.now, ctx.telemetry_max_age_s)
    readings = [h for i in chosen if (h := heads[i]) is not None]
    heat = _sum(readings) / len(readings) if readings else NEUTRAL
    stranded = sum(1 for i in chosen if 0 < after.free_memory(i) < STRANDED_FRACTION * devs[i].memory_mib)
    frag = 100.0 * (1.0 - stranded / len(chosen))
    total = W_BALANCE * balance + W_AFFINITY * affinity + W_THERMAL * heat + W_FRAGMENTATION * frag
    return (balance, affinity, heat, frag, min(api.MAX_SCORE, math.floor(total + 1e-9)))


def _sum(xs: list[float]) -> float:
    """Left-to-right float sum (what ``_score_rows`` does column by column)."""
    acc = 0.0
    for x in xs:
        acc += x
    return acc


def _ratios(used: np.ndarray, total: np.ndarray) -> np.ndarray:
    """``usage._ratio`` elementwise: ``min(1, used / total)``, 0 where the capacity is 0."""
    pos = total > 0
    out: np.ndarray = np.where(pos, np.minimum(1.0, used / np.where(pos, total, 1)), 0.0)
    return out


def _seq_sum(a: np.ndarray) -> np.ndarray:
    """Per row, the left-to-right sum of the columns (``_sum`` of each row)."""
    acc = a[:, 0].copy()
    for j in range(1, a.shape[1]):
        acc += a[:, j]
    return acc


def _score_rows(
    cols: columns.NodeColumns,
    rows: columns.IntArray,
    pod: requests.PodRequest,
    req: requests.ContainerRequest,
    ctx: api.Context = api.EMPTY_CONTEXT,
) -> columns.IntArray:
    """``score_node`` of every row: ``fit.place`` with this policy's card choice, then ``components``.

    Meant for rows the filter passed: host CPU and memory are not checked again, and a row with fewer
    than ``req.count`` eligible cards scores 0, as ``score_node`` does when ``fit.place`` fails.
    """
    n_rows = len(rows)
    if n_rows == 0 or req.count > cols.cards.shape[1]:  # no row has that many cards
        return np.zeros(n_rows, np.int64)
    ok = vectorfit.eligible_cards(cols, rows, pod, req)
    c = cols.cards[rows]
    tm, um, tc, uc = c[:, :, _TM], c[:, :, _UM], c[:, :, _TC], c[:, :, _UC]
    node = cols.nodes[rows]
    ncards = node[:, _NCARDS]
    k = c.shape[1]
    count = req.count
    idx = np.arange(n_rows)
    fixed = req.memory_mib > 0 or req.memory_percentage == requests.MEMORY_PERCENTAGE_UNSET
    # MiB the request takes on each card (req.memory_on), as floats (exact below 2**53)
    gm: float | np.ndarray = (
        float(req.memory_mib) if fixed else tm.astype(np.int64) * req.memory_percentage // 100
    )
    cores = float(req.cores_clamped)
    wm, wc = usage.DEFAULT_MEMORY_WEIGHT, usage.DEFAULT_CORES_WEIGHT
    # Every card's usage now, and with the request on it (the card key; it is the card's usage
    # after placement when chosen). An eligible card has room for the request, so its ratios are
    # at most 1 and ``min(1, .)`` is the identity there; key values of other cards are never read.
    if node[:, _NOCAP].any():  # a card without memory or cores: usage._ratio's guard, elementwise
        key = wm * _ratios(um + gm, tm) + wc * _ratios(uc + cores, tc)
        now = wm * _ratios(um, tm) + wc * _ratios(uc, tc)
    else:  # only padding cards lack capacity: 0 / 1 = 0 keeps their usage 0
        tmf, tcf = np.maximum(tm, 1), np.maximum(tc, 1)
        key = wm * ((um + gm) / tmf) + wc * ((uc + cores) / tcf)
        now = wm * np.minimum(1.0, um / tmf) + wc * np.minimum(1.0, uc / tcf)
    masked = np.where(ok, key, np.inf)
    readings = bool(node[:, _HEAD_CARDS].any())
    # per row and card, gathered only when some row has readings (nothing reads it otherwise);
    # stale telemetry counts as none (thermal.fresh, by the rows' ``telemetry_at``)
    heads = cols.heads[rows] if readings else _NO_HEADS
    if readings and ctx.now is not None:
        stale = thermal.stale_rows(cols.telemetry_at, rows, ctx.now, ctx.telemetry_max_age_s)
        if stale is not None:
            heads[stale] = np.nan
            readings = not bool(np.isnan(heads).all())
    picks = _choose(heads, masked, count, readings)  # (count, rows) card positions, ascending
    at = (idx[None, :], picks)  # the chosen cards, (count, rows)
    placeable = ok[at].all(axis=0)
    u = now
    u[at] = key[at]
    # U: population std of every card's usage after placement
    n_f = np.maximum(ncards, 1).astype(np.float64)
    mean = _seq_sum(u) / n_f
    sq = u - mean[:, None]
    sq *= sq
    if int(ncards.min()) < k:
        sq[np.arange(k) >= ncards[:, None]] = 0.0  # padding cards are no cards
    std = np.sqrt(_seq_sum(sq) / n_f)
    balance = np.minimum(100.0, np.maximum(0.0, 100.0 * (1.0 - 2.0 * std)))
    # per chosen card (in card order): in use before, memory left after, headroom
    sel = c[at]  # (count, rows, fields)
    t = sel[:, :, _TM].astype(np.int64)
    left = t - (sel[:, :, _UM] + (gm if isinstance(gm, float) else gm[at]))
    in_use = (sel[:, :, _SLOTS] > 0).sum(axis=0)
    stranded = ((left > 0) & (left < STRANDED_FRACTION * t)).sum(axis=0)
    # A: a fractional request joins cards in use; a whole-card one joins cards held exclusively
    first_mem = t[0]
    first_grant = req.memory_mib if fixed else first_mem * req.memory_percentage // 100
    whole = (first_grant >= first_mem) | req.exclusive  # _whole_card on the first chosen card
    affinity = 100.0 * in_use / count
    if whole.any():
        held = (tc > 0) & (uc >= tc)
        held_others = held.sum(axis=1) - held[at].sum(axis=0)
        others = ncards - count
        whole_aff = np.where(others > 0, 100.0 * held_others / np.maximum(others, 1), 100.0)
        affinity = np.where(whole, whole_aff, affinity)
    if ctx.job and ctx.job_nodes:  # the pod's job has placed pods: gather them
        affinity = _job_affinity_rows(cols, rows, picks, ctx)
    # T: mean headroom of the chosen cards with readings (summed in card order), NEUTRAL without any
    heat: float | np.ndarray = NEUTRAL
    if readings:
        h = heads[idx[None, :], picks]
        has = ~np.isnan(h)
        nread = has.sum(axis=0)
        hv = np.where(has, h, 0.0)
        heat_sum = hv[0].copy()
        for j in range(1, count):
            heat_sum += hv[j]
        heat = np.where(nread > 0, heat_sum / np.maximum(nread, 1), NEUTRAL)
    # F: chosen cards left with a sliver (0 < free < 10 % of the card) of memory
    frag = 100.0 * (1.0 - stranded / count)
    total = W_BALANCE * balance + W_AFFINITY * affinity + W_THERMAL * heat + W_FRAGMENTATION * frag
    out: columns.IntArray = np.minimum(api.MAX_SCORE, np.floor(total + 1e-9)).astype(np.int64)
    out[~placeable] = 0
    return out


def _choose(heads: np.ndarray, masked: np.ndarray, count: int, readings: bool) -> np.ndarray:
    """Per row the ``count`` cards ``choose_cards`` takes, as a (count, rows) array in card order.

    The order is the key (``masked``: inf for ineligible cards), then the larger headroom (NEUTRAL
    without readings; ``heads`` per row and card), then the lower index. One card: the first
    smallest key (argmin returns the first occurrence), and among several cards at it the first
    largest headroom. More cards: a
    stable sort by key (ties by index); only where the cards at the last chosen key reach past
    the cut does the headroom decide which of them go in (one lexsort over those rows). Without
    any ``readings`` in these rows the index alone breaks ties.
    """
    n_rows, k = masked.shape
    if count == 1:
        pick = masked.argmin(axis=1)
        if readings:
            idx = np.arange(n_rows)
            tie = masked == masked[idx, pick][:, None]
            if np.count_nonzero(tie) > n_rows:  # several cards at some row's smallest key
                pick = np.where(tie, np.where(np.isnan(heads), NEUTRAL, heads), -np.inf).argmax(axis=1)
        out: np.ndarray = pick[None, :]
        return out
    order = np.argsort(masked, axis=1, kind="stable")
    picks = order[:, :count]
    if readings and count < k:
        idx = np.arange(n_rows)
        last, after = masked[idx, order[:, count - 1]], masked[idx, order[:, count]]
        cut = np.flatnonzero((last == after) & (last < np.inf))
        if len(cut):
            cut_heads = heads[cut]
            cool = np.where(np.isnan(cut_heads), NEUTRAL, cut_heads)
            picks[cut] = np.lexsort((-cool, masked[cut]), axis=1)[:, :count]
    if count == 2:
        a, b = picks[:, 0], picks[:, 1]
        return np.stack((np.minimum(a, b), np.maximum(a, b)))
    out = np.sort(picks, axis=1).T
    return out


def _close(tables: linktables.LinkTables, held: tuple[int, ...], chosen: tuple[int, ...] | list[int]) -> int:
    """How many chosen cards the job holds or reaches over NVLink from a card it holds."""
    if not held or not tables.known:
        return len(chosen)
    hs = set(held)
    return sum(
        1 for i in chosen if i in hs or any(tables.p2p[i][h] == 100 for h in held if h < len(tables.p2p))
    )


def _job_score(close: int, count: int) -> float:
    """A on a node holding pods of the job (module docstring); one formula for both paths."""
    return 50.0 + 50.0 * (close / count)


def _job_affinity(ctx: api.Context, state: nodes.NodeState, chosen: tuple[int, ...]) -> float | None:
    """A by the pod's job, or None when like-joins-like applies (no job, or its first pod)."""
    if not ctx.job or not ctx.job_nodes:
        return None
    on = ctx.job_nodes.get(state.name)
    if on is None:
        return 0.0
    return _job_score(_close(linktables.of(state.inventory), on.cards, chosen), len(chosen))


def _job_affinity_rows(
    cols: columns.NodeColumns, rows: columns.IntArray, picks: np.ndarray, ctx: api.Context
) -> np.ndarray:
    """``_job_affinity`` of every row: 0 except on the (few) rows of nodes holding the job's pods."""
    out = np.zeros(len(rows), np.float64)
    names = list(ctx.job_nodes)
    job_rows = cols.rows(names)
    by_row = {int(r): ctx.job_nodes[n] for r, n in zip(job_rows.tolist(), names, strict=True) if r >= 0}
    if not by_row:
        return out
    count = picks.shape[0]
    for t in np.flatnonzero(np.isin(rows, np.fromiter(by_row, np.int64))).tolist():
        tables = cols.links[int(cols.nodes[rows[t], _LINKS_ID])]
        chosen = [int(i) for i in picks[:, t]]
        out[t] = _job_score(_close(tables, by_row[int(rows[t])].cards, chosen), count)
    return out


def _card_usage(d: devices.GpuDevice, u: nodes.CardUsage, wm: float, wc: float) -> float:
    mem = 0.0 if d.memory_mib <= 0 else min(1.0, u.memory_mib / d.memory_mib)
    cores = 0.0 if d.cores <= 0 else min(1.0, u.cores / d.cores)
    return wm * mem + wc * cores


def _whole_card(pod: requests.PodRequest, card_memory: int) -> bool:
    gpu = [c for c in pod.containers if c is not None and c.count > 0]
    return bool(gpu) and all(c.exclusive or c.memory_on(card_memory) >= card_memory for c in gpu)


def _affinity(state: nodes.NodeState, pod: requests.PodRequest, chosen: list[int]) -> float:
    devs = state.inventory.devices
    if not _whole_card(pod, devs[chosen[0]].memory_mib):
        return 100.0 * sum(1 for i in chosen if state.usage[i].slots > 0) / len(chosen)
    others = [i for i in range(len(devs)) if i not in chosen]
    if not others:
        return 100.0
    held = sum(1 for i in others if cards.held_exclusively(devs[i], state.usage[i]))
    return 100.0 * held / len(others)


FACTORIES: Mapping[str, api.PolicyFactory] = {"balanced": Balanced}
"""The policies this module defines, by registry name (``framework.registry`` collects them)."""
