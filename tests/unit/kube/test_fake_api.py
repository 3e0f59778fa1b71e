"""gpuslice.kube against a scripted fake apiserver on 127.0.0.1: the paths a real one can't produce on demand.

Aspects: 5xx / 429 / dropped connections / refused connections map onto our error classes with
retry intent; the informer pages its list, asks for bookmarks, follows bookmarks, relists and
diffs on a 410 ERROR event (never re-watching at the stale version), restarts a list whose
continue token expired, and survives a 5xx on its watch; the node lock retries a lost CAS with
backoff and gives up after the bounded number of tries; the binding's 409 paths.
"""

from __future__ import annotations

import itertools
import socket
from typing import Any

import pytest

from gpuslice.codec import keys
from gpuslice.codec import locks as lockcodec
from gpuslice.kube import binding, errors, informer, kinds, locks, objects
from gpuslice.kube import client as kclient
from tests.unit.kube import fakeapi
from tests.unit.kube.fakeapi import Reply, Request

pytestmark = pytest.mark.unit


async def test_server_errors_are_temporary_with_retry_after() -> None:
    def handler(req: Request) -> Reply:
        if req.path.endswith("/busy"):
            return Reply(429, fakeapi.status_body(429, "TooManyRequests"), headers={"Retry-After": "2"})
        return fakeapi.error(503, "ServiceUnavailable", "etcd leader changed")

    async with fakeapi.serving(handler) as (_, kube):
        with pytest.raises(errors.ApiServerError) as caught:
            await kube.request("GET", "/api/v1/nodes/n1")
        assert isinstance(caught.value, errors.TemporaryError)
        assert caught.value.code == 503 and "etcd leader changed" in str(caught.value)
        with pytest.raises(errors.TooManyRequests) as busy:
            await kube.request("GET", "/api/v1/busy")
        assert busy.value.delay == 2.0


async def test_dropped_and_refused_connections_are_unavailable() -> None:
    async with fakeapi.serving(lambda req: Reply(close_early=True)) as (_, kube):
        with pytest.raises(errors.ApiUnavailable) as caught:
            await kube.request("GET", "/api/v1/nodes")
        assert isinstance(caught.value, errors.TemporaryError) and caught.value.code == 0
        assert isinstance(caught.value.__cause__, Exception)  # the httpx2 error is chained

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with fakeapi.serving(lambda req: Reply()) as (_, kube):
        with pytest.raises(errors.ApiUnavailable):
            await kube.request("GET", f"http://127.0.0.1:{port}/api/v1/nodes")


def _watch_line(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


async def test_informer_pages_bookmarks_and_relists_on_410() -> None:
    lists = itertools.count()
    watches = itertools.count()

    def handler(req: Request) -> Reply:
        if req.query.get("watch") != "true":
            n = next(lists)
            if n == 0:  # first page of the first list
                return Reply(body=fakeapi.node_list([fakeapi.node("a", "1")], "10", cont="c1"))
            if n == 1:
                assert req.query["continue"] == "c1"
                return Reply(body=fakeapi.node_list([fakeapi.node("b", "2")], "10"))
            # The relist: b vanished, c arrived.
            return Reply(body=fakeapi.node_list([fakeapi.node("a", "1"), fakeapi.node("c", "11")], "20"))
        if next(watches) == 0:
            return Reply(
                lines=[
                    _watch_line("ADDED", fakeapi.node("c", "11")),
                    _watch_line("BOOKMARK", {"kind": "Node", "metadata": {"resourceVersion": "15"}}),
                    _watch_line("ERROR", fakeapi.status_body(410, "Expired", "too old resource version: 15")),
                ]
            )
        return Reply(lines=[])

    seen: list[tuple[str, str]] = []

    def record(e: informer.Event[objects.Node]) -> None:
        seen.append((e.type.value, e.obj.metadata.name if e.obj else ""))

    async with fakeapi.serving(handler) as (api, kube):
        inf = informer.Informer(kube, kinds.NODES, record, page_size=1, resync_s=0)
        await inf.run(iterations=2)

    assert seen == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("LISTED", ""),
        ("ADDED", "c"),
        ("DELETED", "b"),  # the relist's diff
        ("LISTED", ""),
    ]
    watch_reqs = [r.query for r in api.requests if r.query.get("watch") == "true"]
    assert [q["resourceVersion"] for q in watch_reqs] == ["10", "20"]  # never the stale 15
    assert all(q["allowWatchBookmarks"] == "true" for q in watch_reqs)
    list_reqs = [r.query for r in api.requests if "watch" not in r.query]
    assert [q["limit"] for q in list_reqs] == ["1", "1", "1"]
    assert inf.gone == 1 and inf.lists == 2 and inf.restarts == 0
    assert sorted(inf.store) == ["a", "c"] and inf.resource_version == "20"


async def test_informer_survives_a_5xx_watch_and_keeps_its_version() -> None:
    watches = itertools.count()
    delays: list[float] = []

    async def no_sleep(d: float) -> None:
        delays.append(d)

    def handler(req: Request) -> Reply:
        if req.query.get("watch") != "true":
            return Reply(body=fakeapi.node_list([fakeapi.node("a", "1")], "10"))
        if next(watches) == 0:
            return fakeapi.error(500, "InternalError", "boom")
        return Reply(lines=[_watch_line("MODIFIED", fakeapi.node("a", "12"))])

    health: list[bool] = []
    async with fakeapi.serving(handler) as (api, kube):
        inf = informer.Informer(
            kube, kinds.NODES, lambda e: None, resync_s=0, sleep=no_sleep, rng=lambda: 0.5
        )
        inf.handler = lambda e: health.append(inf.healthy)
        await inf.run(iterations=2)

    assert inf.restarts == 1 and isinstance(inf.last_error, errors.ApiServerError)
    assert delays == [pytest.approx(0.2)]
    assert [r.query["resourceVersion"] for r in api.requests if r.query.get("watch")] == ["10", "10"]
    assert inf.lists == 1 and inf.resource_version == "12"
    assert health[-1] is True  # healthy again once the watch reopened


async def test_informer_restarts_a_list_whose_continue_token_expired() -> None:
    lists = itertools.count()

    def handler(req: Request) -> Reply:
        n = next(lists)
        if n == 0:
            return Reply(body=fakeapi.node_list([fakeapi.node("a", "1")], "10", cont="c1"))
        if n == 1:
            return fakeapi.error(410, "Expired", "continue token too old")
        return Reply(body=fakeapi.node_list([fakeapi.node("a", "1"), fakeapi.node("b", "5")], "30"))

    async with fakeapi.serving(handler) as (api, kube):
        inf = informer.Informer(kube, kinds.NODES, lambda e: None, page_size=1)
        rv = await inf.relist()

    assert rv == "30" and sorted(inf.store) == ["a", "b"]
    assert ["continue" in r.query for r in api.requests] == [False, True, False]


def _node_with_lock(rv: str, lock: str | None) -> dict[str, Any]:
    return fakeapi.node("n1", rv, {keys.NODE_LOCK: lock} if lock else {})


async def test_lock_cas_retries_after_conflict_with_backoff() -> None:
    patches = itertools.count()
    slept: list[float] = []

    async def sleep(d: float) -> None:
        slept.append(d)

    def handler(req: Request) -> Reply:
        if req.method == "GET":
            return Reply(body=_node_with_lock("7", None))
        if next(patches) < 2:
            return fakeapi.error(409, "Conflict", "the object has been modified")
        return Reply(body=_node_with_lock("9", req.json()["metadata"]["annotations"][keys.NODE_LOCK]))

    async with fakeapi.serving(handler) as (api, kube):
        got = await locks.acquire(
            kube, "n1", "ns", "p", clock=lambda: 1_800_000_000.0, rng=lambda: 0.0, sleep=sleep
        )

    assert got == locks.Acquired(locks.Outcome.TAKEN, "9")
    assert slept == pytest.approx([0.1, 0.2])
    sent = [r.json() for r in api.requests if r.method == "PATCH"]
    assert all(b["metadata"]["resourceVersion"] == "7" for b in sent)  # every write is a CAS
    assert lockcodec.is_owner(sent[-1]["metadata"]["annotations"][keys.NODE_LOCK], "ns", "p")


@pytest.mark.parametrize("lost", ["500", "dropped"])
async def test_lock_write_whose_reply_was_lost_is_recognised_as_ours(lost: str) -> None:
    """The apiserver applied the lock write, then the answer was lost (500 or no answer)."""
    state: dict[str, Any] = {"lock": None, "rv": "7"}

    async def sleep(d: float) -> None:
        pass

    def handler(req: Request) -> Reply:
        if req.method == "GET":
            return Reply(body=_node_with_lock(state["rv"], state["lock"]))
        state["lock"], state["rv"] = req.json()["metadata"]["annotations"][keys.NODE_LOCK], "8"
        if lost == "500":
            return fakeapi.error(500, "InternalError", "etcd request timed out")
        return Reply(close_early=True)

    async with fakeapi.serving(handler) as (api, kube):
        got = await locks.acquire(kube, "n1", "ns", "p", clock=lambda: 1_800_000_000.0, sleep=sleep)

    assert got == locks.Acquired(locks.Outcome.ALREADY_HELD, "8")
    assert len(api.paths("PATCH")) == 1  # one write; the re-read saw it applied


async def test_lock_gives_up_after_bounded_conflicts() -> None:
    async def sleep(d: float) -> None:
        pass

    def handler(req: Request) -> Reply:
        if req.method == "GET":
            return Reply(body=_node_with_lock("7", None))
        return fakeapi.error(409, "Conflict")

    async with fakeapi.serving(handler) as (api, kube):
        with pytest.raises(locks.LockContention, match="lost 3 races"):
            await locks.acquire(kube, "n1", "ns", "p", retries=3, sleep=sleep)
    assert len(api.paths("PATCH")) == 3


async def test_legacy_lock_without_owner_only_expires() -> None:
    now = 1_800_000_000.0
    legacy = lockcodec.encode(now - 10, "x", "y").split(",")[0]  # a bare timestamp, 10 s old

    def handler(req: Request) -> Reply:
        return Reply(body=_node_with_lock("7", legacy))

    async with fakeapi.serving(handler) as (api, kube):
        with pytest.raises(locks.LockContention):
            await locks.acquire(kube, "n1", "ns", "p", clock=lambda: now)
    assert api.paths("PATCH") == []  # no owner lookup possible, nothing written


@pytest.mark.parametrize(
    ("pod", "outcome"),
    [
        ({"metadata": {"uid": "u1"}, "spec": {"nodeName": "n1"}}, "ok"),
        ({"metadata": {"uid": "u2"}, "spec": {"nodeName": "n1"}}, "uid"),
        ({"metadata": {"uid": "u1"}, "spec": {"nodeName": "n2"}}, "bound to n2"),
    ],
    ids=["retry-same-node", "recreated-pod", "other-node"],
)
async def test_binding_conflict_paths(pod: dict[str, Any], outcome: str) -> None:
    def handler(req: Request) -> Reply:
        if req.method == "POST":
            assert req.json()["metadata"]["uid"] == "u1"
            assert req.json()["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}
            return fakeapi.error(409, "Conflict", "pod p is already assigned to node")
        return Reply(body=pod)

    async with fakeapi.serving(handler) as (_, kube):
        if outcome == "ok":
            assert await binding.bind(kube, "ns", "p", "u1", "n1") is False
        else:
            with pytest.raises(binding.BindError, match=outcome):
                await binding.bind(kube, "ns", "p", "u1", "n1")


async def test_binding_201_status_answer_is_success() -> None:
    def handler(req: Request) -> Reply:
        return Reply(201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})

    async with fakeapi.serving(handler) as (api, kube):
        assert await binding.bind(kube, "ns", "p", "u1", "n1") is True
    assert api.paths() == ["/api/v1/namespaces/ns/pods/p/binding"]


async def test_rate_limit_applies_to_every_request() -> None:
    async with fakeapi.serving(lambda req: Reply(body={}), qps=1, burst=2) as (_, kube):
        assert isinstance(kube.bucket, kclient.TokenBucket)
        for _ in range(2):
            await kube.request("GET", "/x")
        # Burst spent: the next request would wait about 1 s.
        assert kube.bucket.reserve(kube.bucket._last or 0.0) == pytest.approx(1.0, abs=0.05)
