"""Our own error hierarchy for Kubernetes API I/O, wrapped at the boundary.

Nothing outside ``gpuslice.kube`` sees an httpx2 or lightkube exception: every request path maps
transport failures and non-2xx answers onto these classes and chains the original as the cause.

Retry intent lives in the type. ``TemporaryError`` says "the same request may succeed later" and
carries a suggested ``delay`` (seconds; the apiserver's ``Retry-After`` when it sent one);
``PermanentError`` says "retrying the same request is useless". Every concrete class is exactly one
of the two::

    ApiError
      ApiClientError (4xx, permanent)      NotFound 404, Conflict 409, Gone 410, Invalid 422
      TooManyRequests (429, temporary)
      ApiServerError (5xx, temporary)
      ApiUnavailable (transport: connect/read failure, timeout; temporary)
"""

from __future__ import annotations

from typing import ClassVar

import httpx2
import msgspec

DEFAULT_RETRY_DELAY = 1.0
"""Suggested delay (seconds) of a temporary error when the server named none."""


class TemporaryError(Exception):
    """Marker: the same request may succeed later; wait ``delay`` seconds first."""

    delay: float = DEFAULT_RETRY_DELAY


class PermanentError(Exception):
    """Marker: retrying the same request is useless."""


class ApiError(Exception):
    """A Kubernetes API request failed.

    Attributes:
        code: HTTP status code (0 for a transport failure).
        reason: the ``Status.reason`` the apiserver sent (e.g. ``AlreadyExists``), or ''.
        message: a human-readable message.
        delay: suggested seconds before a retry (meaningful for temporary errors).
    """

    default_code: ClassVar[int] = 0

    def __init__(
        self, message: str, *, code: int | None = None, reason: str = "", delay: float | None = None
    ):
        super().__init__(message)
        self.message = message
        self.code = self.default_code if code is None else code
        self.reason = reason
        self.delay = DEFAULT_RETRY_DELAY if delay is None else delay

    def __str__(self) -> str:
        prefix = f"{self.code} {self.reason}".strip() if self.code else "unavailable"
        return f"{prefix}: {self.message}"


class ApiClientError(ApiError, PermanentError):
    """The apiserver rejected the request (4xx)."""

    default_code = 400


class NotFound(ApiClientError):
    """404: the object (or its namespace) does not exist."""

    default_code = 404


class Conflict(ApiClientError):
    """409: a resourceVersion precondition failed, the object exists, or the pod is already bound."""

    default_code = 409


class Gone(ApiClientError):
    """410: the resourceVersion is too old (compacted); list again."""

    default_code = 410


class Invalid(ApiClientError):
    """422: the object failed validation."""

    default_code = 422


class TooManyRequests(ApiError, TemporaryError):
    """429: API priority and fairness throttled the request (a 4xx, but worth retrying)."""

    default_code = 429


class ApiServerError(ApiError, TemporaryError):
    """The apiserver failed (5xx)."""

    default_code = 500


class ApiUnavailable(ApiError, TemporaryError):
    """No answer: connection refused or reset, TLS failure, or a timeout."""

    default_code = 0


_BY_CODE: dict[int, type[ApiError]] = {
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


class _Status(msgspec.Struct):
    """The fields of a ``meta/v1 Status`` body we read."""

    message: str = ""
    reason: str = ""
    code: int = 0


_STATUS_DECODER = msgspec.json.Decoder(_Status)


def class_for(code: int) -> type[ApiError]:
    """The error class for an HTTP status code >= 400."""
    if code in _BY_CODE:
        return _BY_CODE[code]
    if 400 <= code < 500:
        return ApiClientError
    return ApiServerError


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (integer form only), or None."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def from_status(code: int, body: bytes, *, retry_after: str | None = None, what: str = "") -> ApiError:
    """Build the error for a non-2xx answer.

    Args:
        code: HTTP status code (>= 400).
        body: response body; a ``Status`` object when the apiserver produced it.
        retry_after: the ``Retry-After`` header, if any.
        what: a short description of the request (e.g. ``PATCH /api/v1/nodes/n1``) for the message.

    Returns:
        The matching ``ApiError`` subclass instance (not raised).
    """
    try:
        status = _STATUS_DECODER.decode(body)
        message, reason = status.message, status.reason
    except (msgspec.DecodeError, msgspec.ValidationError):
        message, reason = body[:200].decode(errors="replace"), ""
    if what:
        message = f"{what}: {message}" if message else what
    return class_for(code)(message, code=code, reason=reason, delay=_retry_after(retry_after))


def from_response(response: httpx2.Response, what: str = "") -> ApiError:
    """Build the error for a read (non-streamed or already read) non-2xx response."""
    return from_status(
        response.status_code, response.content, retry_after=response.headers.get("Retry-After"), what=what
    )


def from_transport(exc: httpx2.TransportError, what: str = "") -> ApiUnavailable:
    """Build the error for a request that got no answer."""
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return ApiUnavailable(f"{what}: {detail}" if what else detail)


def wrap(exc: BaseException, what: str = "") -> ApiError:
    """Map an httpx2 / lightkube exception onto our hierarchy; raised with ``from``.

    Our own errors pass through unchanged; anything unknown becomes an ``ApiServerError`` so that
    callers only ever handle ``ApiError``.
    """
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, httpx2.HTTPStatusError):
        response = exc.response
        try:
            body = response.content
        except httpx2.ResponseNotRead:
            body = b""
        return from_status(
            response.status_code, body, retry_after=response.headers.get("Retry-After"), what=what
        )
    if isinstance(exc, httpx2.TransportError):
        return from_transport(exc, what)
    return ApiServerError(f"{what}: {type(exc).__name__}: {exc}" if what else f"{type(exc).__name__}: {exc}")
