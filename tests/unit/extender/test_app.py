from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from gpuslice.cache import cache as caches
from gpuslice.codec import errors as codec_errors
from gpuslice.codec import keys, pod_devices, resources
from gpuslice.extender import config, wire
from gpuslice.extender.binding import bind as binds
from gpuslice.extender.http import app as apps
from gpuslice.framework import registry
from gpuslice.model import config as model_config
from gpuslice.model import status
from gpuslice.policy import quota as quotas
from tests.unit import builders
from tests.unit.builders import node
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit

# n-free: one 80 GiB A100, idle. n-full: one card with 78000 of 81920 MiB used (by a running pod).
# n-two: two idle cards. n-half: one card with 40000 MiB used (by a running pod).
# "ghost" is not in the cache; "bad" has an invalid registration (the feed's invalid_nodes).
INVALID = frozenset({"bad"})
BIND_P = {"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n-free"}


def _cache() -> caches.ClusterCache:
    cache = fakes.cluster_cache(
        node("n-free").gpus(1), node("n-full").gpus(1), node("n-two").gpus(2), node("n-half").gpus(1)
    )
    fakes.charge(cache, "other/full", "n-full", (0, 78000, 10))
    fakes.charge(cache, "other/half", "n-half", (0, 40000, 10))
    return cache


@pytest.fixture
def cache() -> caches.ClusterCache:
    return _cache()


@pytest.fixture
def binder() -> fakes.FakeBinder:
    return fakes.FakeBinder()


@pytest.fixture
def client(cache: caches.ClusterCache, binder: fakes.FakeBinder) -> Iterator[TestClient]:
    deps = fakes.make_deps(cache, binder, invalid=INVALID)
    with TestClient(apps.create_app(deps), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def blend_client(cache: caches.ClusterCache, binder: fakes.FakeBinder) -> Iterator[TestClient]:
    """Prioritize answers the policy's scores scaled to 0..10 (``node_choice: blend``)."""
    deps = fakes.make_deps(cache, binder, config.Settings(node_choice="blend"), invalid=INVALID)
    with TestClient(apps.create_app(deps), raise_server_exceptions=False) as c:
        yield c


def _args(pod: dict[str, Any], names: list[str] | None) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


def test_filter_sorts_nodes_into_feasible_failed_and_unresolvable(client: TestClient) -> None:
    pod = fakes.gpu_pod("p", mem=8000, cores=30)
    r = client.post("/filter", json=_args(pod, ["n-free", "n-full", "ghost", "bad"]))
    assert r.status_code == 200
    assert r.json() == {
        "NodeNames": ["n-free"],
        # 81920 - 78000 = 3920 MiB free < 8000 requested: capacity could be freed.
        "FailedNodes": {"n-full": "InsufficientGPUMemory"},
        "FailedAndUnresolvableNodes": {"ghost": "NodeUnregistered", "bad": "NodeRegistrationInvalid"},
        "Error": "",
    }


def test_filter_answers_explicit_empty_list(client: TestClient) -> None:
    r = client.post("/filter", json=_args(fakes.gpu_pod("p", gpu=3), ["n-two"]))
    body = r.json()
    assert body["NodeNames"] == []
    # 3 cards asked, the node has 2: evicting cannot help.
    assert body["FailedAndUnresolvableNodes"] == {"n-two": "InsufficientGPUCount"}


def test_filter_with_null_node_names_returns_empty_list(client: TestClient) -> None:
    r = client.post("/filter", json=_args(fakes.gpu_pod("p"), None))
    assert r.status_code == 200
    assert r.json()["NodeNames"] == []


def test_filter_messages_never_name_nodes(client: TestClient) -> None:
    pod = fakes.gpu_pod("p", mem=8000)
    body = client.post("/filter", json=_args(pod, ["n-full", "ghost", "bad"])).json()
    for messages in (body["FailedNodes"], body["FailedAndUnresolvableNodes"]):
        for node_name, message in messages.items():
            assert node_name not in message


def test_pod_without_gpu_passes_every_node(client: TestClient) -> None:
    pod = {"metadata": {"name": "cpu", "uid": "u"}, "spec": {"containers": [{"name": "c"}]}}
    body = client.post("/filter", json=_args(pod, ["n-free", "ghost"])).json()
    assert body["NodeNames"] == ["n-free", "ghost"]


def test_invalid_quantity_rejects_every_node_with_invalid_request(client: TestClient) -> None:
    pod = fakes.gpu_pod("p")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "lots"
    body = client.post("/filter", json=_args(pod, ["n-free", "n-two"])).json()
    assert body["NodeNames"] == []
    assert body["FailedAndUnresolvableNodes"] == {"n-free": "InvalidRequest", "n-two": "InvalidRequest"}


def test_quota_blocks_in_filter(cache: caches.ClusterCache, client: TestClient) -> None:
    # limit 10000 MiB, 4000 used by a running pod; 8000 more would make 12000 > 10000.
    fakes.charge(cache, "team/running", "n-two", (0, 4000, 0))
    cache.set_quota("team", quotas.QuotaView(memory_limit=10000))
    assert cache.snapshot().quota("team") == quotas.QuotaView(
        memory_limit=10000, used_memory=4000, used_count=1
    )
    body = client.post(
        "/filter", json=_args(fakes.gpu_pod("p", mem=8000, namespace="team"), ["n-free"])
    ).json()
    assert body["FailedNodes"] == {"n-free": "QuotaExceeded"}
    ok = client.post("/filter", json=_args(fakes.gpu_pod("q", mem=6000, namespace="team"), ["n-free"])).json()
    assert ok["NodeNames"] == ["n-free"]


@pytest.mark.parametrize("filtered_first", [False, True], ids=["cold", "after-filter"])
def test_prioritize_returns_bare_array_scaled_to_ten(blend_client: TestClient, filtered_first: bool) -> None:
    client = blend_client
    pod = fakes.gpu_pod("p", mem=8000, cores=30)
    names = ["n-free", "n-half", "ghost"]
    if filtered_first:
        client.post("/filter", json=_args(pod, names))
    r = client.post("/prioritize", json=_args(pod, names))
    assert r.status_code == 200
    body = r.json()
    assert [h["Host"] for h in body] == names
    assert all(0 <= h["Score"] <= 10 for h in body)
    assert body[2]["Score"] == 0  # unknown node
    # binpack prefers the fuller card: n-half ends at (40000 + 8000) / 81920 = 59 % used, n-free at 10 %.
    assert body[1]["Score"] > body[0]["Score"]
    assert client.post("/score", json=_args(pod, ["n-free"])).json()[0]["Host"] == "n-free"


def test_prioritize_rescores_nodes_changed_since_filter(
    blend_client: TestClient, cache: caches.ClusterCache
) -> None:
    client = blend_client
    pod = fakes.gpu_pod("p", mem=8000, cores=30)
    names = ["n-free", "n-half"]
    client.post("/filter", json=_args(pod, names))
    before = client.post("/prioritize", json=_args(fakes.gpu_pod("q", mem=8000, cores=30), names)).json()
    # A pod lands on n-free after the filter: its memoized score is stale and must be recomputed.
    fakes.charge(cache, "other/filler", "n-free", (0, 70000, 10))
    after = client.post("/prioritize", json=_args(pod, names)).json()
    assert after[0]["Score"] > before[0]["Score"]
    assert after[1] == before[1]


def _versioned(pod: dict[str, Any], version: str) -> dict[str, Any]:
    pod["metadata"]["resourceVersion"] = version
    return pod


def test_prioritize_after_filter_on_the_same_snapshot_reuses_filter_scores() -> None:
    names = ["n-free", "n-half", "n-two"]
    cache = _cache()
    # While nothing changes, the real cache hands out one snapshot object (what the memo relies on).
    assert cache.snapshot() is cache.snapshot()
    blend = config.Settings(node_choice="blend")
    with TestClient(apps.create_app(fakes.make_deps(cache, settings=blend, invalid=INVALID))) as c:
        pod = _versioned(fakes.gpu_pod("p", mem=8000, cores=30), "1")
        cold = c.post(
            "/prioritize", json=_args(_versioned(fakes.gpu_pod("q", mem=8000, cores=30), "1"), names)
        )
        feasible = c.post("/filter", json=_args(pod, names)).json()["NodeNames"]
        assert feasible == names
        warm = c.post("/prioritize", json=_args(pod, feasible)).json()
        # The same pod shape on the same snapshot: the memoized scores equal a fresh computation.
        assert warm == cold.json()
        # binpack: n-half (48000/81920 used after the pod) over n-free and n-two (8000/81920).
        assert warm[1]["Score"] > warm[0]["Score"]
        # A new version of the pod asking for 30000 MiB is parsed again, not served from the memo:
        # n-half ends at 70000/81920 used instead of 48000/81920, so its score rises.
        bigger = _versioned(fakes.gpu_pod("p", mem=30000, cores=30), "2")
        after = c.post("/prioritize", json=_args(bigger, feasible)).json()
        assert after[1]["Score"] > warm[1]["Score"]


def test_bind_writes_hami_annotations_and_binds(
    client: TestClient, cache: caches.ClusterCache, binder: fakes.FakeBinder
) -> None:
    pod = fakes.gpu_pod("p", mem=4000, cores=30)
    assert client.post("/filter", json=_args(pod, ["n-free"])).json()["NodeNames"] == ["n-free"]
    r = client.post("/bind", json=BIND_P)
    assert r.status_code == 200
    assert r.json() == {"Error": ""}
    assert [c[0] for c in binder.calls] == ["lock", "bind"]  # the annotations travel in the Binding
    ann = binder.annotations["default/p"]
    assert ann[keys.VGPU_NODE] == "n-free"
    assert ann[keys.BIND_PHASE] == "allocating"
    assert ann[keys.DEVICES_ALLOCATED] == ann[keys.DEVICES_TO_ALLOCATE] == "GPU-n-free-0,NVIDIA,4000,30:;"
    assert ann[keys.BIND_TIME] == ann[keys.VGPU_TIME] == "1700000000"
    assert binder.bound == {"default/p": "n-free"}
    assert cache.pod_state("default/p") is caches.PodState.ASSUMED  # until the watch confirms it
    assert fakes.usage(cache, "n-free") == [(1, 4000, 30)]
    # A repeated bind (scheduler retry after a timeout) succeeds without a second reservation.
    again = client.post("/bind", json=BIND_P)
    assert again.json() == {"Error": ""}
    assert fakes.usage(cache, "n-free") == [(1, 4000, 30)]
    assert [c[0] for c in binder.calls] == ["lock", "bind"]
    # HAMi's label once the device plugin released the node lock after Allocate.
    assert binder.labels == {} and client.portal is not None
    client.portal.call(binder.release, "n-free")
    client.portal.call(asyncio.sleep, 0.05)
    assert binder.labels == {"default/p": "n-free"}
    assert [c[0] for c in binder.calls] == ["lock", "bind", "label"]
    # The binding finished: the assumed pod's TTL runs from the bind's clock.
    ttl = config.Settings().assumed_ttl_s
    assert cache.expire(fakes.CLOCK + ttl - 1, ttl) == ()
    assert cache.expire(fakes.CLOCK + ttl, ttl) == ("default/p",)


def test_bind_reads_the_pod_when_it_was_not_filtered_here(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder({"default/p": fakes.gpu_pod("p", mem=1000)})
    with TestClient(apps.create_app(fakes.make_deps(cache, binder, invalid=INVALID))) as c:
        r = c.post(
            "/bind", json={"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n-two"}
        )
    assert r.json() == {"Error": ""}
    assert binder.calls[0] == ("read", "default", "p")
    # spread: a fresh node, first card.
    assert (
        pod_devices.decode(binder.annotations["default/p"][keys.DEVICES_ALLOCATED])[0][0].memory_mib == 1000
    )


@pytest.mark.parametrize("op", ["lock", "bind"], ids=["lock", "bind"])
def test_bind_failure_rolls_everything_back(
    op: str, client: TestClient, cache: caches.ClusterCache, binder: fakes.FakeBinder
) -> None:
    client.post("/filter", json=_args(fakes.gpu_pod("p", mem=4000), ["n-free"]))
    binder.fail[op] = "boom"  # a definite failure (4xx): nothing was written
    r = client.post("/bind", json=BIND_P)
    assert r.status_code == 200
    assert r.json()["Error"].startswith(f"{op} failed")
    assert cache.pod_state("default/p") is None  # assumption forgotten
    assert fakes.usage(cache, "n-free") == [(0, 0, 0)]
    assert binder.locks == {}  # node lock released (or never taken)
    assert binder.annotations.get("default/p", {}) == {}  # nothing written with a failed Binding
    assert binder.bound == {}


def test_bind_of_pod_that_no_longer_fits_is_an_error(
    client: TestClient, cache: caches.ClusterCache, binder: fakes.FakeBinder
) -> None:
    client.post("/filter", json=_args(fakes.gpu_pod("p", mem=8000), ["n-full"]))
    r = client.post("/bind", json=BIND_P | {"Node": "n-full"})
    assert "no longer fits" in r.json()["Error"]
    assert binder.calls == []
    assert cache.pod_state("default/p") is None
    assert fakes.usage(cache, "n-full") == [(1, 78000, 10)]  # only the pod already running there


def test_bind_of_unknown_pod_is_an_error(client: TestClient, binder: fakes.FakeBinder) -> None:
    r = client.post(
        "/bind", json={"PodName": "x", "PodNamespace": "default", "PodUID": "u", "Node": "n-free"}
    )
    assert r.status_code == 200
    assert r.json()["Error"] == "pod not found"
    assert binder.calls == [("read", "default", "x")]


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/filter", b"{not json", 400, "malformed JSON"),
        ("/filter", b"", 400, "empty request body"),
        ("/filter", b'{"Pod": 5, "NodeNames": []}', 400, "invalid request"),
        ("/filter", b'{"Pod": {"metadata": {"name": 1}}, "NodeNames": []}', 400, "invalid request"),
        ("/filter", b'{"Pod": {}, "NodeNames": "n-free"}', 400, "invalid request"),
        ("/prioritize", b"[]", 400, "invalid request"),
        ("/bind", b'{"PodName": "p"}', 400, "invalid request"),
        ("/bind", b'{"PodName": "", "PodNamespace": "d", "PodUID": "u", "Node": ""}', 400, "required"),
        ("/preempt", b"null", 400, "invalid request"),
        ("/filter", b"{" + b" " * (1 << 20) + b"}", 413, "larger than"),
    ],
    ids=[
        "bad-json",
        "empty",
        "pod-type",
        "name-type",
        "names-type",
        "prio-array",
        "bind-missing",
        "bind-empty",
        "preempt-null",
        "oversized",
    ],
)
def test_bad_input_is_a_clear_4xx(
    client: TestClient, path: str, body: bytes, status: int, fragment: str
) -> None:
    r = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status
    assert fragment in r.text
    assert "Traceback" not in r.text


def test_preempt_drops_nodes_without_victims_and_hopeless_nodes(client: TestClient) -> None:
    victims = {"Pods": [{"UID": "v1"}], "NumPDBViolations": 0}
    body = {
        "Pod": fakes.gpu_pod("p", gpu=2),
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            "n-two": victims,
            "n-free": victims,  # one card: 2 cards can never fit
            "n-full": {"Pods": [], "NumPDBViolations": 0},
        },
    }
    r = client.post("/preempt", json=body)
    assert r.status_code == 200
    assert r.json() == {"NodeNameToMetaVictims": {"n-two": victims}}


def test_health_ready_and_metrics(client: TestClient) -> None:
    assert client.get("/healthz").text == "ok"
    assert client.get("/readyz").status_code == 200
    client.post("/filter", json=_args(fakes.gpu_pod("p", mem=8000), ["n-free", "n-full"]))
    text = client.get("/metrics").text
    assert 'gpuslice_filter_node_outcomes_total{reason="InsufficientGPUMemory"} 1.0' in text
    assert 'gpuslice_extender_request_duration_seconds_count{verb="filter"} 1.0' in text
    assert 'hami_gpu_memory_allocated_bytes{device_index="0",device_type="NVIDIA A100-SXM4-80GB",' in text
    assert "hami_gpu_memory_limit_bytes" in text


def test_readyz_is_503_until_synced(cache: caches.ClusterCache) -> None:
    with TestClient(apps.create_app(fakes.make_deps(cache, synced=lambda: False))) as c:
        r = c.get("/readyz")
        assert (r.status_code, r.text) == (503, "cache not synced")
        assert "gpuslice_cache_synced 0.0" in c.get("/metrics").text


def test_readyz_is_200_for_a_synced_follower(cache: caches.ClusterCache) -> None:
    # lease mode with the pod known: a follower is ready (rollouts and drains go on); the Service
    # finds the leader by its pod label instead.
    with TestClient(apps.create_app(fakes.make_deps(cache, follower=True))) as c:
        r = c.get("/readyz")
        assert (r.status_code, r.text) == (200, "ok (follower)")
        assert "gpuslice_cache_synced 1.0" in c.get("/metrics").text


def test_readyz_is_503_for_a_follower_without_its_pod(cache: caches.ClusterCache) -> None:
    # No pod to label: readiness is the only way a Service can find the leader.
    with TestClient(apps.create_app(fakes.make_deps(cache, follower=True, follower_ready=False))) as c:
        r = c.get("/readyz")
        assert (r.status_code, r.text) == (503, "not leader")
        assert "gpuslice_cache_synced 1.0" in c.get("/metrics").text


def test_readyz_of_an_unsynced_follower_is_503(cache: caches.ClusterCache) -> None:
    deps = fakes.make_deps(cache, follower=True, synced=lambda: False)
    with TestClient(apps.create_app(deps)) as c:
        r = c.get("/readyz")
        assert (r.status_code, r.text) == (503, "cache not synced")


def test_filter_and_prioritize_refuse_to_decide_from_an_unsynced_cache(cache: caches.ClusterCache) -> None:
    settings = config.Settings(sync_wait_s=0.05)
    deps = fakes.make_deps(cache, settings=settings, synced=lambda: False)
    pod = fakes.gpu_pod("p", mem=8000)
    with TestClient(apps.create_app(deps)) as c:
        body = c.post("/filter", json=_args(pod, ["n-free", "n-two"])).json()
        # An Error (kube-scheduler retries the pod), never "no node fits" from a partial cache.
        assert body == {
            "NodeNames": [],
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": {},
            "Error": apps.NOT_SYNCED,
        }
        r = c.post("/prioritize", json=_args(pod, ["n-free"]))
        assert (r.status_code, r.text) == (503, apps.NOT_SYNCED)
        text = c.get("/metrics").text
    assert 'gpuslice_not_synced_answers_total{verb="filter"} 1.0' in text
    assert 'gpuslice_not_synced_answers_total{verb="prioritize"} 1.0' in text


def test_filter_waits_for_the_sync_within_sync_wait(cache: caches.ClusterCache) -> None:
    # Synced on the third look: the filter waits (at most sync_wait_s) and then answers normally.
    looks = iter([False, False])
    deps = fakes.make_deps(cache, settings=config.Settings(sync_wait_s=5.0), synced=lambda: next(looks, True))
    with TestClient(apps.create_app(deps)) as c:
        body = c.post("/filter", json=_args(fakes.gpu_pod("p", mem=8000), ["n-free"])).json()
    assert body["NodeNames"] == ["n-free"] and body["Error"] == ""


def test_excluded_nodes_fail_filter_and_bind_with_their_reason(
    cache: caches.ClusterCache, binder: fakes.FakeBinder
) -> None:
    deps = fakes.make_deps(cache, binder, excluded={"n-two": "NodeLockHeld"})
    pod = fakes.gpu_pod("p", mem=8000)
    with TestClient(apps.create_app(deps)) as c:
        body = c.post("/filter", json=_args(pod, ["n-free", "n-two"])).json()
        assert body["NodeNames"] == ["n-free"]
        assert body["FailedNodes"] == {"n-two": "NodeLockHeld"}
        r = c.post("/bind", json=BIND_P | {"Node": "n-two"})
    assert r.json() == {"Error": "node n-two: NodeLockHeld"}
    assert binder.calls == [] and cache.pod_state("default/p") is None


def test_events_summarize_filter_and_bind(cache: caches.ClusterCache) -> None:
    deps = fakes.make_deps(cache)
    with TestClient(apps.create_app(deps)) as c:
        c.post("/filter", json=_args(fakes.gpu_pod("p", mem=8000, cores=30), ["n-free", "n-full", "ghost"]))
        c.post("/prioritize", json=_args(fakes.gpu_pod("p", mem=8000, cores=30), ["n-free"]))
        c.post("/bind", json={"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n-free"})
        c.post("/filter", json=_args(fakes.gpu_pod("big", gpu=2), ["n-free", "ghost"]))
    assert isinstance(deps.events, fakes.RecordedEvents)
    bound, failed = deps.events.events
    # binpack: usage after placement 0.5 * 8000/81920 + 0.5 * 30/100 = 0.199 -> 20/100 -> 2/10 on the wire.
    assert bound[:3] == ("default/p", "Normal", "GPUAllocated")
    assert bound[3] == (
        "Filter: 1/3 nodes feasible, 1 InsufficientGPUMemory, 1 NodeUnregistered; bound to n-free; "
        "top scores: n-free=2; Device: GPU-n-free-0 (8000MB/30cores)"
    )
    assert failed == (
        "default/big",
        "Warning",
        "FilteringFailed",
        "Filter: 0/2 nodes feasible, 1 InsufficientGPUCount, 1 NodeUnregistered",
    )


def test_settings_body_limit_applies(cache: caches.ClusterCache) -> None:
    settings = config.Settings(body_limit_bytes=2048)
    with TestClient(apps.create_app(fakes.make_deps(cache, settings=settings))) as c:
        r = c.post("/filter", content=json.dumps(_args(fakes.gpu_pod("p"), ["n"] * 1000)))
    assert r.status_code == 413


def test_bind_waits_for_a_node_lock_held_by_another_pods_allocate(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder()
    binder.locks["n-free"] = "default/other"
    deps = fakes.make_deps(cache, binder)
    clock = [0.0]
    deps.flow.clock = lambda: clock[0]

    async def release_later() -> None:
        await asyncio.sleep(0.05)
        binder.release("n-free")  # the other pod's Allocate is done; the node watch reports it

    async def run() -> binds.Outcome:
        deps.flow.remember(resources.parse_pod(fakes.gpu_pod("p", mem=1000)))
        args = wire.ExtenderBindingArgs("p", "default", "uid-p", "n-free")
        releaser = asyncio.create_task(release_later())
        out = await deps.flow.bind(args)
        await releaser
        return out

    outcome = asyncio.run(run())
    assert outcome.ok and outcome.result is binds.Result.BOUND and outcome.error == ""
    assert binder.bound == {"default/p": "n-free"}
    assert [c[0] for c in binder.calls].count("lock") >= 2  # contention first, then taken
    # With no time left to wait, contention is an error and everything is rolled back.
    binder.locks["n-free"] = "default/other"
    impatient = fakes.make_deps(cache, binder, settings=config.Settings(lock_wait_s=0.0))
    impatient.flow.remember(resources.parse_pod(fakes.gpu_pod("q", mem=1000)))
    err = asyncio.run(impatient.flow.bind(wire.ExtenderBindingArgs("q", "default", "uid-q", "n-free")))
    assert err.result is binds.Result.FAILED and err.error.startswith("lock failed")
    assert cache.pod_state("default/q") is None
    assert binder.locks == {"n-free": "default/other"}
    assert fakes.usage(cache, "n-free") == [(1, 1000, 0)]  # p alone


def test_capacity_freed_nudges_kube_scheduler_only_while_pods_wait(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder()
    deps = fakes.make_deps(cache, binder)
    with TestClient(apps.create_app(deps)) as c:
        c.post("/filter", json=_args(fakes.gpu_pod("ok", mem=1000), ["n-free"]))
    flow = deps.flow

    async def freed() -> None:
        flow.capacity_freed("n-free")
        await asyncio.sleep(0.01)

    asyncio.run(freed())
    assert binder.touched == []  # nobody waits
    flow.mark_unschedulable("uid-big", True)
    clock = [1000.0]
    flow.clock = lambda: clock[0]
    flow.mark_unschedulable("uid-big", True)
    asyncio.run(freed())
    assert [n for n, _ in binder.touched] == ["n-free"]
    assert "gpuslice.io/capacity-freed" in binder.touched[0][1]
    # A second release on the node within the 1 s period is not dropped: it is served at the
    # period's end (here 0.5 s later; the fake clock stands still, so the sleep is the full period).
    clock[0] = 1000.5

    async def freed_and_wait() -> None:
        flow.capacity_freed("n-free")
        flow.capacity_freed("n-free")  # coalesced with the pending one
        await asyncio.sleep(0.6)

    asyncio.run(freed_and_wait())
    assert [n for n, _ in binder.touched] == ["n-free", "n-free"]
    flow.mark_unschedulable("uid-big", False)
    flow.capacity_freed("n-two")
    assert [n for n, _ in binder.touched] == ["n-free", "n-free"]


def test_bind_of_a_pod_without_gpus_only_posts_the_binding(
    client: TestClient, cache: caches.ClusterCache, binder: fakes.FakeBinder
) -> None:
    pod = {"metadata": {"name": "cpu", "uid": "u-cpu"}, "spec": {"containers": [{"name": "c"}]}}
    client.post("/filter", json=_args(pod, ["n-free"]))
    r = client.post(
        "/bind", json={"PodName": "cpu", "PodNamespace": "default", "PodUID": "u-cpu", "Node": "n-free"}
    )
    assert r.json() == {"Error": ""}
    assert [c[0] for c in binder.calls] == ["bind"]
    assert binder.bound == {"default/cpu": "n-free"}
    assert cache.pod_state("default/cpu") is None
    assert fakes.usage(cache, "n-free") == [(0, 0, 0)]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
pod_like = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {}, optional={"name": json_values, "uid": json_values, "annotations": json_values}
        ),
        "spec": st.fixed_dictionaries(
            {}, optional={"containers": json_values, "initContainers": json_values}
        ),
    }
)


def _registered_then_removed() -> caches.ClusterCache:
    cache = fakes.cluster_cache(node("n-free").gpus(1), node("n-two").gpus(2))
    cache.snapshot()  # the columns now hold both rows; removing a node frees its row, it stays
    cache.remove_node("n-free")
    cache.remove_node("n-two")
    return cache


CLUSTERS: dict[str, Callable[[], caches.ClusterCache]] = {
    "four-nodes": _cache,
    "empty": fakes.cluster_cache,
    "single-node": lambda: fakes.cluster_cache(node("n-free").gpus(1)),
    "all-removed": _registered_then_removed,
    "zero-cards": lambda: fakes.cluster_cache(node("n-free"), node("n-two")),
}
"""Caches the HTTP tests run on: the fixture's four nodes, and clusters with one or no GPU node."""


@settings(max_examples=200, deadline=None)
@given(
    cluster=st.sampled_from(sorted(CLUSTERS)),
    path=st.sampled_from(["/filter", "/prioritize", "/bind", "/preempt"]),
    body=st.one_of(
        json_values,
        st.fixed_dictionaries({"Pod": st.one_of(pod_like, json_values), "NodeNames": json_values}),
        st.fixed_dictionaries(
            {"PodName": json_values, "PodNamespace": json_values, "PodUID": json_values, "Node": json_values}
        ),
    ),
)
def test_any_json_body_is_answered_without_5xx(cluster: str, path: str, body: Any) -> None:
    deps = fakes.make_deps(CLUSTERS[cluster](), invalid=INVALID)
    with TestClient(apps.create_app(deps), raise_server_exceptions=False) as client:
        r = client.post(path, content=json.dumps(body))
    assert r.status_code in (200, 400), (r.status_code, r.text)
    assert "Traceback" not in r.text


@pytest.mark.parametrize("verbosity", [0, 5])
@pytest.mark.parametrize("cluster", ["empty", "all-removed", "zero-cards"])
@pytest.mark.parametrize("policy", registry.names(), ids=str)
def test_every_verb_answers_a_cluster_without_gpu_nodes(cluster: str, policy: str, verbosity: int) -> None:
    # Before any GPU node registered, after every one left (their column rows stay, freed), or
    # with registrations that list no card: every node is NodeUnregistered, nothing is kept or bound.
    binder = fakes.FakeBinder()
    deps = fakes.make_deps(CLUSTERS[cluster](), binder, settings=config.Settings(verbosity=verbosity))
    ann = {keys.NODE_SCHEDULER_POLICY: policy, keys.GPU_SCHEDULER_POLICY: policy}
    pod = fakes.gpu_pod("p", mem=8000, cores=30, annotations=ann)
    names = ["n-free", "n-two", "ghost"]
    victims = {"Pods": [{"UID": "v1"}], "NumPDBViolations": 0}
    with TestClient(apps.create_app(deps)) as c:
        assert c.post("/filter", json=_args(pod, names)).json() == {
            "NodeNames": [],
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": dict.fromkeys(names, "NodeUnregistered"),
            "Error": "",
        }
        scores = c.post("/prioritize", json=_args(pod, names)).json()
        assert [h["Host"] for h in scores] == names
        if policy != "random":  # random's candidate step crowns one of whatever nodes it is sent
            assert [h["Score"] for h in scores] == [0, 0, 0]
        preempt = {
            "Pod": pod,
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": dict.fromkeys(names, victims),
        }
        assert c.post("/preempt", json=preempt).json() == {"NodeNameToMetaVictims": {}}
        bound = c.post("/bind", json={**BIND_P, "Node": "n-free"})
    assert bound.status_code == 200 and bound.json()["Error"] != ""
    assert binder.bound == {}


@pytest.mark.parametrize("policy", registry.names(), ids=str)
def test_prioritize_scores_do_not_depend_on_the_log_level(policy: str) -> None:
    # A cold prioritize (no filter of this pod here) over nodes the pod does not fit: n-full has
    # 3920 MiB free for 8000, ghost is unknown. They score 0 at -v 4 too (it once scored them).
    pod = fakes.gpu_pod("p", mem=8000, annotations={keys.NODE_SCHEDULER_POLICY: policy})
    names = ["n-free", "n-full", "n-two", "n-half", "ghost"]
    answers = []
    for verbosity in (0, 4):
        deps = fakes.make_deps(_cache(), settings=config.Settings(verbosity=verbosity))
        with TestClient(apps.create_app(deps)) as c:
            answers.append(c.post("/prioritize", json=_args(pod, names)).json())
    assert answers[0] == answers[1]
    assert {h["Host"]: h["Score"] for h in answers[1]}["n-full"] == 0


# ----------------------------------------------------------------------------- generated clusters

CLUSTER_NODES = ("n0", "n1", "n2")
NO_SUCH_NODE = "ghost"
TEAM_QUOTA_NS = "team"


@st.composite
def _inventories(draw: st.DrawFn, name: str) -> builders.NodeBuilder:
    b = node(name)
    for _ in range(draw(st.sampled_from([0, 0, 1, 2, 3, 8, 9, 16]))):
        b.card(
            model=draw(st.sampled_from([builders.A100, builders.V100])),
            memory=draw(st.sampled_from([16384, 81920])),
            slots=draw(st.sampled_from([1, 10])),
            numa=draw(st.integers(0, 1)),
            health=draw(st.booleans() | st.just(True)),
        )
    return b


@st.composite
def gpu_clusters(draw: st.DrawFn) -> caches.ClusterCache:
    """A real cache of 0-3 nodes, each registered (0-16 cards), registered then removed, or
    removed and registered again, some with a running pod on card 0, and maybe a team quota.

    Snapshots are taken in between at random: when the columns freeze decides which rows they
    hold (a removed node's row stays, freed, until a new node takes it).
    """
    cache = fakes.cluster_cache()
    for name in draw(st.lists(st.sampled_from(CLUSTER_NODES), unique=True, max_size=len(CLUSTER_NODES))):
        fate = draw(st.sampled_from(["registered", "removed", "re-registered"]))
        for step in range(2 if fate == "re-registered" else 1):
            inventory = draw(_inventories(name)).inventory()
            cache.upsert_node(inventory)
            running = draw(st.booleans())
            if inventory.devices and running:
                grant = (0, draw(st.integers(0, inventory.devices[0].memory_mib)), draw(st.integers(0, 100)))
                fakes.charge(cache, f"other/{name}-{step}", name, grant)
            if draw(st.booleans()):
                cache.snapshot()
            if fate != "registered" and step == 0:
                cache.remove_node(name)
                if draw(st.booleans()):
                    cache.snapshot()
    if draw(st.booleans()):
        limits = st.none() | st.integers(0, 100_000)
        cache.set_quota(
            TEAM_QUOTA_NS,
            quotas.QuotaView(count_limit=draw(st.none() | st.integers(0, 4)), memory_limit=draw(limits)),
        )
    return cache


@st.composite
def gpu_pods(draw: st.DrawFn) -> dict[str, Any]:
    """A pod as kube-scheduler sends it: GPU limits (count, MiB, percentage, cores) on app and init
    containers, selector and policy annotations, in a namespace with or without quota."""

    def container(name: str) -> dict[str, Any]:
        limits: dict[str, str] = {}
        for resource, values in (
            ("nvidia.com/gpu", st.integers(0, 17)),
            ("nvidia.com/gpumem", st.integers(0, 90_000)),
            ("nvidia.com/gpumem-percentage", st.integers(0, 100)),
            ("nvidia.com/gpucores", st.integers(0, 100)),
        ):
            if draw(st.booleans()):
                limits[resource] = str(draw(values))
        return {"name": name, "resources": {"limits": limits}}

    options = {
        keys.USE_GPU_TYPE: st.sampled_from(["A100", "V100"]),
        keys.NOUSE_GPU_TYPE: st.just("V100"),
        keys.USE_GPU_UUID: st.just(builders.uuid("n0", 0)),
        keys.NOUSE_GPU_UUID: st.just(builders.uuid("n1", 0)),
        keys.NUMA_BIND: st.just("true"),
        keys.NUMA_HINT: st.sampled_from(["0", "1"]),
        keys.NODE_SCHEDULER_POLICY: st.sampled_from(registry.names()),
        keys.GPU_SCHEDULER_POLICY: st.sampled_from(
            [*registry.names(), "mutex", "binpack,numa", "mutex,topology-aware"]
        ),
    }
    chosen = draw(st.sets(st.sampled_from(sorted(options)), max_size=3))  # mostly none or few
    annotations = {k: draw(options[k]) for k in sorted(chosen)}
    spec: dict[str, Any] = {
        "containers": [container(f"c{i}") for i in range(draw(st.integers(1, 2)))],
        "initContainers": [container(f"i{i}") for i in range(draw(st.integers(0, 1)))],
        "schedulerName": "gpuslice-scheduler",
    }
    namespace = draw(st.sampled_from(["default", TEAM_QUOTA_NS]))
    meta = {"name": "p", "namespace": namespace, "uid": "uid-p", "annotations": annotations}
    return {"metadata": meta, "spec": spec}


def _without_gpus(cache: caches.ClusterCache, names: list[str]) -> set[str]:
    """The names with no registered GPU: unknown to the cache, removed, or registered with no card."""
    known = cache.snapshot().nodes
    return {n for n in names if n not in known or not known[n].inventory.devices}


@settings(max_examples=150, deadline=None)
@given(
    cache=gpu_clusters(),
    pod=gpu_pods(),
    names=st.lists(st.sampled_from((*CLUSTER_NODES, NO_SUCH_NODE)), unique=True),
    verbosity=st.sampled_from([0, 4, 5]),
    default_policy=st.sampled_from(registry.names()),
    choice=st.sampled_from(model_config.NODE_CHOICES),
)
def test_every_verb_on_generated_clusters_and_pods(
    cache: caches.ClusterCache,
    pod: dict[str, Any],
    names: list[str],
    verbosity: int,
    default_policy: str,
    choice: str,
) -> None:
    # filter, prioritize (the filter's candidates, and cold over every name), preempt and bind on
    # clusters of 0, 1 and several nodes: never a 5xx, and never a node without GPUs for a GPU pod.
    settings_ = config.Settings(
        verbosity=verbosity, node_policy=default_policy, card_policy=default_policy, node_choice=choice
    )
    key = f"{pod['metadata']['namespace']}/p"
    binder = fakes.FakeBinder(pods={key: pod})
    deps = fakes.make_deps(cache, binder, settings=settings_)
    try:
        parsed: Any = resources.parse_pod(pod, settings_.request_config)
    except codec_errors.DecodeError:
        parsed = None
    gpu_pod = parsed is not None and parsed.wants_gpu
    no_gpu = _without_gpus(cache, names)
    overcommitted = set(fakes.overcommitted(cache))  # a node re-registered with smaller cards
    victims = {"Pods": [{"UID": "v1"}], "NumPDBViolations": 0}
    with TestClient(apps.create_app(deps)) as c:
        r = c.post("/filter", json=_args(pod, names))
        assert r.status_code == 200, r.text
        body = r.json()
        feasible, failed, unresolvable = (
            body["NodeNames"],
            body["FailedNodes"],
            body["FailedAndUnresolvableNodes"],
        )
        answered = [*feasible, *failed, *unresolvable]
        assert len(answered) == len(set(answered))
        if choice == "extender" and gpu_pod:  # the other feasible nodes are left out of the answer
            assert len(feasible) <= 1 and set(answered) <= set(names)
        else:
            assert sorted(answered) == sorted(names)
        if parsed is None:
            assert unresolvable == dict.fromkeys(names, "InvalidRequest")
        elif not gpu_pod:
            assert feasible == names
        else:
            assert {n: unresolvable.get(n) for n in no_gpu} == dict.fromkeys(no_gpu, "NodeUnregistered")
        for candidates, uid in ((feasible, "uid-p"), (names, "uid-cold")):
            cold = {**pod, "metadata": {**pod["metadata"], "uid": uid}}
            r = c.post("/prioritize", json=_args(cold, candidates))
            assert r.status_code == 200, r.text
            assert [h["Host"] for h in r.json()] == candidates
            assert all(0 <= h["Score"] <= 10 for h in r.json())
        r = c.post("/preempt", json={"Pod": pod, "NodeNameToMetaVictims": dict.fromkeys(names, victims)})
        assert r.status_code == 200, r.text
        if gpu_pod:
            assert not no_gpu & set(r.json()["NodeNameToMetaVictims"])
        target = (feasible or names or [NO_SUCH_NODE])[0]
        r = c.post("/bind", json={**BIND_P, "PodNamespace": pod["metadata"]["namespace"], "Node": target})
        assert r.status_code == 200, r.text
    if gpu_pod and target in no_gpu | {NO_SUCH_NODE}:
        assert r.json()["Error"] != "" and binder.bound == {}
    assert set(fakes.overcommitted(cache)) <= overcommitted


@pytest.mark.parametrize("choice", ["extender", "rank", "blend"])
@pytest.mark.parametrize("policy", registry.names(), ids=str)
def test_every_registered_policy_serves_filter_prioritize_and_bind(
    cache: caches.ClusterCache, policy: str, choice: str
) -> None:
    binder = fakes.FakeBinder()
    binder.plugin_releases_lock = True
    deps = fakes.make_deps(cache, binder, config.Settings(node_choice=choice, workload_period_s=0))
    ann = {keys.NODE_SCHEDULER_POLICY: policy, keys.GPU_SCHEDULER_POLICY: policy}
    names = ["n-free", "n-two", "n-half"]
    with TestClient(apps.create_app(deps)) as c:
        for k in range(3):  # several pods, so the workload histogram (FGD's target) is non-empty
            pod = fakes.gpu_pod(f"p{k}", mem=8000, cores=30, annotations=ann)
            feasible = c.post("/filter", json=_args(pod, names)).json()["NodeNames"]
            if choice == "extender":  # the filter answers its choice alone
                assert len(feasible) == 1 and feasible[0] in names
            else:
                assert feasible == names
            scores = c.post("/prioritize", json=_args(pod, feasible)).json()
            assert [h["Host"] for h in scores] == feasible and all(0 <= h["Score"] <= 10 for h in scores)
            if choice == "rank":  # distinct ranks from 10 down
                assert sorted((h["Score"] for h in scores), reverse=True) == [10, 9, 8]
            best = max(scores, key=lambda h: h["Score"])["Host"]
            r = c.post(
                "/bind",
                json={"PodName": f"p{k}", "PodNamespace": "default", "PodUID": f"uid-p{k}", "Node": best},
            )
            assert r.json() == {"Error": ""}
    assert len(binder.bound) == 3 and fakes.overcommitted(cache) == []
    assert all(cache.pod_state(k) is caches.PodState.ASSUMED for k in binder.bound)


def test_verbose_logs_one_line_per_node_and_card(
    cache: caches.ClusterCache, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    deps = fakes.make_deps(cache, settings=config.Settings(verbosity=5))
    with caplog.at_level(logging.INFO, logger="gpuslice.extender"), TestClient(apps.create_app(deps)) as c:
        c.post("/filter", json=_args(fakes.gpu_pod("p", mem=8000), ["n-free", "n-full", "n-two"]))
    lines = [r.getMessage() for r in caplog.records]
    node_lines = [m for m in lines if m.startswith("filter node ")]
    card_lines = [m for m in lines if m.startswith("filter card ")]
    assert len(node_lines) == 3  # one per node
    assert len(card_lines) == 4  # one per card: 1 + 1 + 2
    assert any("node=n-full feasible=False" in m and "InsufficientGPUMemory" in m for m in node_lines)
    assert any("uuid=GPU-n-two-1" in m and "free_mem=81920" in m and "req_mem=8000" in m for m in card_lines)


def test_parsed_requests_are_reused_only_for_the_same_resource_version(client: TestClient) -> None:
    one = fakes.gpu_pod("p", gpu=1)
    one["metadata"]["resourceVersion"] = "1"
    assert client.post("/filter", json=_args(one, ["n-free"])).json()["NodeNames"] == ["n-free"]
    two = fakes.gpu_pod("p", gpu=2)  # same UID, changed: a new resourceVersion
    two["metadata"]["resourceVersion"] = "2"
    body = client.post("/filter", json=_args(two, ["n-free"])).json()
    assert body["FailedAndUnresolvableNodes"] == {"n-free": "InsufficientGPUCount"}


def test_prioritize_applies_bestfit_min_max_step_over_the_candidates(blend_client: TestClient) -> None:
    client = blend_client
    # BestFit is defined relative to the candidates: (raw - lo) * 100 // (hi - lo). The emptiest
    # candidate (n-free) must map to 0 and the fullest (n-half) to 100 -> wire 10, whatever the raw
    # values; without the batch step both would keep their raw scores.
    pod = fakes.gpu_pod("p", mem=8000, cores=30, annotations={keys.NODE_SCHEDULER_POLICY: "bestfit"})
    body = client.post("/prioritize", json=_args(pod, ["n-free", "n-half"])).json()
    assert [h["Score"] for h in body] == [0, 10]


def test_pods_sharing_a_spec_get_their_own_identity_from_the_spec_memo() -> None:
    parsed = apps._Requests(config.Settings())
    decode = msgspec.json.Decoder(wire.Pod).decode
    a = parsed.parse(decode(json.dumps(_versioned(fakes.gpu_pod("a", mem=4000), "1"))))
    b = parsed.parse(decode(json.dumps(_versioned(fakes.gpu_pod("b", mem=4000, namespace="team"), "1"))))
    assert not isinstance(a, status.Status) and not isinstance(b, status.Status)
    assert (a.namespace, a.name, a.uid) == ("default", "a", "uid-a")
    assert (b.namespace, b.name, b.uid) == ("team", "b", "uid-b")
    assert a.containers == b.containers  # 1 card, 4000 MiB each
    bad = fakes.gpu_pod("c", mem=4000)
    bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "lots"
    bad_twin = fakes.gpu_pod("d", mem=4000)
    bad_twin["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "lots"
    first, second = parsed.parse(decode(json.dumps(bad))), parsed.parse(decode(json.dumps(bad_twin)))
    assert isinstance(first, status.Status) and first == second
    assert first.reasons == (status.INVALID_REQUEST,) and "gpumem" in first.message


def test_filter_before_any_gpu_node_registered_names_every_node_unregistered() -> None:
    # An extender that starts before any GPU node registered must answer, not crash (a 500 before).
    deps = fakes.make_deps(fakes.cluster_cache())
    with TestClient(apps.create_app(deps)) as client:
        resp = client.post("/filter", json={"Pod": fakes.gpu_pod("p", mem=1000), "NodeNames": ["x", "y"]})
    assert resp.status_code == 200
    body = resp.json()
    assert body["NodeNames"] == [] and body["FailedAndUnresolvableNodes"] == {
        "x": "NodeUnregistered",
        "y": "NodeUnregistered",
    }


@pytest.mark.parametrize(("follower", "closes"), [(False, False), (True, True)])
def test_a_follower_closes_keep_alive_connections(follower: bool, closes: bool) -> None:
    # A Service sends only new connections to the leader: a deposed leader must not keep
    # kube-scheduler's keep-alive connection (every verb's answer then says Connection: close).
    deps = fakes.make_deps(fakes.cluster_cache(), follower=follower, leading=lambda: not follower)
    with TestClient(apps.create_app(deps)) as client:
        for path, body in (
            ("/filter", {"Pod": fakes.gpu_pod("p", mem=1000), "NodeNames": []}),
            ("/bind", {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n1"}),
        ):
            resp = client.post(path, json=body)
            assert resp.status_code == 200, path
            assert (resp.headers.get("connection") == "close") is closes, path


def test_a_bound_pod_keeps_its_job_in_the_cache(cache: caches.ClusterCache, client: TestClient) -> None:
    # The bind re-admits its reservation after the truth check; the job must survive that step
    # (the balanced policy's task affinity reads it before the pod watch confirms the pod).
    pod = fakes.gpu_pod("p", mem=1000)
    pod["metadata"]["ownerReferences"] = [{"uid": "owner-1", "controller": True}]
    assert (
        client.post("/filter", content=json.dumps({"Pod": pod, "NodeNames": ["n-free"]})).status_code == 200
    )
    assert client.post("/bind", content=json.dumps(BIND_P)).json() == {"Error": ""}
    assert {job: set(on) for job, on in cache.snapshot().jobs.items()} == {"owner:owner-1": {"n-free"}}
