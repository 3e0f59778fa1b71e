"""extender.binding.barrier: binds wait for the quorum, and give the plan up together."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from gpuslice.extender.binding import barrier as barriers
from gpuslice.framework import gangs, nominations, profile
from gpuslice.model import gangs as model_gangs
from gpuslice.model import requests
from tests.unit import builders as b
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit


def setup(
    size: int, wait_s: float
) -> tuple[barriers.Barrier, list[requests.PodRequest], nominations.Nominator]:
    journal = nominations.Journal()
    holds = nominations.Nominator(journal)
    cache = fakes.cluster_cache(
        b.node("a").gpus(size), nominator=nominations.Merged(journal, nominations.Nominator(journal), holds)
    )
    plans = gangs.Gangs(profile.Profile.build("binpack", "binpack"), gangs.Directory(), holds)
    ref = model_gangs.GangRef(
        namespace="default", name="g", source=model_gangs.SOURCE_ANNOTATION, min_member=size
    )
    pods = [
        msgspec.structs.replace(b.pod(f"m{i}").uid(f"u{i}").gpu(1, memory=1000).obj(), gang=ref)
        for i in range(size)
    ]
    for p in pods:
        assert plans.admit(p, cache.snapshot(), ["a"], time.time()).node == "a"
    return barriers.Barrier(plans, time.time, time.monotonic, wait_s), pods, holds


async def test_every_bind_passes_once_the_last_member_arrives() -> None:
    barrier, pods, _ = setup(3, 5.0)
    far = time.monotonic() + 10
    first = [asyncio.ensure_future(barrier.pass_(p, "a", far)) for p in pods[:2]]
    await asyncio.sleep(0.05)
    assert not any(t.done() for t in first) and barrier.waiting == {"default/g": {"default/m0", "default/m1"}}
    assert await barrier.pass_(pods[2], "a", far) == ""
    assert await asyncio.gather(*first) == ["", ""]
    assert barrier.waiting == {}


async def test_binds_that_wait_too_long_fail_but_their_members_count_toward_the_quorum() -> None:
    barrier, pods, holds = setup(3, 0.2)
    far = time.monotonic() + 10
    waits = [asyncio.ensure_future(barrier.pass_(p, "a", far)) for p in pods[:2]]
    errors = await asyncio.gather(*waits)
    assert all("2 of 3 members have come to bind" in e for e in errors)
    assert len(holds.nominations()) == 3  # the plan keeps the gang's cards
    # the last member opens the plan at once: the first two have come already
    assert await barrier.pass_(pods[2], "a", far) == ""
    # and the first two, retried by kube-scheduler, commit without waiting
    started = time.monotonic()
    assert await barrier.pass_(pods[0], "a", far) == ""
    assert time.monotonic() - started < 0.1


async def test_a_plan_that_expires_fails_the_waiting_binds() -> None:
    barrier, pods, holds = setup(2, 5.0)
    far = time.monotonic() + 10
    wait = asyncio.ensure_future(barrier.pass_(pods[0], "a", far))
    await asyncio.sleep(0.05)
    assert barrier.gangs.expire(time.time() + 3600) == ("default/g",)
    barrier.wake("default/g")
    assert "expired" in await wait
    assert holds.nominations() == ()


async def test_the_bind_deadline_bounds_the_wait() -> None:
    barrier, pods, _ = setup(2, 30.0)
    started = time.monotonic()
    why = await barrier.pass_(pods[0], "a", time.monotonic() + 0.1)
    assert why and time.monotonic() - started < 5


def test_a_non_positive_wait_is_refused() -> None:
    barrier, _, _ = setup(1, 1.0)
    with pytest.raises(ValueError, match="positive"):
        barriers.Barrier(barrier.gangs, time.time, time.monotonic, 0)
