from __future__ import annotations

import asyncio
import json
import time
from typing import Any, cast

import pytest

from gpuslice.codec import keys
from gpuslice.codec import locks as lockcodec
from gpuslice.extender import binder as binders
from gpuslice.kube import client as kclient
from gpuslice.kube import objects

pytestmark = pytest.mark.unit

NOW = float(int(time.time()))  # locks.acquire judges expiry by the wall clock


class _Kube:
    """Records requests; every PATCH succeeds, every GET returns the node ``node``."""

    def __init__(self, node: dict[str, Any]) -> None:
        self.node = node
        self.calls: list[tuple[str, str]] = []

    async def request(self, method: str, path: str, **_: Any) -> kclient.Response:
        self.calls.append((method, path))
        return kclient.Response(200, json.dumps(self.node).encode())


def _node(lock: str | None) -> dict[str, Any]:
    annotations = {keys.NODE_LOCK: lock} if lock is not None else {}
    return {"metadata": {"name": "n1", "resourceVersion": "7", "annotations": annotations}}


def _binder(watched: dict[str, Any], kube: _Kube) -> binders.KubeBinder:
    node = objects.decode_node(json.dumps(watched).encode())
    return binders.KubeBinder(
        cast(kclient.KubeClient, kube), cached_node=lambda name: node, clock=lambda: NOW
    )


@pytest.mark.parametrize(
    ("age_s", "requests"),
    [(1.0, 0), (60.0, 2)],
    ids=["fresh-lock-no-request", "older-lock-checked-through-the-api"],
)
def test_watched_lock_of_another_pod(age_s: float, requests: int) -> None:
    held = _node(lockcodec.encode(NOW - age_s, "default", "other"))
    kube = _Kube(held)  # the API agrees: held by "other" (a live pod: its GET returns an object)
    with pytest.raises(binders.BindFailure) as err:
        asyncio.run(_binder(held, kube).lock_node("n1", "default", "p"))
    assert err.value.reason == binders.CONTENTION
    # Fresh (1 s < 5 s trusted): no request. Older: GET node + GET owner pod, as locks.acquire does.
    assert len(kube.calls) == requests


def test_watched_free_lock_is_taken_with_one_patch() -> None:
    kube = _Kube(_node(None))
    asyncio.run(_binder(_node(None), kube).lock_node("n1", "default", "p"))
    assert kube.calls == [("PATCH", "/api/v1/nodes/n1")]
