"""The agent's node calls fail with ``kube.errors``, like every other API call."""

from __future__ import annotations

import lightkube
import pytest
from lightkube.models import meta_v1

from gpuslice.kube import errors, nodes

pytestmark = pytest.mark.unit


class _Client:
    """A lightkube client whose every call raises ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def get(self, *args: object, **kwargs: object) -> object:
        raise self.error

    def patch(self, *args: object, **kwargs: object) -> object:
        raise self.error


def _api_error(code: int, reason: str = "") -> lightkube.ApiError:
    return lightkube.ApiError(status=meta_v1.Status(code=code, message="the message", reason=reason))


@pytest.mark.parametrize(
    ("error", "kind", "code"),
    [
        (_api_error(404, "NotFound"), errors.NotFound, 404),
        (_api_error(409, "Conflict"), errors.Conflict, 409),
        (_api_error(503), errors.ApiServerError, 503),
        (ConnectionRefusedError("refused"), errors.ApiUnavailable, 0),
    ],
    ids=["not-found", "conflict", "server-error", "not-reached"],
)
def test_a_failed_call_is_the_class_of_its_status(
    error: Exception, kind: type[errors.ApiError], code: int
) -> None:
    client = _Client(error)
    with pytest.raises(kind) as read:
        nodes.get_node(client, "n1")  # type: ignore[arg-type]
    assert read.value.code == code and "reading node n1" in read.value.message
    with pytest.raises(kind) as patched:
        nodes.patch_node_annotations(client, "n1", {"k": "v"}, resource_version="7")  # type: ignore[arg-type]
    assert patched.value.__cause__ is error


def test_a_conflict_is_permanent_and_a_server_error_temporary() -> None:
    """Retry intent lives in the type (``kube.errors``): the agent reads again on a conflict itself."""
    client = _Client(_api_error(409, "Conflict"))
    with pytest.raises(errors.PermanentError):
        nodes.get_node(client, "n1")  # type: ignore[arg-type]
    client.error = _api_error(500)
    with pytest.raises(errors.TemporaryError):
        nodes.get_node(client, "n1")  # type: ignore[arg-type]
