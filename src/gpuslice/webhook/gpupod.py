"""Which pods the webhook acts on, and a walk over their containers.

A GPU pod is one that names any managed GPU resource (``nvidia.com/gpu``, ``gpumem``,
``gpumem-percentage``, ``gpucores``, or the names configured in
``gpuslice.model.config.ResourceNames``; the priority resource alone does not count) in the limits or
requests of any container or init container; the key alone counts, as in HAMi's webhook
(``pkg/device/nvidia/device.go``, ``mutateContainerResource``), so ``nvidia.com/gpu: 0`` does too.
Pods labelled ``hami.io/webhook: ignore`` opted out of HAMi's webhook and are left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from gpuslice.codec import podspec
from gpuslice.model import config as model_config

IGNORE_LABEL = "hami.io/webhook"
IGNORE_VALUE = "ignore"
DEFAULT_SCHEDULER = "default-scheduler"
"""Kubernetes' default scheduler name (``corev1.DefaultSchedulerName``)."""


class Container(NamedTuple):
    """One container of a pod, init containers first.

    Attributes:
        field: ``initContainers`` or ``containers``.
        position: index in that list.
        name: the container's name.
        spec: the container object.
        limits: ``resources.limits``.
        requests: ``resources.requests``.
    """

    field: str
    position: int
    name: str
    spec: Mapping[str, Any]
    limits: Mapping[str, Any]
    requests: Mapping[str, Any]


def managed(names: model_config.ResourceNames) -> tuple[str, ...]:
    """The resource names that make a pod a GPU pod."""
    return (names.count, names.memory, names.memory_percentage, names.cores)


def containers(pod: Mapping[str, Any]) -> list[Container]:
    """Init containers, then app containers.

    Raises:
        DecodeError: a malformed pod structure.
    """
    out: list[Container] = []
    for field in ("initContainers", "containers"):
        for i, c in enumerate(podspec.containers(pod, field)):
            limits, reqs = podspec.resources(c, f"spec.{field}[{i}]")
            out.append(Container(field, i, str(c.get("name") or f"{field}[{i}]"), c, limits, reqs))
    return out


def wants_gpu(items: list[Container], names: model_config.ResourceNames) -> bool:
    """True when any container names a managed GPU resource in limits or requests."""
    keys = managed(names)
    return any(n in c.limits or n in c.requests for c in items for n in keys)


def opted_out(pod: Mapping[str, Any]) -> bool:
    """True for a pod labelled ``hami.io/webhook: ignore``.

    Raises:
        DecodeError: ``metadata.labels`` is not an object.
    """
    labels = podspec.mapping(podspec.metadata(pod).get("labels"), "metadata.labels")
    return labels.get(IGNORE_LABEL) == IGNORE_VALUE
