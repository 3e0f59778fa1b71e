"""Points in time as the codec takes them: unix seconds or an aware ``datetime``.

The codec never reads a clock; callers pass ``now`` in.
"""

from __future__ import annotations

import datetime as dt
import math

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
