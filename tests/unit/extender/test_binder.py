from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import pytest

from gpuslice.codec import keys
from gpuslice.codec import locks as lockcodec
from gpuslice.extender.binding import binder as binders
from gpuslice.kube import client as kclient
from gpuslice.kube import errors as kerrors
from gpuslice.kube import objects

pytestmark = pytest.mark.unit

NOW = 1_700_000_000.0
"""The binder's clock, fixed and far from the wall clock: the fast path and ``locks.acquire`` must
both judge a lock's age by it (a lock at ``NOW - 60`` is long expired by the wall clock)."""


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


def test_fast_lock_returns_the_version_its_compare_and_swap_was_based_on() -> None:
    """Every pod write of the previous holder came before the version the CAS succeeded on (7),
    so the truth check need not wait for the pod watch to pass the lock write itself (8)."""
    after = _node(lockcodec.encode(NOW, "default", "p"))
    after["metadata"]["resourceVersion"] = "8"
    kube = _Kube(after)  # the PATCH answers the node as written
    assert asyncio.run(_binder(_node(None), kube).lock_node("n1", "default", "p")) == "7"


class _ReadThenWrite(_Kube):
    """GET answers the node free (version 7); PATCH answers it locked (version 8)."""

    async def request(self, method: str, path: str, **_: Any) -> kclient.Response:
        self.calls.append((method, path))
        node = _node(None) if method == "GET" else _node(lockcodec.encode(NOW, "default", "p"))
        node["metadata"]["resourceVersion"] = "7" if method == "GET" else "8"
        return kclient.Response(200, json.dumps(node).encode())


def test_lock_without_a_watched_node_returns_the_version_after_its_write() -> None:
    kube = _ReadThenWrite(_node(None))
    b = binders.KubeBinder(cast(kclient.KubeClient, kube), clock=lambda: NOW)
    assert asyncio.run(b.lock_node("n1", "default", "p")) == "8"
    assert kube.calls == [("GET", "/api/v1/nodes/n1"), ("PATCH", "/api/v1/nodes/n1")]


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


def test_bind_carries_the_annotations_and_the_label_in_the_binding() -> None:
    api = _Api()
    b = _kube_binder(api)
    ann = {keys.VGPU_NODE: "n1", keys.BIND_PHASE: "allocating", keys.DEVICES_ALLOCATED: "GPU-a,NVIDIA,1,0:;"}
    assert asyncio.run(b.bind("default", "p", "uid-p", "n1", ann, timeout=2.5)) is True
    ((method, path, kwargs),) = api.calls  # one request: no annotation patch before it
    assert (method, path, kwargs["timeout"]) == ("POST", "/api/v1/namespaces/default/pods/p/binding", 2.5)
    body = kwargs["body"]
    assert body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}
    assert body["metadata"] == {
        "name": "p",
        "namespace": "default",
        "uid": "uid-p",
        "annotations": ann,
        "labels": {keys.VGPU_NODE: "n1"},
    }
    # A pod without GPUs: a plain Binding.
    asyncio.run(b.bind("default", "cpu", "uid-cpu", "n1"))
    assert set(api.calls[-1][2]["body"]["metadata"]) == {"name", "namespace", "uid"}


def test_label_is_a_uid_checked_merge_patch_of_the_label_alone() -> None:
    api = _Api(json.dumps({"metadata": {"name": "p", "namespace": "default"}}).encode())
    asyncio.run(_kube_binder(api).label("default", "p", "uid-p", "n1"))
    ((method, path, kwargs),) = api.calls
    assert (method, path) == ("PATCH", "/api/v1/namespaces/default/pods/p")
    assert kwargs["content_type"] == kclient.MERGE_PATCH
    assert kwargs["body"] == {"metadata": {"labels": {keys.VGPU_NODE: "n1"}, "uid": "uid-p"}}


def test_label_can_be_left_out() -> None:
    api = _Api()
    b = binders.KubeBinder(cast(kclient.KubeClient, api), clock=lambda: NOW, label_pods=False)
    asyncio.run(b.label("default", "p", "uid-p", "n1"))
    assert api.calls == []


class _Bound:
    """The apiserver for a pod already bound to ``node``: 409 on the Binding, then the pod on GET."""

    def __init__(self, node: str, annotations: dict[str, str]) -> None:
        self.pod = {
            "metadata": {"name": "p", "namespace": "default", "uid": "uid-p", "annotations": annotations},
            "spec": {"nodeName": node},
        }
        self.calls: list[tuple[str, str]] = []

    async def request(self, method: str, path: str, **_: Any) -> kclient.Response:
        self.calls.append((method, path))
        if method == "POST":
            raise kerrors.Conflict('pod p is already assigned to node "n1"')
        return kclient.Response(200, json.dumps(self.pod).encode())


OURS = {
    keys.VGPU_NODE: "n1",
    keys.VGPU_TIME: "1700000000",
    keys.DEVICES_TO_ALLOCATE: "GPU-a,NVIDIA,1000,0:;",
    keys.DEVICES_ALLOCATED: "GPU-a,NVIDIA,1000,0:;",
    keys.BIND_PHASE: "allocating",
    keys.BIND_TIME: "1700000000",
}


@pytest.mark.parametrize(
    ("on_pod", "ours"),
    [
        (OURS, True),
        # The device plugin answered meanwhile: entries blanked, phase set; still our decision.
        (OURS | {keys.DEVICES_TO_ALLOCATE: ";", keys.BIND_PHASE: "success"}, True),
        (OURS | {keys.DEVICES_ALLOCATED: "GPU-b,NVIDIA,1000,0:;"}, False),
        (OURS | {keys.BIND_TIME: "1699999990"}, False),
        ({}, False),
    ],
    ids=["ours", "ours-after-allocate", "other-card", "other-bind", "no-devices"],
)
def test_already_bound_to_the_node_tells_whose_devices_it_carries(on_pod: dict[str, str], ours: bool) -> None:
    api = _Bound("n1", on_pod)
    b = binders.KubeBinder(cast(kclient.KubeClient, api), clock=lambda: NOW)
    assert asyncio.run(b.bind("default", "p", "uid-p", "n1", OURS)) is ours
    assert api.calls == [
        ("POST", "/api/v1/namespaces/default/pods/p/binding"),
        ("GET", "/api/v1/namespaces/default/pods/p"),
    ]


def test_bound_elsewhere_is_a_definite_failure() -> None:
    b = binders.KubeBinder(cast(kclient.KubeClient, _Bound("n2", OURS)), clock=lambda: NOW)
    with pytest.raises(binders.BindFailure) as err:
        asyncio.run(b.bind("default", "p", "uid-p", "n1", OURS))
    assert (err.value.operation, err.value.reason, err.value.ambiguous) == ("bind", "AlreadyBound", False)


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
        "bind": b.bind("default", "p", "uid-p", "n1", {keys.BIND_PHASE: "allocating"}),
        "label": b.label("default", "p", "uid-p", "n1"),
        "unlock": b.unlock_node("n1", "default", "p"),
    }
    for op, call in calls.items():
        with pytest.raises(binders.BindFailure) as err:
            asyncio.run(call)
        assert err.value.operation == op
        assert err.value.ambiguous is ambiguous, op
