"""Node registration ``hami.io/node-nvidia-register``: the card list a device plugin publishes.

Two formats (docs/hami-compat.md section 4.1):

* JSON (plugin >= v2.8): an array of objects with keys ``id, index, count, devmem, devcore,
  type, numa, mode, migProfiles, health``, every one omitted when zero.
* Legacy (plugin <= v2.7): ``{id},{count},{devmem},{devcore},{type},{numa},{health}[,{index},{mode}]:``
  per card. The error texts match HAMi's ``DecodeNodeDevices`` so logs read the same.

A value whose first non-blank character is ``[`` is JSON; anything else is the legacy format.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from gpuslice.codec import errors, goparse, keys
from gpuslice.model import devices, mig

JSON_KEYS = ("id", "index", "count", "devmem", "devcore", "type", "numa", "mode", "migProfiles", "health")
"""HAMi's field order in the JSON form."""

_LEGACY_FIELDS = (7, 9)


class _PlacementWire(msgspec.Struct, frozen=True):
    start: int | None = None
    size: int | None = None


class _ProfileWire(msgspec.Struct, frozen=True):
    """One ``migProfiles`` entry (HAMi's ``MigProfile``; ``instanceCount`` and other extras ignored)."""

    name: str | None = None
    memoryMB: int | None = None  # noqa: N815 - the wire's name
    core: int | None = None
    sliceCount: int | None = None  # noqa: N815 - the wire's name
    placements: list[_PlacementWire] | None = None


class _ProfileOut(msgspec.Struct, frozen=True):
    """One profile as HAMi encodes it: every key present (its fields have no ``omitempty``)."""

    name: str
    memoryMB: int  # noqa: N815 - the wire's name
    core: int
    sliceCount: int  # noqa: N815 - the wire's name
    placements: list[_PlacementWire] | None


class _WireIn(msgspec.Struct, frozen=True):
    """One card as decoded; Go's decoder leaves a field untouched on ``null``, so None = zero."""

    id: str | None = None
    index: int | None = None
    count: int | None = None
    devmem: int | None = None
    devcore: int | None = None
    type: str | None = None
    numa: int | None = None
    mode: str | None = None
    migProfiles: list[_ProfileWire] | None = None  # noqa: N815 - the wire's name
    health: bool | None = None


class _WireOut(msgspec.Struct, frozen=True, omit_defaults=True):
    """One card as encoded, in HAMi's key order, zero values omitted (Go's ``omitempty``)."""

    id: str = ""
    index: int = 0
    count: int = 0
    devmem: int = 0
    devcore: int = 0
    type: str = ""
    numa: int = 0
    mode: str = ""
    migProfiles: list[_ProfileOut] | None = None  # noqa: N815 - the wire's name
    health: bool = False


_JSON_DECODER = msgspec.json.Decoder(list[_WireIn])
_JSON_ENCODER = msgspec.json.Encoder()


def is_json(value: str) -> bool:
    """True when the value is the JSON form (first non-blank character ``[``)."""
    return value.lstrip().startswith("[")


def decode(value: str) -> tuple[devices.GpuDevice, ...]:
    """Decode either format into cards, in registration order.

    Raises:
        DecodeError: malformed value (``annotation`` is ``hami.io/node-nvidia-register``).
    """
    return decode_json(value) if is_json(value) else decode_legacy(value)


def _int32(value: int | None, field: str, position: int) -> int:
    if value is None:
        return 0
    if not goparse.INT32_MIN <= value <= goparse.INT32_MAX:
        raise errors.DecodeError(
            keys.NODE_REGISTER, f"[{position}].{field}", f"{field} {value} overflows int32"
        )
    return value


def decode_json(value: str) -> tuple[devices.GpuDevice, ...]:
    """Decode the JSON form; missing fields are 0, ``""`` or false (mode stays ``""``).

    Raises:
        DecodeError: not a JSON array of card objects, or a number outside int32.
    """
    try:
        wire = _JSON_DECODER.decode(value)
    except (msgspec.DecodeError, UnicodeError) as exc:
        raise errors.DecodeError(keys.NODE_REGISTER, "json", f"invalid JSON registration: {exc}") from None
    return tuple(
        devices.GpuDevice(
            uuid=w.id or "",
            index=_int32(w.index, "index", i),
            type=w.type or "",
            memory_mib=_int32(w.devmem, "devmem", i),
            cores=_int32(w.devcore, "devcore", i),
            split_count=_int32(w.count, "count", i),
            numa=_int32(w.numa, "numa", i),
            mode=w.mode or "",
            health=bool(w.health),
            mig_profiles=_profiles(w.migProfiles, i),
        )
        for i, w in enumerate(wire)
    )


def _uint32(value: int | None, where: str) -> int:
    if value is None:
        return 0
    if not 0 <= value <= 0xFFFFFFFF:
        raise errors.DecodeError(
            keys.NODE_REGISTER, where, f"{where.rsplit('.', 1)[-1]} {value} overflows uint32"
        )
    return value


def _profiles(wire: list[_ProfileWire] | None, card: int) -> tuple[mig.Profile, ...]:
    """A card's ``migProfiles``; placements of size 0 hold nothing and are dropped."""
    if not wire:
        return ()
    out: list[mig.Profile] = []
    for k, p in enumerate(wire):
        at = f"[{card}].migProfiles[{k}]"
        placements: list[mig.Placement] = []
        for j, pl in enumerate(p.placements or ()):
            start = _uint32(pl.start, f"{at}.placements[{j}].start")
            size = _uint32(pl.size, f"{at}.placements[{j}].size")
            if size > 0:
                placements.append(mig.Placement(start, size))
        out.append(
            mig.Profile(
                name=p.name or "",
                memory_mib=_int32(p.memoryMB, "memoryMB", card),
                cores=_int32(p.core, "core", card),
                slice_count=_uint32(p.sliceCount, f"{at}.sliceCount"),
                placements=tuple(placements),
            )
        )
    return tuple(out)


def encode_json(cards: Iterable[devices.GpuDevice]) -> str:
    """Encode cards as HAMi's JSON form (``[]`` for no cards)."""
    wire = [
        _WireOut(
            id=d.uuid,
            index=d.index,
            count=d.split_count,
            devmem=d.memory_mib,
            devcore=d.cores,
            type=d.type,
            numa=d.numa,
            mode=d.mode,
            migProfiles=[
                _ProfileOut(
                    p.name,
                    p.memory_mib,
                    p.cores,
                    p.slice_count,
                    [_PlacementWire(x.start, x.size) for x in p.placements] or None,
                )
                for p in d.mig_profiles
            ]
            or None,
            health=d.health,
        )
        for d in cards
    ]
    return _JSON_ENCODER.encode(wire).decode()


def _legacy_field(text: str, what: str, position: int, bits: int, func: str) -> int:
    try:
        return goparse.parse_int(text, bits, func)
    except ValueError as exc:
        raise errors.DecodeError(
            keys.NODE_REGISTER, f"[{position}].{what}", f"invalid {what} field: {exc}"
        ) from None


def decode_legacy(value: str) -> tuple[devices.GpuDevice, ...]:
    """Decode the colon format, with HAMi's checks in HAMi's order and HAMi's error texts.

    Empty segments are skipped, so ``":"`` is an empty list; a value without ``:`` is an error.

    Raises:
        DecodeError: the message starts with HAMi's text, e.g. ``unexpected field count 5``.
    """
    if ":" not in value:
        raise errors.DecodeError(keys.NODE_REGISTER, "separator", "node annotation missing device separator")
    out: list[devices.GpuDevice] = []
    for position, segment in enumerate(s for s in value.split(":") if s):
        if "," not in segment:
            raise errors.DecodeError(
                keys.NODE_REGISTER,
                f"[{position}]",
                f"malformed node annotation segment: {goparse.quote(segment)}",
            )
        items = segment.split(",")
        if len(items) not in _LEGACY_FIELDS:
            raise errors.DecodeError(
                keys.NODE_REGISTER, f"[{position}]", f"unexpected field count {len(items)} in node annotation"
            )
        count = _legacy_field(items[1], "count", position, 32, "ParseInt")
        devmem = _legacy_field(items[2], "memory", position, 32, "ParseInt")
        devcore = _legacy_field(items[3], "core", position, 32, "ParseInt")
        try:
            health = goparse.parse_bool(items[6])
        except ValueError as exc:
            raise errors.DecodeError(
                keys.NODE_REGISTER, f"[{position}].health", f"invalid health field: {exc}"
            ) from None
        numa = _legacy_field(items[5], "numa", position, 64, "Atoi")
        index, mode = 0, devices.MODE_HAMI_CORE
        if len(items) == 9:
            index = _legacy_field(items[7], "index", position, 64, "Atoi")
            if index < 0:
                raise errors.DecodeError(
                    keys.NODE_REGISTER, f"[{position}].index", f"index field must not be negative: {index}"
                )
            mode = items[8]
        out.append(
            devices.GpuDevice(
                uuid=items[0],
                index=index,
                type=items[4],
                memory_mib=devmem,
                cores=devcore,
                split_count=count,
                numa=numa,
                mode=mode,
                health=health,
            )
        )
    return tuple(out)


def encode_legacy(cards: Iterable[devices.GpuDevice]) -> str:
    """Encode cards as the 9-field colon format, each card terminated by ``:``.

    Raises:
        ValueError: a UUID, type or mode contains ``,`` or ``:`` (the format cannot carry it), or
            the value would start with ``[`` and so read back as JSON.
    """
    parts: list[str] = []
    for d in cards:
        for name, text in (("uuid", d.uuid), ("type", d.type), ("mode", d.mode)):
            if "," in text or ":" in text:
                raise ValueError(f"legacy registration cannot carry {name} {text!r} (contains ',' or ':')")
        health = goparse.format_bool(d.health)
        parts.append(
            f"{d.uuid},{d.split_count},{d.memory_mib},{d.cores},{d.type},{d.numa},{health},{d.index},{d.mode}:"
        )
    value = "".join(parts)
    if is_json(value):
        raise ValueError("legacy registration cannot start with '[' (it would read back as JSON)")
    return value
