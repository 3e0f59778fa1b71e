"""Walk a ``Backend`` once and gather its plain records, turning per-call failures into notes.

A whole-NVML failure (no library, no driver) raises ``backend.BackendError`` from ``gpus()``;
anything narrower (one card's NVLink query, one pair) is recorded as a note and the rest of the
inventory is kept, so the agent publishes what it knows.
"""

from __future__ import annotations

import msgspec

from gpuslice.agent import backend


class Records(msgspec.Struct, frozen=True, kw_only=True):
    """Everything NVML said about a node's cards, unprocessed.

    Attributes:
        gpus: cards by index.
        nvlinks: active links per card, parallel to ``gpus`` (empty where the query failed).
        pairs: one record per ordered pair (a != b) that NVML answered.
        notes: what could not be read, in words.
    """

    gpus: tuple[backend.GpuRecord, ...] = ()
    nvlinks: tuple[tuple[backend.NvLinkRecord, ...], ...] = ()
    pairs: tuple[backend.PairRecord, ...] = ()
    notes: tuple[str, ...] = ()


def inventory(nvml: backend.Backend) -> Records:
    """Read cards, links and pairs; raises ``BackendError`` only when the card list fails."""
    gpus = nvml.gpus()
    notes: list[str] = []
    links: list[tuple[backend.NvLinkRecord, ...]] = []
    for g in gpus:
        try:
            links.append(nvml.nvlinks(g.index))
        except backend.BackendError as e:
            notes.append(f"GPU {g.index}: NVLink query failed ({e.reason}: {e}); assuming no NVLink")
            links.append(())
    pairs: list[backend.PairRecord] = []
    for a in gpus:
        for b in gpus:
            if a.index == b.index:
                continue
            try:
                pairs.append(nvml.pair(a.index, b.index))
            except backend.BackendError as e:
                notes.append(f"GPU {a.index}->{b.index}: topology query failed ({e.reason}: {e})")
    return Records(gpus=gpus, nvlinks=tuple(links), pairs=tuple(pairs), notes=tuple(notes))


def telemetry(
    nvml: backend.Backend, gpus: tuple[backend.GpuRecord, ...]
) -> tuple[backend.TelemetryRecord, ...]:
    """Current readings of every card; a card that fails entirely is left out."""
    out: list[backend.TelemetryRecord] = []
    for g in gpus:
        try:
            out.append(nvml.telemetry(g.index))
        except backend.BackendError:
            continue
    return tuple(out)
