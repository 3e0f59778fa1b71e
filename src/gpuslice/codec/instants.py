"""Points in time as the codec takes them: unix seconds or an aware ``datetime``.

The codec never reads a clock; callers pass ``now`` in.
"""

from __future__ import annotations

import datetime as dt
import math
import re

Instant = float | dt.datetime
"""Unix seconds, or a timezone-aware datetime."""


def to_datetime(now: Instant) -> dt.datetime:
    """The instant as an aware UTC datetime.

    Raises:
        ValueError: a naive datetime (its zone would be a guess) or a non-finite number.
    """
    if isinstance(now, dt.datetime):
        if now.tzinfo is None or now.utcoffset() is None:
            raise ValueError("now must be timezone-aware")
        return now.astimezone(dt.UTC)
    if not math.isfinite(now):
        raise ValueError(f"now must be finite, got {now}")
    return dt.datetime.fromtimestamp(now, dt.UTC)


def unix_seconds(now: Instant) -> int:
    """Whole unix seconds (rounded down), as HAMi writes ``vgpu-time`` and ``bind-time``."""
    return math.floor(to_datetime(now).timestamp())


_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:(Z)|([+-])(\d{2}):(\d{2}))",
    re.ASCII,
)


def parse_rfc3339(text: str) -> dt.datetime:
    """Parse an RFC 3339 time as Go's ``time.Parse(time.RFC3339, ...)`` accepts it.

    Fractional seconds are allowed (truncated to microseconds); the zone is ``Z`` or ``+hh:mm``.

    Raises:
        ValueError: anything else (date-only, missing zone, out-of-range fields).
    """
    m = _RFC3339.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r} is not an RFC 3339 time")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    micro = int((m[7] or "0")[:6].ljust(6, "0"))
    if m[8]:
        zone = dt.UTC
    else:
        oh, om = int(m[10]), int(m[11])
        if oh > 23 or om > 59:
            raise ValueError(f"{text!r} has an invalid zone offset")
        offset = dt.timedelta(hours=oh, minutes=om)
        zone = dt.timezone(-offset if m[9] == "-" else offset)
    try:
        return dt.datetime(year, month, day, hour, minute, second, micro, tzinfo=zone)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not an RFC 3339 time: {exc}") from None


def format_rfc3339(now: Instant) -> str:
    """Whole seconds in UTC with a ``Z`` suffix (Go's ``time.RFC3339`` of a UTC time)."""
    return to_datetime(now).strftime("%Y-%m-%dT%H:%M:%SZ")
