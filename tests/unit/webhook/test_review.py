from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import pytest

from gpuslice.webhook import mutate, review, validate
from tests.unit.webhook.builders import GPU, PCT, ctr, decode_patch, pod
from tests.unit.webhook.builders import review as make_review

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("segments", "expected"),
    [
        (("spec", "schedulerName"), "/spec/schedulerName"),
        (
            ("spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"),
            "/spec/containers/0/resources/limits/nvidia.com~1gpu",
        ),
        (("a~b", "c/d~/e"), "/a~0b/c~1d~0~1e"),
    ],
)
def test_pointer_escapes_rfc6901(segments: tuple[str | int, ...], expected: str) -> None:
    assert review.pointer(*segments) == expected


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"", "empty request body"),
        (b"{", "malformed JSON"),
        (b"[]", "invalid AdmissionReview"),
        (json.dumps({"apiVersion": "v1", "kind": "Pod"}).encode(), "expected kind AdmissionReview"),
        (
            json.dumps({"apiVersion": "admission.k8s.io/v2", "kind": "AdmissionReview"}).encode(),
            "admission.k8s.io/v2",
        ),
        (
            json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
            "request.uid",
        ),
        (
            json.dumps(
                {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 5}}
            ).encode(),
            "invalid AdmissionReview",
        ),
        (
            b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":'
            + b"[" * 100_000
            + b"]" * 100_000
            + b"}}",
            "nested too deeply",
        ),
    ],
)
def test_parse_refuses_what_is_not_a_review(body: bytes, fragment: str) -> None:
    with pytest.raises(review.BadReview, match=fragment):
        review.parse(body)


def _answer(decision: review.Decision, version: str = review.V1) -> dict[str, Any]:
    parsed = review.parse(json.dumps(make_review({}, version=version, uid="abc")).encode())
    out: dict[str, Any] = json.loads(review.answer(parsed, decision))
    return out


@pytest.mark.parametrize("version", [review.V1, review.V1BETA1])
def test_answer_echoes_version_and_uid(version: str) -> None:
    out = _answer(review.allow("fine"), version)
    assert out == {
        "apiVersion": version,
        "kind": "AdmissionReview",
        "response": {"uid": "abc", "allowed": True},
    }


def test_answer_carries_base64_json_patch() -> None:
    decision = review.Decision(allowed=True, patch=(review.add(["spec", "schedulerName"], "s"),))
    response = _answer(decision)["response"]
    assert response["patchType"] == "JSONPatch"
    assert decode_patch(response["patch"]) == [{"op": "add", "path": "/spec/schedulerName", "value": "s"}]


def test_denial_carries_status_code_and_message() -> None:
    response = _answer(review.deny("no", 403))["response"]
    assert response == {"uid": "abc", "allowed": False, "status": {"code": 403, "message": "no"}}


def test_pod_object_refuses_non_objects() -> None:
    for obj, fragment in ((None, "got NoneType"), ([1], "got list"), ("x", "got str")):
        request = review.parse(json.dumps(make_review(obj)).encode()).request
        assert request is not None
        decision = review.pod_object(request)
        assert isinstance(decision, review.Decision) and decision.error and fragment in decision.message


def _admit(obj: Any, **kw: Any) -> tuple[review.Decision, review.Decision]:
    request = review.parse(json.dumps(make_review(obj, **kw)).encode()).request
    assert request is not None
    return mutate.admit(request, mutate.Options()), validate.admit(request, validate.Options(), None)


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_only_creation_is_judged(operation: str) -> None:
    bad = pod(ctr(limits={GPU: "1", PCT: "900"}), node_name="n")
    for decision in _admit(bad, operation=operation):
        assert decision.allowed and decision.patch == ()


def test_other_kinds_pass() -> None:
    for decision in _admit({"spec": {}}, kind="Deployment"):
        assert decision.allowed and decision.patch == ()


def test_create_of_gpu_pod_is_judged() -> None:
    mutated, validated = _admit(pod(ctr(limits={GPU: "1", PCT: "900"})))
    assert mutated.allowed and mutated.patch
    assert not validated.allowed


def test_decision_results() -> None:
    assert review.allow().result == "allowed"
    assert review.deny("x").result == "denied"
    assert review.undecodable("x").result == "error"
    assert review.Decision(allowed=True, patch=(review.add(["a"], 1),)).result == "patched"
    assert msgspec.json.decode(base64.b64decode(review.encode_patch([]))) == []
