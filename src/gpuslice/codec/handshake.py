"""Node liveness: the ``hami.io/node-handshake`` check and HAMi's NVIDIA health rule.

The contract is docs/hami-compat.md section 4.2.

Both are pure: the caller passes ``now``, the node's allocatable ``nvidia.com/gpu`` and what it
remembered from the previous check, then acts on the answer (patch a fresh handshake, drop the
node's cards, re-read its registration).
"""

from __future__ import annotations

import datetime as dt
import re

import msgspec

from gpuslice.codec import instants

REQUESTING = "Requesting"
"""Prefix of the value the scheduler writes: ``Requesting_<YYYY-MM-DD HH:MM:SS>``."""
REPORTED = "Reported"
"""Prefix of the value a live device plugin (HAMi <= v2.7) writes: ``Reported <Go time>``."""
GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource whose allocatable count tells that kubelet still sees the plugin."""

HANDSHAKE_TTL = dt.timedelta(seconds=60)
"""How long a ``Requesting_`` handshake may wait before the node counts as gone."""

_DATETIME = re.compile(r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.\d+)?", re.ASCII)


class Health(msgspec.Struct, frozen=True):
    """Answer of a health check.

    Attributes:
        healthy: False = the node's cards should be dropped ("node unregistered").
        needs_update: True = write a fresh handshake / re-read the node's registration.
    """

    healthy: bool
    needs_update: bool


def requesting_value(now: instants.Instant) -> str:
    """The handshake value the scheduler writes (Go ``time.DateTime`` layout, in UTC)."""
    return f"{REQUESTING}_{instants.to_datetime(now):%Y-%m-%d %H:%M:%S}"


def requested_at(value: str) -> dt.datetime | None:
    """The time in a ``Requesting_<time>`` value, or None when it has none or it is unreadable."""
    parts = value.split("_")
    if len(parts) < 2:
        return None
    m = _DATETIME.fullmatch(parts[1])
    if m is None:
        return None
    try:
        year, month, day, hour, minute, second = (int(g) for g in m.groups())
        return dt.datetime(year, month, day, hour, minute, second, tzinfo=dt.UTC)
    except ValueError:
        return None


def handshake_health(
    value: str | None, allocatable: int, now: instants.Instant, ttl: dt.timedelta = HANDSHAKE_TTL
) -> Health:
    """HAMi's ``CheckHealth`` on the handshake annotation.

    * ``Requesting_<t>`` younger than ``ttl`` (or unreadable, or without time): healthy, wait.
    * ``Requesting_<t>`` older than ``ttl``: healthy only while kubelet still advertises cards.
    * anything else (absent, ``Reported ...``, ``Deleted_...``): healthy, write a fresh
      ``Requesting_<now>``. HAMi leaves ``Deleted_`` alone, which blocks the node for good
      (HAMi issue #1839); gpuslice requests a new handshake instead.
    """
    text = value or ""
    if REQUESTING not in text:
        return Health(healthy=True, needs_update=True)
    at = requested_at(text)
    if at is None or instants.to_datetime(now) < at + ttl:
        return Health(healthy=True, needs_update=False)
    return Health(healthy=allocatable > 0, needs_update=False)


def nvidia_health(
    allocatable: int,
    reported: int,
    handshake: str | None,
    cached_register: str | None,
    node_register: str | None,
    now: instants.Instant,
) -> Health:
    """HAMi's NVIDIA health rule, from allocatable ``nvidia.com/gpu`` and the previous check.

    Args:
        allocatable: the node's allocatable ``nvidia.com/gpu`` now (0 when absent).
        reported: the value seen at the previous check (0 when never seen).
        handshake: the handshake annotation, or None.
        cached_register: the registration text seen at the previous check, or None.
        node_register: the registration text now, or None.
        now: the current time.

    Rules: both 0 -> the handshake decides; dropped to 0 -> unhealthy; changed -> healthy,
    re-read; unchanged -> healthy, re-read only when the registration text changed.
    """
    if allocatable == 0 and reported == 0:
        return handshake_health(handshake, 0, now)
    if allocatable == 0:
        return Health(healthy=False, needs_update=False)
    if allocatable != reported:
        return Health(healthy=True, needs_update=True)
    return Health(healthy=True, needs_update=cached_register != node_register)
