"""``gpuslice.io/gpu-telemetry``: slow-moving per-card readings the node agent publishes.

    {"v":1,"ts":"2026-11-30T01:02:03Z","cards":[{"uuid":"GPU-a","temp":41.0,"power":71.5,
     "powerLimit":300.0,"util":12.0,"memUsed":2048}]}

Readings the agent could not take are omitted. ``ts`` says how fresh the readings are, so a
reader can ignore stale ones.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

import msgspec

from gpuslice.codec import errors, instants, keys
from gpuslice.model import nodes

VERSION = 1


class _CardWire(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    uuid: str
    temp: float | None = None
    power: float | None = None
    power_limit: float | None = None
    util: float | None = None
    mem_used: int | None = None


class _Wire(msgspec.Struct, frozen=True, omit_defaults=True):
    v: int
    ts: str
    cards: list[_CardWire] = msgspec.field(default_factory=list)


class TelemetryAnnotation(msgspec.Struct, frozen=True, kw_only=True):
    """Decoded telemetry: when it was read, and per card its readings."""

    timestamp: dt.datetime
    cards: tuple[nodes.CardTelemetry, ...] = ()


_DECODER = msgspec.json.Decoder(_Wire)
_ENCODER = msgspec.json.Encoder()


def encode(cards: Iterable[nodes.CardTelemetry], now: instants.Instant) -> str:
    """The annotation value for readings taken at ``now``."""
    wire = _Wire(
        v=VERSION,
        ts=instants.format_rfc3339(now),
        cards=[
            _CardWire(
                uuid=c.uuid,
                temp=c.temperature_c,
                power=c.power_draw_w,
                power_limit=c.power_limit_w,
                util=c.utilization_pct,
                mem_used=c.memory_used_mib,
            )
            for c in cards
        ],
    )
    return _ENCODER.encode(wire).decode()


def decode(value: str) -> TelemetryAnnotation:
    """Decode the annotation.

    Raises:
        DecodeError: malformed JSON, another version or a bad timestamp.
    """
    try:
        wire = _DECODER.decode(value)
    except (msgspec.DecodeError, UnicodeError) as exc:
        raise errors.DecodeError(keys.GPU_TELEMETRY, "json", f"invalid telemetry: {exc}") from None
    if wire.v != VERSION:
        raise errors.DecodeError(keys.GPU_TELEMETRY, "v", f"unsupported telemetry version {wire.v}")
    try:
        ts = instants.parse_rfc3339(wire.ts)
    except ValueError as exc:
        raise errors.DecodeError(keys.GPU_TELEMETRY, "ts", str(exc)) from None
    return TelemetryAnnotation(
        timestamp=ts,
        cards=tuple(
            nodes.CardTelemetry(
                uuid=c.uuid,
                temperature_c=c.temp,
                power_draw_w=c.power,
                power_limit_w=c.power_limit,
                utilization_pct=c.util,
                memory_used_mib=c.mem_used,
            )
            for c in wire.cards
        ),
    )
