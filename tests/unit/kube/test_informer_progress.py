"""The informer's progress tracking: waiting for a resourceVersion, readiness during a relist."""

from __future__ import annotations

import asyncio
import contextlib
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


async def test_a_frozen_watch_is_detected_restarted_and_not_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """No event, no bookmark, no end of stream past timeoutSeconds: the stream is dead."""
    from gpuslice.kube import errors
    from tests.unit.kube import fakeapi

    monkeypatch.setattr(informer, "FROZEN_MARGIN_S", 0.3)
    watches = []

    def handler(req: fakeapi.Request) -> fakeapi.Reply:
        if req.query.get("watch") != "true":
            return fakeapi.Reply(body={"kind": "PodList", "metadata": {"resourceVersion": "5"}, "items": []})
        watches.append(req)
        return fakeapi.Reply(lines=[], hang_s=5.0)  # headers sent, then silence

    async with fakeapi.serving(handler) as (_, kube):
        seen: list[Any] = []
        inf: informer.Informer[Any] = informer.Informer(
            kube, kinds.PODS, seen.append, watch_timeout_s=1, resync_s=0
        )
        await inf.relist()
        ready: list[bool] = [inf.ready]
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(errors.ApiUnavailable):
            await inf.watch(1)
        assert loop.time() - start < 3.0  # 1 s timeoutSeconds + 0.3 s margin, not forever
        # The loop counts it as a failure: not ready until a watch works again.
        task = asyncio.create_task(inf.run(iterations=1))
        await asyncio.sleep(2.0)
        ready.append(inf.ready)
        assert ready == [True, False] and inf.restarts >= 1
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
