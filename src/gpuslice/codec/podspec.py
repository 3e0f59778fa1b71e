"""Checked access to the parts of a Kubernetes pod dict the codec reads.

Pods come from the API server, the extender's wire types or simulator traces; a part of the wrong
shape is a ``DecodeError`` (annotation ``pod``, field = the path), never an AttributeError.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuslice.codec import errors

POD = "pod"
"""The ``annotation`` of errors about the pod's structure."""


def mapping(value: object, where: str) -> Mapping[str, Any]:
    """An object part; None reads as empty.

    Raises:
        DecodeError: the part is not an object.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise errors.DecodeError(POD, where, f"expected an object, got {type(value).__name__}")
    return value


def metadata(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """``metadata``."""
    return mapping(mapping(pod, "pod").get("metadata"), "metadata")


def spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """``spec``."""
    return mapping(mapping(pod, "pod").get("spec"), "spec")


def pod_annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    """``metadata.annotations``, every value a string.

    Raises:
        DecodeError: not an object, or a value that is not a string (named by its key).
    """
    out = mapping(metadata(pod).get("annotations"), "metadata.annotations")
    for key, value in out.items():
        if not isinstance(value, str):
            raise errors.DecodeError(
                str(key), "value", f"annotation value must be a string, got {type(value).__name__}"
            )
    return out


def containers(pod: Mapping[str, Any], field: str) -> list[Mapping[str, Any]]:
    """``spec.<field>`` (``initContainers`` or ``containers``), each an object.

    Raises:
        DecodeError: not a list of objects.
    """
    value = spec(pod).get(field)
    if value is None:
        return []
    if not isinstance(value, list):
        raise errors.DecodeError(POD, f"spec.{field}", f"expected a list, got {type(value).__name__}")
    return [mapping(c, f"spec.{field}[{i}]") for i, c in enumerate(value)]


def sidecars(init_containers: list[Mapping[str, Any]]) -> tuple[int, ...]:
    """Positions of the init containers that are native sidecars (``restartPolicy: Always``)."""
    return tuple(i for i, c in enumerate(init_containers) if c.get("restartPolicy") == "Always")


def resources(container: Mapping[str, Any], where: str) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """A container's ``resources.limits`` and ``resources.requests``."""
    res = mapping(container.get("resources"), f"{where}.resources")
    return (
        mapping(res.get("limits"), f"{where}.resources.limits"),
        mapping(res.get("requests"), f"{where}.resources.requests"),
    )
