"""The informer's progress tracking: waiting for a resourceVersion, readiness during a relist."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuslice.kube import informer, kinds

pytestmark = pytest.mark.unit


def make() -> informer.Informer[Any]:
    inf: informer.Informer[Any] = informer.Informer(None, kinds.PODS, lambda e: None)  # type: ignore[arg-type]
    inf.synced = inf.healthy = True
    inf.resource_version = "100"
    return inf


async def test_wait_for_returns_once_the_watch_passes_the_version() -> None:
    inf = make()
    assert inf.applied("100") and not inf.applied("101")
    waiter = asyncio.create_task(inf.wait_for("105", 5.0))
    await asyncio.sleep(0.01)
    inf._advance("103")
    await asyncio.sleep(0.01)
    assert not waiter.done()
    inf._advance("107")
    assert await waiter is True


async def test_wait_for_times_out_and_refuses_opaque_versions() -> None:
    inf = make()
    assert await inf.wait_for("200", 0.02) is False
    assert await inf.wait_for("not-a-number", 1.0) is False
    inf.resource_version = ""
    assert await inf.wait_for("1", 1.0) is False
    assert inf._waiters == [] or all(f.cancelled() for _, _, f in inf._waiters)


def test_ready_needs_sync_health_and_no_forced_relist() -> None:
    inf = make()
    states = []
    for relisting, healthy in ((False, True), (True, True), (False, False)):
        inf.relisting, inf.healthy = relisting, healthy
        states.append(inf.ready)
    assert states == [True, False, False]
