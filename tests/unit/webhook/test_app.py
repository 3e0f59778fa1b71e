from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from gpuslice.codec import resources
from gpuslice.webhook import app as apps
from gpuslice.webhook import metrics, mutate, validate
from tests.unit.webhook.builders import GPU, MEM, PCT, apply_patch, ctr, decode_patch, defaulted, pod, review

pytestmark = pytest.mark.unit


class Knobs:
    def __init__(self) -> None:
        self.max_cards: int | None = None
        self.ready = False


@pytest.fixture
def knobs() -> Knobs:
    return Knobs()


@pytest.fixture
def deps(knobs: Knobs) -> apps.Deps:
    return apps.Deps(
        mutate_options=mutate.Options(),
        validate_options=validate.Options(),
        metrics=metrics.Metrics(),
        log=logging.getLogger("test.webhook"),
        verbosity=4,
        max_cards=lambda: knobs.max_cards,
        ready=lambda: knobs.ready,
    )


@pytest.fixture
def client(deps: apps.Deps) -> Iterator[TestClient]:
    with TestClient(apps.create_app(deps), raise_server_exceptions=False) as c:
        yield c


def _count(deps: apps.Deps, operation: str, result: str) -> float:
    value = deps.metrics.registry.get_sample_value(
        "gpuslice_webhook_requests_total", {"operation": operation, "result": result}
    )
    assert value is not None
    return value


def test_mutate_route_answers_with_patch(client: TestClient, deps: apps.Deps) -> None:
    before = pod(defaulted(ctr("c", limits={MEM: "1000"})))
    r = client.post("/webhook", json=review(before, uid="u-9"))
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    response = body["response"]
    assert response["uid"] == "u-9" and response["allowed"] is True and response["patchType"] == "JSONPatch"
    after = apply_patch(before, decode_patch(response["patch"]))
    assert after["spec"]["schedulerName"] == "gpuslice-scheduler"
    assert after["spec"]["containers"][0]["resources"]["limits"] == {MEM: "1000", GPU: "1"}
    assert resources.parse_pod(after) == resources.parse_pod(before)
    assert _count(deps, "mutate", "patched") == 1


def test_v1beta1_answered_in_v1beta1(client: TestClient) -> None:
    r = client.post("/webhook", json=review(pod(ctr(limits={GPU: "1"})), version="admission.k8s.io/v1beta1"))
    assert r.json()["apiVersion"] == "admission.k8s.io/v1beta1"
    assert r.json()["response"]["allowed"] is True


def test_non_gpu_pod_is_not_patched(client: TestClient, deps: apps.Deps) -> None:
    r = client.post("/webhook", json=review(pod(ctr(limits={"cpu": "1"}))))
    assert r.json()["response"] == {"uid": "uid-1", "allowed": True}
    assert _count(deps, "mutate", "allowed") == 1


def test_validate_route_refuses_with_message(client: TestClient, deps: apps.Deps) -> None:
    r = client.post("/validate", json=review(pod(ctr("train", limits={GPU: "1", PCT: "150"}))))
    assert r.status_code == 200
    response = r.json()["response"]
    assert response["allowed"] is False
    assert response["status"] == {
        "code": 400,
        "message": 'container "train": nvidia.com/gpumem-percentage must be in 1..100, got 150',
    }
    assert _count(deps, "validate", "denied") == 1


def test_validate_uses_current_capacity(client: TestClient, knobs: Knobs) -> None:
    body = review(pod(ctr("big", limits={GPU: "4"})))
    assert client.post("/validate", json=body).json()["response"]["allowed"] is True  # unknown: fail open
    knobs.max_cards = 2
    assert client.post("/validate", json=body).json()["response"]["allowed"] is False
    knobs.max_cards = 4
    assert client.post("/validate", json=body).json()["response"]["allowed"] is True


@pytest.mark.parametrize("route", ["/webhook", "/validate"])
@pytest.mark.parametrize(
    ("data", "fragment"),
    [(b"", "empty request body"), (b"not json", "malformed JSON"), (b'{"kind": "Pod"}', "expected kind")],
)
def test_malformed_reviews_get_400(
    client: TestClient, deps: apps.Deps, route: str, data: bytes, fragment: str
) -> None:
    r = client.post(route, content=data, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert fragment in r.text
    assert _count(deps, "mutate" if route == "/webhook" else "validate", "error") == 1


@pytest.mark.parametrize("route", ["/webhook", "/validate"])
def test_undecodable_pod_is_refused_in_the_review(client: TestClient, deps: apps.Deps, route: str) -> None:
    r = client.post(route, json=review({"spec": {"containers": {"a": 1}}}))
    assert r.status_code == 200
    response = r.json()["response"]
    assert response["allowed"] is False
    assert "cannot decode the pod" in response["status"]["message"]


@pytest.mark.parametrize("route", ["/webhook", "/validate"])
def test_oversized_body_gets_413(client: TestClient, route: str) -> None:
    big: dict[str, Any] = review(pod(ctr(limits={GPU: "1"}), annotations={"x": "y" * apps.BODY_LIMIT}))
    r = client.post(route, content=json.dumps(big).encode(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_oversized_chunked_body_gets_413(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(apps.BODY_LIMIT // 4096 + 2):
            yield b" " * 4096

    r = client.post("/validate", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_health_readiness_and_metrics(client: TestClient, knobs: Knobs) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 503
    knobs.ready = True
    assert client.get("/readyz").status_code == 200
    client.post("/validate", json=review(pod(ctr(limits={GPU: "1"}))))
    knobs.max_cards = 8
    text = client.get("/metrics").text
    assert 'gpuslice_webhook_requests_total{operation="validate",result="allowed"} 1.0' in text
    assert 'gpuslice_webhook_request_duration_seconds_count{operation="validate"} 1.0' in text
    assert "gpuslice_webhook_max_node_cards 8.0" in text


def test_get_on_review_routes_is_405(client: TestClient) -> None:
    assert client.get("/webhook").status_code == 405


def test_internal_failure_is_a_500_counted_as_error(deps: apps.Deps) -> None:
    def broken() -> int | None:
        raise RuntimeError("boom")

    deps.max_cards = broken
    with TestClient(apps.create_app(deps), raise_server_exceptions=False) as c:
        r = c.post("/validate", json=review(pod(ctr(limits={GPU: "1"}))))
    assert r.status_code == 500
    assert _count(deps, "validate", "error") == 1
