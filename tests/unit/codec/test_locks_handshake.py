"""Node lock values and the handshake/health rules, with ``now`` injected."""

from __future__ import annotations

import datetime as dt

import pytest

from gpuslice.codec import errors, handshake, keys, locks

pytestmark = pytest.mark.unit

T0 = dt.datetime(2026, 6, 14, 15, 5, 3, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)


def test_encode_matches_hami_example() -> None:
    assert locks.encode(T0, "default", "gang-pod-1") == "2026-06-14T15:05:03Z,default,gang-pod-1"
    assert locks.encode(T0.timestamp(), "default", "gang-pod-1") == "2026-06-14T15:05:03Z,default,gang-pod-1"


def test_encode_refuses_naive_time_and_commas() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        locks.encode(dt.datetime(2026, 1, 1), "ns", "p")
    with pytest.raises(ValueError, match="must not contain"):
        locks.encode(T0, "ns", "a,b")


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("2026-06-14T15:05:03Z,default,p", locks.NodeLock(taken=T0, namespace="default", name="p")),
        ("2026-06-14T17:05:03+02:00,ns,p", locks.NodeLock(taken=T0, namespace="ns", name="p")),
        (
            "2026-06-14T15:05:03.123456789Z,ns,p",
            locks.NodeLock(taken=T0.replace(microsecond=123456), namespace="ns", name="p"),
        ),
        ("2026-06-14T15:05:03Z", locks.NodeLock(taken=T0)),
    ],
    ids=["utc", "offset", "fractional", "legacy-bare"],
)
def test_decode(value: str, want: locks.NodeLock) -> None:
    assert locks.decode(value) == want


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("2026-06-14T15:05:03Z,ns", "value"),
        ("a,b,c,d", "value"),
        ("2026-06-14", "time"),
        ("2026-06-14T15:05:03", "time"),
        ("2026-13-14T15:05:03Z,ns,p", "time"),
        ("2026-06-14 15:05:03Z,ns,p", "time"),
        ("", "time"),
    ],
    ids=["two-parts", "four-parts", "date-only", "no-zone", "month-13", "space-separator", "empty"],
)
def test_decode_errors(value: str, field: str) -> None:
    with pytest.raises(errors.DecodeError) as info:
        locks.decode(value)
    assert (info.value.annotation, info.value.field) == (keys.NODE_LOCK, field)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("2026-06-14T15:05:03Z,ns,p", True),
        ("2026-06-14T15:05:03Z,ns,other", False),
        ("2026-06-14T15:05:03Z,other,p", False),
        ("2026-06-14T15:05:03Z", False),
        ("garbage,ns,p", False),
    ],
    ids=["ours", "other-name", "other-namespace", "legacy-no-owner", "malformed"],
)
def test_is_owner(value: str, want: bool) -> None:
    assert locks.is_owner(value, "ns", "p") is want


@pytest.mark.parametrize(
    ("age", "want"),
    [
        (4 * MINUTE, False),
        (5 * MINUTE, False),
        (5 * MINUTE + dt.timedelta(seconds=1), True),
        (-MINUTE, False),
    ],
    ids=["younger", "exactly-timeout", "older", "from-the-future"],
)
def test_is_expired_default_five_minutes(age: dt.timedelta, want: bool) -> None:
    assert locks.is_expired(locks.NodeLock(taken=T0), T0 + age) is want


def test_is_expired_accepts_seconds() -> None:
    assert locks.is_expired(locks.NodeLock(taken=T0), (T0 + 11 * dt.timedelta(seconds=1)).timestamp(), 10.0)
    assert not locks.is_expired(locks.NodeLock(taken=T0), T0 + dt.timedelta(seconds=9), 10.0)


OURS = "2026-06-14T15:05:03Z,ns,p"
OTHER = "2026-06-14T15:05:03Z,ns,q"


@pytest.mark.parametrize(
    ("value", "age", "verdict"),
    [
        (None, MINUTE, locks.Verdict.FREE),
        (OURS, MINUTE, locks.Verdict.HELD_BY_US),
        (OURS, 10 * MINUTE, locks.Verdict.HELD_BY_US),
        (OTHER, MINUTE, locks.Verdict.HELD_BY_OTHER),
        (OTHER, 6 * MINUTE, locks.Verdict.EXPIRED),
        ("2026-06-14T15:05:03Z", MINUTE, locks.Verdict.HELD_BY_OTHER),
        ("2026-06-14T15:05:03Z", 6 * MINUTE, locks.Verdict.EXPIRED),
        ("not a lock", MINUTE, locks.Verdict.MALFORMED),
    ],
    ids=["free", "ours", "ours-old", "other", "other-expired", "legacy", "legacy-expired", "malformed"],
)
def test_assess(value: str | None, age: dt.timedelta, verdict: locks.Verdict) -> None:
    state = locks.assess(value, "ns", "p", T0 + age)
    assert state.verdict is verdict
    if verdict not in (locks.Verdict.FREE, locks.Verdict.MALFORMED):
        assert state.lock == locks.decode(value or "")


NOW = dt.datetime(2026, 11, 30, 2, 0, 0, tzinfo=dt.UTC)


def test_requesting_value_round_trips() -> None:
    value = handshake.requesting_value(NOW)
    assert value == "Requesting_2026-11-30 02:00:00"
    assert handshake.requested_at(value) == NOW


@pytest.mark.parametrize(
    ("value", "allocatable", "age_s", "want"),
    [
        (None, 0, 0, (True, True)),
        ("", 0, 0, (True, True)),
        ("Reported 2026-11-30 01:59:00.1 +0000 UTC", 0, 0, (True, True)),
        ("Deleted_2026-11-30 01:00:00", 0, 0, (True, True)),
        ("Requesting_{t}", 0, 59, (True, False)),
        ("Requesting_{t}", 0, 60, (False, False)),
        ("Requesting_{t}", 2, 3600, (True, False)),
        ("Requesting_2026-02-30 00:00:00", 0, 0, (True, False)),
    ],
    ids=[
        "absent",
        "empty",
        "plugin-reported",
        "deleted",
        "young",
        "expired",
        "expired-but-advertised",
        "bad-date",
    ],
)
def test_handshake_health(value: str | None, allocatable: int, age_s: int, want: tuple[bool, bool]) -> None:
    at = NOW - dt.timedelta(seconds=age_s)
    if value is not None:
        value = value.replace("{t}", at.strftime("%Y-%m-%d %H:%M:%S"))
    assert handshake.handshake_health(value, allocatable, NOW) == handshake.Health(*want)


@pytest.mark.parametrize(
    ("allocatable", "reported", "cached", "current", "want"),
    [
        (0, 4, "x", "x", (False, False)),
        (4, 2, "x", "x", (True, True)),
        (4, 4, "x", "x", (True, False)),
        (4, 4, "x", "y", (True, True)),
        (4, 4, None, "y", (True, True)),
    ],
    ids=["dropped-to-zero", "count-changed", "unchanged", "registration-changed", "first-registration"],
)
def test_nvidia_health(
    allocatable: int, reported: int, cached: str | None, current: str | None, want: tuple[bool, bool]
) -> None:
    got = handshake.nvidia_health(allocatable, reported, None, cached, current, NOW)
    assert got == handshake.Health(*want)
