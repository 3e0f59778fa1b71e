"""A card's thermal and power headroom (0..100) from the readings the node agent publishes.

Per card the mean of the readings present: temperature ``100 * clip((90 - t) / 60)`` (30 C or less =
100, 90 C or more = 0) and power ``100 * clip(1 - draw / limit)`` (when a non-zero limit is known).
None when the card has neither. ``balanced`` scores and breaks card ties with it; ``columns`` packs
it per card (NaN for None), computed by this same function, so both paths read identical floats.

Readings older than ``Context.telemetry_max_age_s`` at ``Context.now`` count as absent, as if the
node had published none (``fresh``; docs/topology.md): a node whose agent stopped must not keep
looking cool. Without a clock (``now`` None, the simulator) or a timestamp
(``NodeInventory.telemetry_at`` None) readings are taken as they are. ``stale_rows`` applies the
same rule to rows of ``columns.NodeColumns`` by their ``telemetry_at`` column.
"""

from __future__ import annotations

import numpy as np

from gpuslice.model import nodes

HOT_C, COOL_C = 90.0, 30.0


def headroom(t: nodes.CardTelemetry | None) -> float | None:
    """The card's headroom, or None without readings (module docstring)."""
    if t is None:
        return None
    vals = []
    if t.temperature_c is not None:
        vals.append(100.0 * _clip((HOT_C - t.temperature_c) / (HOT_C - COOL_C)))
    if t.power_draw_w is not None and t.power_limit_w:
        vals.append(100.0 * _clip(1.0 - t.power_draw_w / t.power_limit_w))
    if not vals:
        return None
    return vals[0] if len(vals) == 1 else (vals[0] + vals[1]) / 2


def fresh(inventory: nodes.NodeInventory, now: float | None, max_age_s: float | None) -> bool:
    """True unless the node's telemetry is older than ``max_age_s`` at ``now`` (module docstring)."""
    at = inventory.telemetry_at
    if now is None or max_age_s is None or at is None:
        return True
    return not now - at > max_age_s


def headrooms(
    state: nodes.NodeState, now: float | None = None, max_age_s: float | None = None
) -> list[float | None]:
    """Per device of the node (in order), its headroom; telemetry is matched by UUID (the last wins).

    All None when the telemetry is stale at ``now`` (``fresh``).
    """
    if not fresh(state.inventory, now, max_age_s):
        return [None] * len(state.inventory.devices)
    by_uuid = {t.uuid: t for t in state.inventory.telemetry}
    return [headroom(by_uuid.get(d.uuid)) for d in state.inventory.devices]


def stale_rows(
    telemetry_at: np.ndarray | None, rows: np.ndarray, now: float | None, max_age_s: float | None
) -> np.ndarray | None:
    """Which of ``rows`` have stale telemetry (``fresh`` per row; NaN = unknown = fresh).

    None when no row can be stale (no clock, no limit or no timestamps).
    """
    if telemetry_at is None or now is None or max_age_s is None or len(rows) == 0:
        return None
    at = telemetry_at[rows]
    with np.errstate(invalid="ignore"):
        stale: np.ndarray = (now - at) > max_age_s  # NaN compares False: fresh
    return stale if stale.any() else None


def _clip(x: float) -> float:
    return min(1.0, max(0.0, x))
