"""The filter's card checks as numpy expressions over many nodes (the kernel behind ``batch``).

It handles pods with exactly one GPU container (and no GPU init containers), any selectors except
UUID lists and ``numa_bind``, and a namespace quota unless the request is a memory percentage.
For those pods ``judge`` returns, per row, exactly what ``fit.place`` decides: feasibility, and for
infeasible rows a packed outcome key that ``decode`` turns into the same status and card reasons.

Card codes follow ``cards`` and ``fit`` order: absent (padding, not counted), then one code per
reason in ``CARD_REASONS``. A key packs 5 bits per reason count (nodes of < 32 cards), then the
node-level kind (4 bits), then the 'fits the emptied node' bit (UNSCHEDULABLE vs UNRESOLVABLE).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from gpuslice.model import devices, requests, status
from gpuslice.policy import cards, columns, fit, linkreq
from gpuslice.policy import quota as quotas

IntArray = columns.IntArray

CARD_REASONS = (
    status.DEVICE_UNHEALTHY,
    status.DEVICE_CORDONED,
    status.DEVICE_TYPE_MISMATCH,
    status.NUMA_UNSATISFIED,
    status.GPU_SLOTS_EXHAUSTED,
    status.EXCLUSIVE_CONFLICT,
    status.INSUFFICIENT_GPU_MEMORY,
    status.INSUFFICIENT_GPU_CORES,
    status.QUOTA_EXCEEDED,
)
_OK, _ABSENT, _UNHEALTHY, _CORDONED, _TYPE, _NUMA, _SLOTS, _EXCLUSIVE, _MEMORY, _CORES, _QUOTA = range(11)
_NCODES = 11
_FLAG_CODE = np.full(max(columns.HELD, columns.SHARED) + 1, _OK, np.int64)
_FLAG_CODE[[columns.ABSENT, columns.UNHEALTHY, columns.CORDONED, columns.SLOTS_FULL]] = [
    _ABSENT,
    _UNHEALTHY,
    _CORDONED,
    _SLOTS,
]
# HELD (all cores taken) starts at _OK: its reason depends on the request (memory, then cores, then
# the exclusive rule), as in ``cards.capacity_reason``.
MAX_CARDS = 31
"""Nodes with more cards than this go through ``fit.place`` (the key has 5 bits per count)."""
_BITS = 5
_KIND_SHIFT = _BITS * len(CARD_REASONS)
_RESOLVABLE_BIT = _KIND_SHIFT + 4
_SHIFTS = np.arange(len(CARD_REASONS), dtype=np.int64) * _BITS
K_CARDS, K_CPU, K_HMEM, K_UNREG, K_COUNT = range(5)
_KIND_REASON = {
    K_CPU: status.INSUFFICIENT_CPU,
    K_HMEM: status.INSUFFICIENT_HOST_MEMORY,
    K_UNREG: status.NODE_UNREGISTERED,
    K_COUNT: status.INSUFFICIENT_GPU_COUNT,
}
_ORDER = {r: k for k, r in enumerate(status.ALL_REASONS)}
_I32 = 2**31 - 1
_TOTAL_MEM, _TYPE_ID, _MODE_ID, _NUMA_F = (
    columns.CARD_FIELDS.index(f) for f in ("total_mem", "type_id", "mode_id", "numa")
)
_NCARDS, _CPU_TOTAL, _CPU_USED, _HMEM_TOTAL, _HMEM_USED = (
    columns.ROW_FIELDS.index(f) for f in ("ncards", "cpu_total", "cpu_used", "hmem_total", "hmem_used")
)


def request_of(pod: requests.PodRequest, quota: quotas.QuotaView | None) -> requests.ContainerRequest | None:
    """The one GPU request when the kernel can judge the pod, else None.

    None also for a pod whose link requirement restricts a container (``linkreq.active``): the
    kernel does not know card pairs, so such a pod is judged by ``fit.place`` node by node.
    """
    if linkreq.active(pod):
        return None
    sel = pod.selectors
    if sel is not requests.NO_SELECTORS and (sel.use_uuids or sel.nouse_uuids or sel.numa_bind):
        return None
    found: requests.ContainerRequest | None = None
    for position, c in enumerate(pod.containers):
        if c is None or c.count <= 0:
            continue
        if position < pod.init_count or found is not None:
            return None
        found = c
    if found is not None and quota is not None and not quota.unlimited and _percentage(found):
        return None
    return found


def _percentage(req: requests.ContainerRequest) -> bool:
    return not (req.memory_mib > 0 or req.memory_percentage == requests.MEMORY_PERCENTAGE_UNSET)


class _Masks(NamedTuple):
    hot: np.ndarray
    ok: np.ndarray
    static_ok: np.ndarray | None
    numa_ok: np.ndarray | None
    mem: np.ndarray | int


def _masks(
    cols: columns.NodeColumns,
    rows: IntArray,
    pod: requests.PodRequest,
    req: requests.ContainerRequest,
    idle_only: bool = False,
) -> _Masks:
    """Per-card eligibility (before quota) and the selector masks it used."""
    hot = cols.hot[rows]
    flag, free_mem, free_cores = hot[:, :, 0], hot[:, :, 1], hot[:, :, 2]
    pct = _percentage(req)
    mem: np.ndarray | int = (
        hot[:, :, 3].astype(np.int64) * req.memory_percentage // 100 if pct else min(req.memory_mib, _I32)
    )
    cores = req.cores_clamped
    # HELD cards are never eligible: a request with cores finds none free, one without is refused.
    ok = (flag == columns.FREE) if idle_only else (flag < columns.BLOCKED)
    if cores >= devices.FULL_CORES:
        ok &= (flag == columns.FREE) | (hot[:, :, 4] != devices.FULL_CORES)
    ok &= (free_mem >= mem) & (free_cores >= cores)
    sel = pod.selectors
    static_ok: np.ndarray | None = None
    numa_ok: np.ndarray | None = None
    if sel is not requests.NO_SELECTORS and sel != requests.NO_SELECTORS:
        c = cols.cards[rows]
        if sel.use_types or sel.nouse_types or sel.mode is not None:
            allowed_types = np.array([cards.type_matches(t, sel) for t in cols.types] or [True], np.bool_)
            allowed_modes = np.array(
                [cards.mode_matches(m, sel.mode) for m in cols.modes] or [True], np.bool_
            )
            static_ok = allowed_types[c[:, :, _TYPE_ID]] & allowed_modes[c[:, :, _MODE_ID]]
            ok &= static_ok
        if sel.numa_node is not None:
            numa_ok = c[:, :, _NUMA_F] == sel.numa_node
            ok &= numa_ok
    return _Masks(hot, ok, static_ok, numa_ok, mem)


def eligible_cards(
    cols: columns.NodeColumns,
    rows: IntArray,
    pod: requests.PodRequest,
    req: requests.ContainerRequest,
    idle_only: bool = False,
) -> np.ndarray:
    """(rows, K) True where ``fit`` would find the card eligible for ``req`` (quota aside)."""
    return _masks(cols, rows, pod, req, idle_only).ok


def judge(
    cols: columns.NodeColumns,
    rows: IntArray,
    pod: requests.PodRequest,
    req: requests.ContainerRequest,
    quota: quotas.QuotaView | None,
    idle_only: bool = False,
) -> tuple[np.ndarray, IntArray]:
    """Feasibility of the rows, and for infeasible rows the packed outcome key (0 elsewhere).

    ``idle_only`` is the card policy's ``mutex`` filter (``registry.idle_only``).
    """
    hot, ok, static_ok, numa_ok, mem = _masks(cols, rows, pod, req, idle_only)
    node = cols.nodes[rows]
    cores = req.cores_clamped
    q = quota if quota is not None and not quota.unlimited else None
    quota_ok = q is None or q.admits(req.count, req.count * int(mem), req.count * cores)
    if not quota_ok:
        ok &= False
    eligible = ok.sum(axis=1)
    ncards = node[:, _NCARDS]
    cpu_total = node[:, _CPU_TOTAL]
    hmem_total = node[:, _HMEM_TOTAL]
    kind = np.full(len(rows), K_CARDS, np.int64)
    kind[ncards < req.count] = K_COUNT
    if pod.memory_mib > 0:
        kind[(hmem_total > 0) & (pod.memory_mib > hmem_total - node[:, _HMEM_USED])] = K_HMEM
    if pod.cpu_milli > 0:
        kind[(cpu_total > 0) & (pod.cpu_milli > cpu_total - node[:, _CPU_USED])] = K_CPU
    kind[ncards == 0] = K_UNREG
    feasible = (kind == K_CARDS) & (eligible >= req.count)
    keys = np.zeros(len(rows), np.int64)
    bad = np.flatnonzero(~feasible)
    if len(bad) == 0:
        return feasible, keys
    # Per-card codes of the infeasible rows; each check only fills cards still at _OK.
    h = hot[bad]
    bflag = h[:, :, 0]
    bmem = mem[bad] if isinstance(mem, np.ndarray) else mem
    code = _FLAG_CODE[bflag]
    static = (code == _UNHEALTHY) | (code == _CORDONED) | (code == _ABSENT)
    open_ = ~static
    if static_ok is not None:
        miss = open_ & ~static_ok[bad]
        code[miss] = _TYPE
        open_ &= ~miss
    if numa_ok is not None:
        miss = open_ & ~numa_ok[bad]
        code[miss] = _NUMA
        open_ &= ~miss
    # slots were set from the flag; the rest in ``cards.capacity_reason`` order, only where still _OK
    used = (bflag == columns.SHARED) | (bflag == columns.HELD)
    if idle_only:
        code[(code == _OK) & used] = _EXCLUSIVE
    code[(code == _OK) & (h[:, :, 1] < bmem)] = _MEMORY
    code[(code == _OK) & (h[:, :, 2] < cores)] = _CORES
    if cores >= devices.FULL_CORES:
        code[(code == _OK) & used & (h[:, :, 4] == devices.FULL_CORES)] = _EXCLUSIVE
    if cores == 0:
        code[(code == _OK) & (bflag == columns.HELD)] = _EXCLUSIVE
    if not quota_ok:
        code[code == _OK] = _QUOTA
    nb = len(bad)
    counts = np.bincount((code + np.arange(nb)[:, None] * _NCODES).ravel(), minlength=nb * _NCODES)
    counts = counts.reshape(nb, _NCODES)[:, _UNHEALTHY:]
    key = (counts << _SHIFTS).sum(axis=1) | (kind[bad] << _KIND_SHIFT)
    idle_ok = (h[:, :, 5] == 1) & (h[:, :, 3] >= bmem) & (h[:, :, 4] >= cores)
    if static_ok is not None:
        idle_ok &= static_ok[bad]
    if numa_ok is not None:
        idle_ok &= numa_ok[bad]
    ct, ht = cpu_total[bad], hmem_total[bad]
    resolvable = (
        (idle_ok.sum(axis=1) >= req.count)
        & ((ct <= 0) | (pod.cpu_milli <= ct))
        & ((ht <= 0) | (pod.memory_mib <= ht))
    )
    if q is not None and not q.cleared().admits(req.count, req.count * int(mem), req.count * cores):
        resolvable[:] = False
    keys[bad] = key | (resolvable.astype(np.int64) << _RESOLVABLE_BIT)
    return feasible, keys


@functools.lru_cache(maxsize=4096)
def decode(key: int) -> tuple[status.Status, fit.CardReasons]:
    """The status and card reasons a packed outcome key stands for (as ``fit.place`` builds them)."""
    code = status.Code.UNSCHEDULABLE if key >> _RESOLVABLE_BIT & 1 else status.Code.UNRESOLVABLE
    kind = key >> _KIND_SHIFT & 0xF
    if kind != K_CARDS:
        return status.Status(code, (_KIND_REASON[kind],)), ()
    mask = (1 << _BITS) - 1
    counts = [(r, (key >> (_BITS * j)) & mask) for j, r in enumerate(CARD_REASONS)]
    ordered = tuple(sorted(((r, c) for r, c in counts if c > 0), key=lambda rc: _ORDER[rc[0]]))
    top = max(c for _, c in ordered)
    return status.Status(code, tuple(r for r, c in ordered if c == top)), ordered
