"""Pure pieces of gpuslice.kube: limiter arithmetic, error mapping, backoff, lock and event rules."""

from __future__ import annotations

import datetime as dt

import pytest

from gpuslice.codec import resources
from gpuslice.kube import client as kclient
from gpuslice.kube import errors, events, informer, locks, objects, sync
from gpuslice_dev import nodesim

pytestmark = pytest.mark.unit


def test_token_bucket_burst_then_rate() -> None:
    bucket = kclient.TokenBucket(qps=10, burst=3)
    # t=0: 3 tokens -> three immediate sends; the 4th waits 1/10 s, the 5th 2/10 s.
    waits = [bucket.reserve(0.0) for _ in range(5)]
    assert waits == pytest.approx([0, 0, 0, 0.1, 0.2])
    # t=1.0: debt was -2, +10 tokens/s * 1 s = 8 -> capped at burst 3 -> immediate.
    assert bucket.reserve(1.0) == 0


def test_token_bucket_disabled() -> None:
    bucket = kclient.TokenBucket(qps=0, burst=1)
    assert [bucket.reserve(0.0) for _ in range(100)] == [0.0] * 100


@pytest.mark.parametrize(
    ("code", "cls", "temporary"),
    [
        (400, errors.ApiClientError, False),
        (403, errors.ApiClientError, False),
        (404, errors.NotFound, False),
        (409, errors.Conflict, False),
        (410, errors.Gone, False),
        (422, errors.Invalid, False),
        (429, errors.TooManyRequests, True),
        (500, errors.ApiServerError, True),
        (503, errors.ApiServerError, True),
    ],
    ids=lambda v: str(v) if isinstance(v, int | bool) else v.__name__,
)
def test_status_codes_map_to_classes(code: int, cls: type[errors.ApiError], temporary: bool) -> None:
    err = errors.from_status(
        code, b'{"kind":"Status","reason":"R","message":"m"}', retry_after="3", what="GET /x"
    )
    assert type(err) is cls
    assert err.code == code and err.reason == "R" and err.message == "GET /x: m"
    assert isinstance(err, errors.TemporaryError) is temporary
    assert isinstance(err, errors.PermanentError) is not temporary
    assert err.delay == 3.0


def test_non_status_body_is_kept_as_message() -> None:
    err = errors.from_status(502, b"<html>bad gateway</html>")
    assert isinstance(err, errors.ApiServerError) and "bad gateway" in err.message
    assert err.delay == errors.DEFAULT_RETRY_DELAY


def test_lock_backoff_grows_with_jitter() -> None:
    # 0.1 s x 2^attempt, plus up to 50 %: rng 0 -> base, rng 1 -> 1.5 x base.
    assert [locks.backoff(a, lambda: 0.0) for a in range(4)] == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert locks.backoff(2, lambda: 1.0) == pytest.approx(0.6)


def test_informer_retry_delay_is_capped() -> None:
    # 0.2 s doubling, x0.75..1.25; failure 20 would be 0.2*2^19 s, capped at 30 s.
    assert informer.retry_delay(1, lambda: 0.5) == pytest.approx(0.2)
    assert informer.retry_delay(3, lambda: 0.0) == pytest.approx(0.6)
    assert informer.retry_delay(20, lambda: 1.0) == pytest.approx(37.5)


def _pod(phase: str = "Pending", deleting: bool = False) -> objects.Pod:
    meta = objects.ObjectMeta(name="p", deletion_timestamp="2026-01-01T00:00:00Z" if deleting else None)
    return objects.Pod(metadata=meta, status=objects.PodStatus(phase=phase))


@pytest.mark.parametrize(
    ("owner", "dangling"),
    [
        (None, True),
        (_pod("Succeeded"), True),
        (_pod("Failed"), True),
        (_pod("Pending", deleting=True), True),
        (_pod("Pending"), False),
        (_pod("Running"), False),
    ],
    ids=["deleted", "succeeded", "failed", "terminating", "pending", "running"],
)
def test_dangling_owner(owner: objects.Pod | None, dangling: bool) -> None:
    assert locks.is_dangling(owner) is dangling


WHEN = dt.datetime(2026, 11, 30, 1, 2, 3, 456789, tzinfo=dt.UTC)


def test_event_build_truncates_and_places_node_events_in_default() -> None:
    ref = events.Ref("Node", "n1", "", "uid-1")
    body = events.build(ref, "Bogus", "r" * 200, "", "n" * 2000, WHEN, events.CONTROLLER, "i" * 300)
    assert body["metadata"]["namespace"] == "default"
    assert body["type"] == "Normal"  # only Normal/Warning are valid
    assert len(body["reason"]) == 128 and body["action"] == "Unknown"
    assert len(body["note"]) == 1024 and len(body["reportingInstance"]) == 128
    assert body["eventTime"] == "2026-11-30T01:02:03.456789Z"
    assert body["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-1"}
    assert "series" not in body and "deprecatedCount" not in body


def test_pod_events_live_with_the_pod() -> None:
    body = events.build(events.Ref("Pod", "p", "ns1"), "Warning", "R", "A", "x", WHEN, "c/x", "i")
    assert body["metadata"]["namespace"] == "ns1" and body["regarding"]["namespace"] == "ns1"


def test_dedup_key_separates_what_differs() -> None:
    ref = events.Ref("Pod", "p", "ns")
    base = events.dedup_key(ref, "Warning", "R", "A", "note")
    assert base == events.dedup_key(events.Ref("Pod", "p", "ns"), "Warning", "R", "A", "note")
    others = [
        events.dedup_key(events.Ref("Pod", "q", "ns"), "Warning", "R", "A", "note"),
        events.dedup_key(ref, "Normal", "R", "A", "note"),
        events.dedup_key(ref, "Warning", "R2", "A", "note"),
        events.dedup_key(ref, "Warning", "R", "A", "other note"),
    ]
    assert base not in others


def test_quotas_combine_to_the_tightest_limit() -> None:
    a = resources.QuotaLimits(count=4, memory_mib=None, cores=300)
    b = resources.QuotaLimits(count=8, memory_mib=20000, cores=None)
    view = sync.combine([a, b])
    assert view is not None and (view.count_limit, view.memory_limit, view.cores_limit) == (4, 20000, 300)
    assert sync.combine([resources.QuotaLimits()]) is None
    assert sync.combine([]) is None


@pytest.mark.parametrize(
    ("value", "blank"),
    [("GPU-a,NVIDIA,1000,0:;", ";"), (";GPU-a,NVIDIA,3000,30:GPU-b,NVIDIA,3000,30:;;", ";;;"), ("", "")],
    ids=["one", "init-app-empty", "none"],
)
def test_nodesim_blanks_every_entry(value: str, blank: str) -> None:
    assert nodesim.blank_entries(value) == blank


def test_nodesim_numa_layout() -> None:
    # 8 cards over 2 NUMA nodes in index order; explicit layouts win.
    assert [c.numa for c in nodesim.cards("n", count=8, numa_nodes=2)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [c.numa for c in nodesim.cards("n", count=3, numa=[1, 0, 1])] == [1, 0, 1]
    assert len({c.uuid for c in nodesim.cards("n", count=8)}) == 8
