"""Per-pod policy annotations through the HTTP app: HAMi chains, unknown values, scoring weights."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from gpuslice.cache import cache as caches
from gpuslice.codec import keys
from gpuslice.extender.http import app as apps
from tests.unit.builders import node
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit


def _cache() -> caches.ClusterCache:
    cache = fakes.cluster_cache(node("n-two").gpus(2), node("n-one").gpus(1))
    fakes.charge(cache, "other/a", "n-one", (0, 1000, 0))
    return cache


def _filter(client: TestClient, pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    body: dict[str, Any] = client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": names}).json()
    return body


@pytest.mark.parametrize(
    "value", ["binpack,numa", "numa,spread", "mutex,spread", "mutex,topology-aware", "numa"]
)
def test_hami_chains_are_scheduled_not_refused(value: str) -> None:
    deps = fakes.make_deps(_cache())
    with TestClient(apps.create_app(deps)) as c:
        pod = fakes.gpu_pod("p", mem=1000, annotations={keys.GPU_SCHEDULER_POLICY: value})
        body = _filter(c, pod, ["n-two"])
        assert body["NodeNames"] == ["n-two"], body
        r = c.post(
            "/bind", json={"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n-two"}
        )
        assert r.json()["Error"] == ""


def test_mutex_refuses_a_node_whose_only_card_is_in_use() -> None:
    deps = fakes.make_deps(_cache())
    with TestClient(apps.create_app(deps)) as c:
        pod = fakes.gpu_pod("p", mem=1000, annotations={keys.GPU_SCHEDULER_POLICY: "mutex"})
        body = _filter(c, pod, ["n-one", "n-two"])
    assert body["NodeNames"] == ["n-two"]
    assert body["FailedNodes"] == {"n-one": "ExclusiveConflict"}


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        (keys.GPU_SCHEDULER_POLICY, "binpakc"),
        (keys.GPU_SCHEDULER_POLICY, "binpack,nmua"),
        (keys.GPU_SCHEDULER_POLICY, "binpack,"),
        (keys.NODE_SCHEDULER_POLICY, "numa"),
        (keys.NODE_SCHEDULER_POLICY, "binpack,spread"),
    ],
)
def test_an_unknown_policy_override_falls_back_to_the_default_with_one_warning(
    annotation: str, value: str
) -> None:
    deps = fakes.make_deps(_cache())
    with TestClient(apps.create_app(deps)) as c:
        pod = fakes.gpu_pod("p", mem=1000, annotations={annotation: value})
        assert _filter(c, pod, ["n-two"])["NodeNames"] == ["n-two"]
        assert _filter(c, pod, ["n-two"])["NodeNames"] == ["n-two"]
    assert isinstance(deps.events, fakes.RecordedEvents)
    warnings = [e for e in deps.events.events if e[2] == "PolicyIgnored"]
    assert len(warnings) == 1, deps.events.events
    assert warnings[0][1] == "Warning" and annotation in warnings[0][3] and repr(value) in warnings[0][3]


def test_scoring_weights_choose_the_card_at_bind() -> None:
    # card 0: 3 of 10 slots, no memory; card 1: 1 slot, 6000 of 10000 MiB. With slot=5 card 0 is
    # the fuller one for binpack (5 * 4/10 + 0.1 = 2.1 against 5 * 2/10 + 0.7 = 1.7); without
    # weights card 1 is (memory and cores weigh, slots do not)
    cache = fakes.cluster_cache(node("n").gpus(2, memory=10000))
    fakes.charge(cache, "other/a", "n", (0, 0, 0))
    fakes.charge(cache, "other/b", "n", (0, 0, 0))
    fakes.charge(cache, "other/c", "n", (0, 0, 0))
    fakes.charge(cache, "other/d", "n", (1, 6000, 0))
    weights = {keys.GPU_SCHEDULER_POLICY: "binpack", keys.DEVICE_SCORING_WEIGHTS: "slot=5,core=0,memory=1"}
    plain = {keys.GPU_SCHEDULER_POLICY: "binpack"}
    got = {}
    for name, given in (("w", weights), ("plain", plain)):
        deps = fakes.make_deps(cache)
        with TestClient(apps.create_app(deps)) as c:
            pod = fakes.gpu_pod(name, mem=1000, annotations=given)
            assert _filter(c, pod, ["n"])["NodeNames"] == ["n"]
            r = c.post(
                "/bind",
                json={"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}", "Node": "n"},
            )
            assert r.json()["Error"] == ""
        alloc = cache.pod_allocation(f"default/{name}")
        assert alloc is not None
        got[name] = alloc.containers[0][0].uuid
        cache.remove_pod(f"default/{name}")
    assert got == {"w": "GPU-n-0", "plain": "GPU-n-1"}
