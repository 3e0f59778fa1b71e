"""Lease election rules (pure) and the elector's step-down on a fake apiserver."""

from __future__ import annotations

import pytest

from gpuslice.kube import lease
from tests.unit.kube import fakeapi
from tests.unit.kube.fakeapi import Reply, Request

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0


def spec(holder: str | None, renewed: float, duration: int = 15, transitions: int = 3) -> lease.LeaseSpec:
    return lease.LeaseSpec(
        holder_identity=holder,
        lease_duration_seconds=duration,
        acquire_time=lease.micro_time(T0),
        renew_time=lease.micro_time(renewed),
        lease_transitions=transitions,
    )


@pytest.mark.parametrize(
    ("current", "now", "blocked"),
    [
        (spec("b", T0), T0 + 14.9, True),  # renewed 14.9 s ago, lasts 15 s
        (spec("b", T0), T0 + 15.1, False),  # expired
        (spec("a", T0), T0 + 1, False),  # our own
        (spec(None, T0), T0 + 1, False),  # released
        (lease.LeaseSpec(holder_identity="b"), T0, False),  # no times: never renewed
    ],
    ids=["other-live", "other-expired", "mine", "released", "incomplete"],
)
def test_held_by_other(current: lease.LeaseSpec, now: float, blocked: bool) -> None:
    assert lease.held_by_other(current, "a", now) is blocked


def test_next_spec_renews_or_takes_over() -> None:
    renewed = lease.next_spec(spec("a", T0), "a", T0 + 2, 15)
    assert renewed.renew_time == lease.micro_time(T0 + 2) and renewed.acquire_time == lease.micro_time(T0)
    assert renewed.lease_transitions == 3
    taken = lease.next_spec(spec("b", T0), "a", T0 + 20, 15)
    assert (taken.holder_identity, taken.lease_transitions) == ("a", 4)
    assert taken.acquire_time == taken.renew_time == lease.micro_time(T0 + 20)
    assert lease.next_spec(None, "a", T0, 15).lease_transitions == 0


def test_rejects_inconsistent_timings() -> None:
    with pytest.raises(ValueError, match="lease_duration_s > renew_deadline_s"):
        lease.Elector(None, "ns", "l", "a", lease_duration_s=10, renew_deadline_s=10)  # type: ignore[arg-type]


async def test_leader_steps_down_when_renewals_fail_past_the_deadline() -> None:
    """Acquire at t=0; from then on every renewal gets 500; step down after the 10 s deadline."""
    now = [T0]
    mono = [0.0]
    state: dict[str, object] = {"exists": False, "broken": False}
    transitions: list[str] = []

    async def sleep(d: float) -> None:
        now[0] += d
        mono[0] += d
        state["broken"] = True  # after the first acquisition the apiserver fails
        if not elector.leading and transitions == ["start", "stop"]:
            raise _Done

    def handler(req: Request) -> Reply:
        if state["broken"]:
            return fakeapi.error(500, "InternalError")
        if req.method == "GET":
            return fakeapi.error(404, "NotFound")
        return Reply(201, req.json())

    async with fakeapi.serving(handler) as (api, kube):
        elector = lease.Elector(
            kube,
            "ns",
            "l",
            "a",
            on_start=lambda: transitions.append("start"),
            on_stop=lambda: transitions.append("stop"),
            clock=lambda: now[0],
            monotonic=lambda: mono[0],
            sleep=sleep,
        )
        with pytest.raises(_Done):
            await elector.run()

    assert transitions == ["start", "stop"]
    # Renewal attempts every 2 s; the one at 12 s is the first past the 10 s deadline.
    assert mono[0] == pytest.approx(14.0)
    assert [r.method for r in api.requests][:2] == ["GET", "POST"]


class _Done(Exception):
    pass
