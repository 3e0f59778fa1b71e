"""Which list the informer asks for: consistent first, then from the watch cache, never back in time."""

from __future__ import annotations

import gc
import itertools
from typing import Any

import pytest

from gpuslice.kube import errors, informer, kinds, objects
from tests.unit.kube import fakeapi
from tests.unit.kube.fakeapi import Reply, Request

pytestmark = pytest.mark.unit

CACHE = {"resourceVersionMatch": "NotOlderThan"}


def _watch_line(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def _lists(api: fakeapi.FakeApi) -> list[dict[str, str]]:
    return [r.query for r in api.requests if "watch" not in r.query]


async def test_first_list_is_consistent_and_a_watch_410_relists_from_the_watch_cache() -> None:
    lists = itertools.count()

    def handler(req: Request) -> Reply:
        if req.query.get("watch") != "true":
            n = next(lists)
            if n == 0:
                return Reply(body=fakeapi.node_list([fakeapi.node("a", "1")], "10", cont="c1"))
            if n == 1:
                return Reply(body=fakeapi.node_list([fakeapi.node("b", "2")], "10"))
            return Reply(body=fakeapi.node_list([fakeapi.node("a", "1")], "20"))
        return Reply(
            lines=[
                _watch_line("BOOKMARK", {"kind": "Node", "metadata": {"resourceVersion": "15"}}),
                _watch_line("ERROR", fakeapi.status_body(410, "Expired", "too old resource version: 15")),
            ]
        )

    async with fakeapi.serving(handler) as (api, kube):
        inf = informer.Informer(kube, kinds.NODES, lambda e: None, page_size=1, resync_s=0)
        await inf.run(iterations=1)
        assert inf.resource_version == "" and inf.seen_version == "15" and inf.relisting
        await inf.relist()

    assert _lists(api) == [
        {"limit": "1"},  # consistent: the most recent state
        {"limit": "1", "continue": "c1"},  # later pages: the token only
        {"limit": "1", "resourceVersion": "15", **CACHE},  # at least as new as what was seen
    ]
    assert sorted(inf.store) == ["a"] and inf.resource_version == "20" and not inf.relisting


async def test_a_resync_lists_from_the_watch_cache_at_the_version_reached() -> None:
    def handler(req: Request) -> Reply:
        return Reply(body=fakeapi.node_list([fakeapi.node("a", "1")], "30" if req.query else "10"))

    async with fakeapi.serving(handler) as (api, kube):
        inf = informer.Informer(kube, kinds.NODES, lambda e: None, page_size=0)
        await inf.relist()
        await inf.relist()
        inf.watch_cache = False
        await inf.relist()

    # page_size <= 0: no limit at all; watch_cache=False: every list consistent.
    assert _lists(api) == [{}, {"resourceVersion": "10", **CACHE}, {}]


async def test_a_list_410_makes_the_next_list_consistent() -> None:
    calls = itertools.count()

    def handler(req: Request) -> Reply:
        if next(calls) == 1:
            return fakeapi.error(410, "Expired", "too old")
        return Reply(body=fakeapi.node_list([fakeapi.node("a", "1")], "40"))

    async with fakeapi.serving(handler) as (api, kube):
        inf = informer.Informer(kube, kinds.NODES, lambda e: None, page_size=5)
        await inf.relist()
        with pytest.raises(errors.Gone):
            await inf.relist()
        await inf.relist()

    assert _lists(api) == [{"limit": "5"}, {"limit": "5", "resourceVersion": "40", **CACHE}, {"limit": "5"}]


async def test_a_watch_cache_behind_the_version_falls_back_to_a_consistent_list() -> None:
    def handler(req: Request) -> Reply:
        if req.query.get("resourceVersionMatch"):
            return fakeapi.error(504, "Timeout", "Too large resource version: 50, current: 45")
        return Reply(body=fakeapi.node_list([fakeapi.node("a", "1")], "52"))

    async with fakeapi.serving(handler) as (api, kube):
        inf = informer.Informer(kube, kinds.NODES, lambda e: None, page_size=5)
        inf.seen_version, inf.consistent_next = "50", False
        assert await inf.relist() == "52"

    assert _lists(api) == [{"limit": "5", "resourceVersion": "50", **CACHE}, {"limit": "5"}]


async def test_a_list_older_than_what_was_seen_is_refused_before_anything_is_applied() -> None:
    def handler(req: Request) -> Reply:  # a server that ignores resourceVersionMatch
        return Reply(body=fakeapi.node_list([fakeapi.node("a", "1")], "30"))

    seen: list[informer.Event[objects.Node]] = []
    async with fakeapi.serving(handler) as (api, kube):
        inf = informer.Informer(kube, kinds.NODES, seen.append)
        inf.seen_version, inf.consistent_next = "35", False
        with pytest.raises(errors.ApiServerError, match="older than 35"):
            await inf.relist()
        assert seen == [] and inf.store == {} and inf.consistent_next
        await inf.relist()  # consistent: the most recent state, whatever its number

    assert [q.get("resourceVersion") for q in _lists(api)] == ["35", None]
    assert [e.type for e in seen] == [informer.EventType.ADDED, informer.EventType.LISTED]


async def test_a_relist_builds_and_emits_only_changed_objects_with_the_collector_paused() -> None:
    rounds = itertools.count()

    def handler(req: Request) -> Reply:
        b = "7" if next(rounds) else "2"
        return Reply(body=fakeapi.node_list([fakeapi.node("a", "1"), fakeapi.node("b", b)], "60"))

    events: list[tuple[str, str, bool]] = []

    def record(e: informer.Event[objects.Node]) -> None:
        events.append((e.type.value, e.obj.metadata.name if e.obj else "", gc.isenabled()))

    assert gc.isenabled()
    async with fakeapi.serving(handler) as (_, kube):
        inf = informer.Informer(kube, kinds.NODES, record)
        await inf.relist()
        first = inf.store["a"]
        await inf.relist()

    assert [(t, n) for t, n, _ in events] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("LISTED", ""),
        ("MODIFIED", "b"),  # a kept its resourceVersion: neither rebuilt nor emitted
        ("LISTED", ""),
    ]
    assert inf.store["a"] is first
    assert [enabled for t, _, enabled in events if t != "LISTED"] == [False, False, False]
    assert gc.isenabled()
