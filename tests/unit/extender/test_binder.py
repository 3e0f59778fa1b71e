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
from gpuslice.kube import errors as kerrors
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


def test_lock_returns_the_nodes_resource_version_after_the_write() -> None:
    after = _node(lockcodec.encode(NOW, "default", "p"))
    after["metadata"]["resourceVersion"] = "8"
    kube = _Kube(after)  # the PATCH answers the node as written
    assert asyncio.run(_binder(_node(None), kube).lock_node("n1", "default", "p")) == "8"


class _Api:
    """Records every request with its arguments; answers ``reply`` or raises ``error``."""

    def __init__(self, reply: bytes = b"{}", error: Exception | None = None) -> None:
        self.reply = reply
        self.error = error
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> kclient.Response:
        self.calls.append((method, path, kwargs))
        if self.error is not None:
            raise self.error
        return kclient.Response(200, self.reply)


def _kube_binder(api: _Api) -> binders.KubeBinder:
    return binders.KubeBinder(cast(kclient.KubeClient, api), clock=lambda: NOW)


def test_annotate_and_bind_pass_their_timeouts_and_the_label_follows() -> None:
    api = _Api(json.dumps({"metadata": {"name": "p", "namespace": "default"}}).encode())
    b = _kube_binder(api)
    asyncio.run(
        b.annotate("default", "p", "uid-p", {keys.VGPU_NODE: "n1", keys.BIND_PHASE: "x"}, timeout=1.5)
    )
    asyncio.run(b.bind("default", "p", "uid-p", "n1", timeout=2.5))
    (m1, p1, a1), (m2, p2, a2) = api.calls
    assert (m1, p1, a1["timeout"]) == ("PATCH", "/api/v1/namespaces/default/pods/p", 1.5)
    meta = a1["body"]["metadata"]
    assert meta["labels"] == {keys.VGPU_NODE: "n1"} and meta["uid"] == "uid-p"
    assert (m2, p2, a2["timeout"]) == ("POST", "/api/v1/namespaces/default/pods/p/binding", 2.5)
    assert a2["body"]["target"]["name"] == "n1" and a2["body"]["metadata"]["uid"] == "uid-p"
    # Removing the annotations removes the label too.
    asyncio.run(b.annotate("default", "p", "uid-p", {keys.VGPU_NODE: None}))
    assert api.calls[-1][2]["body"]["metadata"]["labels"] == {keys.VGPU_NODE: None}


@pytest.mark.parametrize(
    ("error", "ambiguous"),
    [
        (kerrors.ApiUnavailable("read timed out"), True),
        (kerrors.ApiServerError("etcdserver: request timed out"), True),
        (kerrors.ApiServerError("service unavailable", code=503), True),
        (kerrors.Conflict("the object has been modified"), False),
        (kerrors.NotFound('pods "p" not found'), False),
        (kerrors.Invalid("metadata.uid: field is immutable"), False),
        (kerrors.TooManyRequests("throttled"), False),
    ],
    ids=["unavailable", "500", "503", "409", "404", "422", "429"],
)
def test_failures_say_whether_the_write_may_have_landed(error: kerrors.ApiError, ambiguous: bool) -> None:
    b = _kube_binder(_Api(error=error))
    calls = {
        "annotate": b.annotate("default", "p", "uid-p", {keys.BIND_PHASE: "allocating"}),
        "bind": b.bind("default", "p", "uid-p", "n1"),
        "unlock": b.unlock_node("n1", "default", "p"),
    }
    for op, call in calls.items():
        with pytest.raises(binders.BindFailure) as err:
            asyncio.run(call)
        assert err.value.operation == op
        assert err.value.ambiguous is ambiguous, op
