"""What the extender keeps between calls is bounded in bytes, whatever the requests carry.

``memo.Memo`` is bounded by entries and by bytes; the per-host heads of ``wire`` by bytes. The
retention tests run the real app and count, with ``tracemalloc``, what is still allocated after
the calls: kube-scheduler sends the whole pod on every call (pods that were never created in the
API included), so a memo that kept a request's bytes would grow with every pod.
"""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient

from gpuslice.extender import config, wire
from gpuslice.extender.http import app as apps
from gpuslice.framework import memo, scheduling
from gpuslice.kube import events
from tests.unit.builders import node
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit

MiB = 1 << 20


def test_the_oldest_entries_go_beyond_the_entry_count() -> None:
    m = memo.Memo(3, MiB)
    for k in "abcd":
        m.put(k, 1)
    assert list(m) == ["b", "c", "d"]
    m.put("b", 2)  # a re-put moves the key to the end
    m.put("e", 3)
    assert list(m) == ["d", "b", "e"] and m["b"] == 2


def test_the_oldest_entries_go_beyond_the_byte_budget() -> None:
    m = memo.Memo(1000, 3 * (memo.OVERHEAD + 1 + 100), memo.strings)
    for k in "abcd":
        m.put(k, "x" * 100)
    assert list(m) == ["b", "c", "d"]
    assert m.bytes == 3 * (memo.OVERHEAD + 1 + 100)
    m.put("e", "x" * 250)  # heavier: two old entries make room
    assert list(m) == ["d", "e"]


def test_an_entry_heavier_than_the_budget_is_not_kept() -> None:
    m = memo.Memo(10, 1000, memo.strings)
    m.put("a", "small")
    m.put("b", "x" * 2000)
    assert list(m) == ["a"]
    m.put("a", "x" * 2000)  # replacing a key with a value too heavy drops the key
    assert not m and m.bytes == 0


def test_strings_counts_through_containers() -> None:
    assert memo.strings([("node-1", 7), ("n2", 3)]) == (8 + 8 + 6 + 8) + (8 + 8 + 2 + 8)
    assert memo.strings({"k": b"vv"}) == 16 + 1 + 2
    assert memo.strings(3.5) == 0


ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "pop", "del", "popitem", "clear"]),
        st.sampled_from("abcdef"),
        st.integers(0, 400),
    ),
    max_size=60,
)


@given(ops)
def test_the_byte_count_is_the_sum_of_the_entries_held(steps: list[tuple[str, str, int]]) -> None:
    m = memo.Memo(4, 1500, memo.strings)
    for op, key, size in steps:
        if op == "put":
            m.put(key, "x" * size)
        elif op == "pop":
            m.pop(key, None)
        elif op == "del" and key in m:
            del m[key]
        elif op == "popitem" and m:
            m.popitem(last=size % 2 == 0)
        elif op == "clear":
            m.clear()
        assert m.bytes == sum(memo.OVERHEAD + len(k) + len(v) for k, v in m.items())
        assert len(m) <= 4 and m.bytes <= 1500


def test_the_host_heads_stay_within_their_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "_HOST_HEADS", {})
    monkeypatch.setattr(wire, "_host_heads_bytes", 0)
    monkeypatch.setattr(wire, "_HOST_HEADS_BUDGET", 64 * 1024)
    import numpy as np

    for i in range(200):
        names = [f"node-{i}-{j}-" + "x" * 200 for j in range(50)]
        out = wire.encode_priorities(names, np.full(50, 7, np.int64))
        assert json.loads(out) == [{"Host": n, "Score": 7} for n in names]
        assert wire._host_heads_bytes <= 64 * 1024
        assert wire._host_heads_bytes == sum(wire._head_cost(n, h) for n, h in wire._HOST_HEADS.items())
    many = [f"n{j}-" + "y" * 250 for j in range(400)]  # more names than the budget holds
    assert json.loads(wire.encode_priorities(many, np.zeros(400, np.int64)))[-1]["Host"] == many[-1]
    assert wire._host_heads_bytes <= 64 * 1024


def test_an_event_note_is_cut_before_it_keys_the_queue() -> None:
    rec = events.Recorder(kube=None, instance="test")  # type: ignore[arg-type]  # nothing is sent
    for i in range(50):
        rec.record("ns", f"p{i}", "u", events.WARNING, "FilteringFailed", "Filter", "x" * 300_000 + str(i))
    queued = list(rec._queued)
    assert len(queued) == 50 and all(len(k[-1]) == events.MAX_NOTE for k in queued)
    # cut at the same place, the 50 notes are one event per pod (they differed only past the cut)
    assert {k[-1] for k in queued} == {"x" * events.MAX_NOTE}


# ----- what the real app keeps after hostile calls


@pytest.fixture
def client() -> Iterator[TestClient]:
    names = [f"n{i}" for i in range(3)]
    cache = fakes.cluster_cache(*(node(n).gpus(4) for n in names))
    deps = fakes.make_deps(cache, settings=config.Settings(node_choice="rank"))
    with TestClient(apps.create_app(deps), raise_server_exceptions=False) as c:
        yield c


def retained(calls: Callable[[], None]) -> int:
    """Bytes still allocated (by Python) after ``calls``, compared with before."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        calls()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def _pod(i: int, **meta: Any) -> dict[str, Any]:
    pod = fakes.gpu_pod(f"p{i}", mem=1000 + i, uid=f"uid-{i}")  # a spec of its own: parsed afresh
    pod["metadata"].update(meta)
    return pod


def test_filters_of_pods_with_large_annotations_and_labels_keep_none_of_them(client: TestClient) -> None:
    nodes = ["n0", "n1", "n2"]

    def calls() -> None:
        for i in range(200):
            pod = _pod(
                i,
                resourceVersion=str(i),
                annotations={"example.com/blob": f"{i}" + "a" * 200_000},
                labels={f"example.com/l{j}": f"{i}-{j}" for j in range(500)},
                ownerReferences=[{"uid": f"owner-{i}", "controller": True}],
            )
            r = client.post("/filter", content=json.dumps({"Pod": pod, "NodeNames": nodes}))
            assert r.status_code == 200 and r.json()["NodeNames"], r.text[:300]

    kept = retained(calls)
    assert kept < 2 * MiB, f"{kept / MiB:.1f} MiB kept after 200 filters carrying 200 KB and 500 labels each"


def test_distinct_over_long_node_names_are_refused_and_not_kept(client: TestClient) -> None:
    def calls() -> None:
        for i in range(200):
            names = [f"{i}-{j}-" + "x" * 16_000 for j in range(50)]  # 10 000 distinct 16 KB names
            r = client.post("/prioritize", content=json.dumps({"Pod": _pod(i), "NodeNames": names}))
            assert r.status_code == 400 and "$.NodeNames[0]" in r.text, r.text[:300]

    kept = retained(calls)
    assert kept < MiB, f"{kept / MiB:.1f} MiB kept after 10 000 distinct over-long names"


def test_distinct_names_within_the_limit_are_kept_within_the_heads_budget(client: TestClient) -> None:
    def calls() -> None:
        for i in range(200):
            names = [f"{i}-{j}-" + "x" * 240 for j in range(50)]  # 10 000 distinct 250-char names
            r = client.post("/prioritize", content=json.dumps({"Pod": _pod(i), "NodeNames": names}))
            assert r.status_code == 200, r.text[:300]

    kept = retained(calls)
    assert kept < wire._HOST_HEADS_BUDGET + 2 * MiB, f"{kept / MiB:.1f} MiB kept"


def test_pods_of_one_spec_keep_their_own_owner_and_job_label() -> None:
    """The parse is shared by spec; the owner and the job label's value are each pod's own."""
    cache = fakes.cluster_cache(*(node(f"n{i}").gpus(4) for i in range(4)))
    deps = fakes.make_deps(cache, settings=config.Settings(job_label="example.com/job"))
    with TestClient(apps.create_app(deps), raise_server_exceptions=False) as c:
        for i, (name, meta) in enumerate(
            (
                ("a", {"ownerReferences": [{"uid": "owner-a", "controller": True}]}),
                ("b", {"ownerReferences": [{"uid": "owner-b", "controller": True}]}),
                ("c", {"labels": {"example.com/job": "train-c", "other": "x"}}),
                ("d", {"labels": {"example.com/job": "train-d"}}),
            )
        ):
            pod = fakes.gpu_pod(name, mem=1000)  # the same spec for all four; a node each (no lock wait)
            pod["metadata"].update(meta)
            r = c.post("/filter", content=json.dumps({"Pod": pod, "NodeNames": [f"n{i}"]}))
            assert r.json()["NodeNames"] == [f"n{i}"], r.text
            bind = {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}", "Node": f"n{i}"}
            assert c.post("/bind", content=json.dumps(bind)).json() == {"Error": ""}
    jobs = cache.snapshot().jobs
    assert {job: set(where) for job, where in jobs.items()} == {
        "owner:owner-a": {"n0"},
        "owner:owner-b": {"n1"},
        "label:train-c": {"n2"},
        "label:train-d": {"n3"},
    }


async def _asgi_post(app: apps._Fast, path: str, body: bytes) -> int:
    """One POST straight into the ASGI app (no test client, whose own objects would be measured)."""
    sent: list[MutableMapping[str, Any]] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [(b"content-length", str(len(body)).encode())],
    }
    await app(scope, receive, send)
    status: int = sent[0]["status"]
    return status


def test_refused_and_failed_requests_leave_nothing_for_the_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the cyclic collector off, a 400 or a 500 still frees the request at once (no cycle)."""
    cache = fakes.cluster_cache(*(node(f"n{i}").gpus(4) for i in range(3)))
    app = apps.create_app(fakes.make_deps(cache))
    long_names = [
        json.dumps({"Pod": _pod(i), "NodeNames": [f"{i}-{j}-" + "x" * 16_000 for j in range(50)]})
        for i in range(50)
    ]
    bug = json.dumps({"Pod": _pod(99, annotations={"blob": "b" * 400_000}), "NodeNames": ["n0", "n1"]})

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    async def calls() -> None:
        for body in long_names:
            assert await _asgi_post(app, "/prioritize", body.encode()) == 400
        with monkeypatch.context() as m:
            m.setattr(scheduling, "filter_nodes", broken)
            for _ in range(20):
                assert await _asgi_post(app, "/filter", bug.encode()) == 500

    gc.collect()
    gc.disable()
    try:
        kept = retained_uncollected(lambda: asyncio.run(calls()))
    finally:
        gc.enable()
    assert kept < 2 * MiB, (
        f"{kept / MiB:.1f} MiB waiting for the collector after 70 refused or failed requests"
    )


def retained_uncollected(calls: Callable[[], None]) -> int:
    """Bytes still allocated after ``calls`` without a collector pass (cycles count as kept)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        calls()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
