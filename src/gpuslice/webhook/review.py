"""AdmissionReview on the wire (msgspec), the decisions handlers return, and JSON patches.

Kubernetes sends ``{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request":
{...}}`` and expects the same envelope back with ``response.uid`` equal to ``request.uid``
(Kubernetes docs, "Dynamic Admission Control", webhook request and response). ``v1beta1`` has the
same shape; the answer carries the request's apiVersion. A mutation is an RFC 6902 JSON patch,
base64-encoded, with ``patchType: JSONPatch``.

Nothing here does I/O: ``parse`` turns bytes into a review (``BadReview`` for what deserves an
HTTP 400), ``pod_object`` decodes the reviewed object, ``answer`` encodes a ``Decision``.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

V1 = "admission.k8s.io/v1"
V1BETA1 = "admission.k8s.io/v1beta1"
API_VERSIONS = (V1, V1BETA1)
KIND = "AdmissionReview"
CREATE = "CREATE"
JSON_PATCH = "JSONPatch"


class BadReview(ValueError):
    """A body that is not an AdmissionReview we can answer (HTTP 400)."""


class GroupVersionKind(msgspec.Struct, frozen=True):
    """``request.kind``: what is being admitted."""

    group: str = ""
    version: str = ""
    kind: str = ""


class AdmissionRequest(msgspec.Struct, frozen=True, rename="camel"):
    """The fields of ``request`` the webhook reads (unknown fields are skipped)."""

    uid: str = ""
    kind: GroupVersionKind = GroupVersionKind()
    operation: str = ""
    namespace: str = ""
    name: str = ""
    object_: msgspec.Raw = msgspec.field(name="object", default=msgspec.Raw(b"null"))
    dry_run: bool | None = None


class AdmissionReview(msgspec.Struct, frozen=True, rename="camel"):
    """An incoming review."""

    api_version: str = ""
    kind: str = ""
    request: AdmissionRequest | None = None


class Status(msgspec.Struct, frozen=True, omit_defaults=True):
    """``response.status`` (a ``metav1.Status``): shown to the client when the pod is refused."""

    code: int = 0
    message: str = ""


class AdmissionResponse(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """``response``."""

    uid: str
    allowed: bool
    status: Status | None = None
    patch_type: str | None = None
    patch: str | None = None


class AdmissionReviewOut(msgspec.Struct, frozen=True, rename="camel"):
    """An outgoing review."""

    api_version: str
    kind: str
    response: AdmissionResponse


class PatchOp(msgspec.Struct, frozen=True):
    """One RFC 6902 operation (the webhook only ever adds)."""

    op: str
    path: str
    value: Any


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """What a handler decided about one object.

    Attributes:
        allowed: admit the object.
        message: why (shown to the client when refused; logged otherwise).
        code: HTTP-like status code of a refusal (400 invalid input, 403 forbidden by policy).
        patch: JSON patch operations to apply (mutating route only).
        error: the object could not be decoded (counted as ``error``, not ``denied``).
    """

    allowed: bool
    message: str = ""
    code: int = 0
    patch: tuple[PatchOp, ...] = ()
    error: bool = False

    @property
    def result(self) -> str:
        """The metric label: ``allowed``, ``patched``, ``denied`` or ``error``."""
        if self.error:
            return "error"
        if not self.allowed:
            return "denied"
        return "patched" if self.patch else "allowed"


def allow(message: str = "") -> Decision:
    """Admit unchanged."""
    return Decision(allowed=True, message=message)


def deny(message: str, code: int = 400) -> Decision:
    """Refuse with a message."""
    return Decision(allowed=False, message=message, code=code)


def undecodable(message: str) -> Decision:
    """Refuse an object that cannot be read (counted as an error)."""
    return Decision(allowed=False, message=message, code=400, error=True)


def escape(segment: str) -> str:
    """One JSON Pointer reference token (RFC 6901): ``~`` as ``~0``, ``/`` as ``~1``."""
    return segment.replace("~", "~0").replace("/", "~1")


def pointer(*segments: str | int) -> str:
    """A JSON Pointer from path segments: ``pointer("spec", "containers", 0)``."""
    return "".join("/" + escape(str(s)) for s in segments)


def add(segments: Sequence[str | int], value: Any) -> PatchOp:
    """An ``add`` operation (creates or replaces an object member)."""
    return PatchOp("add", pointer(*segments), value)


_DECODER = msgspec.json.Decoder(AdmissionReview)
_ENCODER = msgspec.json.Encoder()


def parse(body: bytes) -> AdmissionReview:
    """Decode and check an AdmissionReview.

    Raises:
        BadReview: not JSON, not an AdmissionReview of a known version, or without a request uid.
    """
    if not body:
        raise BadReview("empty request body; expected an AdmissionReview")
    try:
        review = _DECODER.decode(body)
    except msgspec.ValidationError as err:
        raise BadReview(f"invalid AdmissionReview: {err}") from None
    except msgspec.DecodeError as err:
        raise BadReview(f"malformed JSON: {err}") from None
    except RecursionError:
        raise BadReview("request nested too deeply to decode") from None
    if review.kind != KIND or review.api_version not in API_VERSIONS:
        raise BadReview(
            f"expected kind {KIND} in {' or '.join(API_VERSIONS)}, "
            f"got kind {review.kind!r} apiVersion {review.api_version!r}"
        )
    if review.request is None or not review.request.uid:
        raise BadReview("AdmissionReview without request.uid")
    return review


def is_pod(request: AdmissionRequest) -> bool:
    """True when the reviewed object is a core/v1 Pod."""
    return request.kind.group == "" and request.kind.kind == "Pod"


def pod_object(request: AdmissionRequest) -> Mapping[str, Any] | Decision:
    """The reviewed object as a dict, or the refusal of one that is not a JSON object."""
    try:
        obj = msgspec.json.decode(request.object_)
    except (msgspec.DecodeError, RecursionError) as err:
        return undecodable(f"cannot decode the pod: {err}")
    if not isinstance(obj, dict):
        return undecodable(f"cannot decode the pod: expected a JSON object, got {type(obj).__name__}")
    return obj


def encode_patch(ops: Sequence[PatchOp]) -> str:
    """The base64 text of a JSON patch."""
    return base64.b64encode(_ENCODER.encode(list(ops))).decode("ascii")


def answer(review: AdmissionReview, decision: Decision) -> bytes:
    """The AdmissionReview answering ``review`` (same apiVersion, same uid) with ``decision``."""
    assert review.request is not None
    status = None
    if not decision.allowed:
        status = Status(code=decision.code or 400, message=decision.message)
    response = AdmissionResponse(
        uid=review.request.uid,
        allowed=decision.allowed,
        status=status,
        patch_type=JSON_PATCH if decision.patch and decision.allowed else None,
        patch=encode_patch(decision.patch) if decision.patch and decision.allowed else None,
    )
    return _ENCODER.encode(AdmissionReviewOut(api_version=review.api_version, kind=KIND, response=response))
