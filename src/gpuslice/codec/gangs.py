"""A pod's gang and its group objects, from their API dicts (``gpuslice.model.gangs``).

Sources, in the order they are read (the first one a pod carries wins):

1. ``spec.schedulingGroup.podGroupName``: Kubernetes' native PodGroup (KEP-4671, the
   ``scheduling.k8s.io`` PodGroup API; https://kubernetes.io/docs/concepts/workloads/pods/scheduling-group/).
2. ``spec.workloadRef``: ``name``, ``podGroup`` and the optional ``podGroupReplicaKey`` of
   Kubernetes v1.35's Workload API (https://kubernetes.io/docs/concepts/workloads/pods/workload-reference).
3. The label ``scheduling.x-k8s.io/pod-group`` of kubernetes-sigs/scheduler-plugins' Coscheduling
   (``PodGroup`` in ``scheduling.x-k8s.io/v1alpha1``).
4. gpuslice's annotations ``gpuslice.io/gang`` (name) and ``gpuslice.io/gang-min-members`` (the
   minimum, required with it), with the optional ``gpuslice.io/gang-timeout-seconds``.

A malformed value is a ``DecodeError`` naming the field, never a silent non-gang pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuslice.codec import errors, keys, podspec
from gpuslice.model import gangs

_NAME_MAX = 253
"""A Kubernetes object name's longest form (DNS subdomain)."""


def _name(value: object, annotation: str, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise errors.DecodeError(annotation, field, "expected a non-empty name")
    name = value.strip()
    if len(name) > _NAME_MAX or "/" in name:
        raise errors.DecodeError(annotation, field, f"not an object name: {name[:64]!r}")
    return name


def _count(value: object, annotation: str, field: str, low: int) -> int:
    if isinstance(value, bool):
        raise errors.DecodeError(annotation, field, "expected an integer")
    if isinstance(value, str):
        text = value
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise errors.DecodeError(annotation, field, f"expected an integer, got {text[:32]!r}") from None
    if not isinstance(value, int):
        raise errors.DecodeError(annotation, field, f"expected an integer, got {type(value).__name__}")
    if not low <= value <= gangs.MAX_MEMBERS * 1000:
        raise errors.DecodeError(annotation, field, f"{value} out of range (at least {low})")
    return value


def gang_of(pod: Mapping[str, Any]) -> gangs.GangRef | None:
    """The pod's gang, None when it names none (module docstring for the sources).

    Raises:
        DecodeError: a gang field of the wrong shape, a missing or invalid minimum.
    """
    meta = podspec.metadata(pod)
    namespace = str(meta.get("namespace") or "default")
    spec = podspec.spec(pod)
    group = spec.get("schedulingGroup")
    if group is not None:
        group = podspec.mapping(group, "spec.schedulingGroup")
        name = _name(group.get("podGroupName"), "spec.schedulingGroup", "podGroupName")
        return gangs.GangRef(namespace=namespace, name=name, source=gangs.SOURCE_SCHEDULING_GROUP, group=name)
    ref = spec.get("workloadRef")
    if ref is not None:
        ref = podspec.mapping(ref, "spec.workloadRef")
        workload = _name(ref.get("name"), "spec.workloadRef", "name")
        pod_group = _name(ref.get("podGroup"), "spec.workloadRef", "podGroup")
        name = f"{workload}/{pod_group}"
        replica = ref.get("podGroupReplicaKey")
        if replica not in (None, ""):
            name += "/" + _name(replica, "spec.workloadRef", "podGroupReplicaKey")
        return gangs.GangRef(
            namespace=namespace, name=name, source=gangs.SOURCE_WORKLOAD, group=workload, pod_group=pod_group
        )
    labels = podspec.mapping(meta.get("labels"), "metadata.labels")
    label = labels.get(keys.POD_GROUP_LABEL)
    if label is not None:
        name = _name(label, keys.POD_GROUP_LABEL, "value")
        return gangs.GangRef(namespace=namespace, name=name, source=gangs.SOURCE_POD_GROUP, group=name)
    annotations = podspec.pod_annotations(pod)
    return from_annotations(namespace, annotations)


def from_annotations(namespace: str, annotations: Mapping[str, str]) -> gangs.GangRef | None:
    """The gang gpuslice's own annotations name, None without ``gpuslice.io/gang``.

    Raises:
        DecodeError: an invalid name, a missing or invalid minimum or timeout.
    """
    raw = annotations.get(keys.GANG)
    if raw is None:
        for key in (keys.GANG_MIN_MEMBERS, keys.GANG_TIMEOUT_SECONDS):
            if key in annotations:
                raise errors.DecodeError(key, "value", f"needs {keys.GANG} naming the gang")
        return None
    name = _name(raw, keys.GANG, "value")
    if keys.GANG_MIN_MEMBERS not in annotations:
        raise errors.DecodeError(keys.GANG_MIN_MEMBERS, "value", f"required with {keys.GANG}")
    minimum = _count(annotations[keys.GANG_MIN_MEMBERS], keys.GANG_MIN_MEMBERS, "value", 1)
    if minimum > gangs.MAX_MEMBERS:
        raise errors.DecodeError(keys.GANG_MIN_MEMBERS, "value", f"at most {gangs.MAX_MEMBERS}")
    timeout = 0
    if keys.GANG_TIMEOUT_SECONDS in annotations:
        timeout = _count(annotations[keys.GANG_TIMEOUT_SECONDS], keys.GANG_TIMEOUT_SECONDS, "value", 1)
    return gangs.GangRef(
        namespace=namespace,
        name=name,
        source=gangs.SOURCE_ANNOTATION,
        min_member=minimum,
        timeout_s=timeout,
    )


def _spec(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise errors.DecodeError(kind, "object", "expected an object")
    return podspec.mapping(obj.get("spec"), f"{kind}.spec")


def pod_group(obj: Mapping[str, Any]) -> gangs.GroupSpec:
    """scheduler-plugins' ``PodGroup``: ``spec.minMember`` and ``spec.scheduleTimeoutSeconds``.

    Raises:
        DecodeError: a missing or invalid field (named).
    """
    spec = _spec(obj, "PodGroup")
    minimum = _count(spec.get("minMember", 0), "PodGroup", "spec.minMember", 0)
    timeout = spec.get("scheduleTimeoutSeconds")
    return gangs.GroupSpec(
        min_member=min(minimum, gangs.MAX_MEMBERS),
        timeout_s=0 if timeout is None else _count(timeout, "PodGroup", "spec.scheduleTimeoutSeconds", 0),
    )


def native_pod_group(obj: Mapping[str, Any]) -> gangs.GroupSpec:
    """Kubernetes' ``PodGroup`` (``scheduling.k8s.io``): ``spec.schedulingPolicy.gang.minCount``.

    A ``basic`` policy (no ``gang``) is a group of independent pods: minimum 1.

    Raises:
        DecodeError: an invalid field (named).
    """
    spec = _spec(obj, "PodGroup")
    policy = podspec.mapping(spec.get("schedulingPolicy"), "spec.schedulingPolicy")
    return _policy(policy, "spec.schedulingPolicy")


def _policy(policy: Mapping[str, Any], where: str) -> gangs.GroupSpec:
    gang = policy.get("gang")
    if gang is None:
        return gangs.GroupSpec(min_member=1)
    gang = podspec.mapping(gang, f"{where}.gang")
    minimum = _count(gang.get("minCount", 1), "PodGroup", f"{where}.gang.minCount", 1)
    return gangs.GroupSpec(min_member=min(minimum, gangs.MAX_MEMBERS))


def workload_group(obj: Mapping[str, Any], pod_group_name: str) -> gangs.GroupSpec | None:
    """A ``Workload``'s pod group by name: ``spec.podGroups[].policy``; None when it has none such.

    Raises:
        DecodeError: an invalid field (named).
    """
    spec = _spec(obj, "Workload")
    groups = spec.get("podGroups") or []
    if not isinstance(groups, list):
        raise errors.DecodeError("Workload", "spec.podGroups", "expected a list")
    for i, g in enumerate(groups):
        g = podspec.mapping(g, f"spec.podGroups[{i}]")
        if g.get("name") == pod_group_name:
            return _policy(
                podspec.mapping(g.get("policy"), f"spec.podGroups[{i}].policy"), f"spec.podGroups[{i}].policy"
            )
    return None
