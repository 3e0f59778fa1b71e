"""A card's thermal and power headroom (0..100) from the readings the node agent publishes.

Per card the mean of the readings present: temperature ``100 * clip((90 - t) / 60)`` (30 C or less =
100, 90 C or more = 0) and power ``100 * clip(1 - draw / limit)`` (when a non-zero limit is known).
None when the card has neither. ``balanced`` scores and breaks card ties with it; ``columns`` packs
it per card (NaN for None), computed by this same function, so both paths read identical floats.
"""

from __future__ import annotations

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


def headrooms(state: nodes.NodeState) -> list[float | None]:
    """Per device of the node (in order), its headroom; telemetry is matched by UUID (the last wins)."""
    by_uuid = {t.uuid: t for t in state.inventory.telemetry}
    return [headroom(by_uuid.get(d.uuid)) for d in state.inventory.devices]


def _clip(x: float) -> float:
    return min(1.0, max(0.0, x))
