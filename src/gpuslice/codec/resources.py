"""Container resources to GPU requests: HAMi's parse, the webhook's rules, whole pods, quotas.

``generate_request`` is HAMi's ``GenerateResourceRequests`` exactly (it never adds cores);
``webhook_request`` adds the mutating webhook's defaults on top, so a pod reads the same whether
or not it went through a webhook. ``container_request`` is gpuslice's reading of one container:
the validation HAMi's webhook does, then either of the two. ``parse_pod`` applies it to every
container of a pod dict.

The memory percentage (``nvidia.com/gpumem-percentage``, or its configured name):

* an integer in 1..100 is a share of each card's registered memory;
* 0 is HAMi's "unset": ``GenerateResourceRequests`` ignores it (memory then comes from gpumem,
  ``defaultMemory`` or the whole card) and the webhook's exclusive rule does not fire for it, so
  ``gpumem-percentage: 0`` never becomes an exclusive card;
* anything else (negative, above 100, not an integer) is an error: ``container_request`` raises
  ``DecodeError`` naming the resource and the container, which the extender answers with
  ``InvalidRequest`` on every node and a Warning event. HAMi's webhook refuses the same values
  (``validateMemoryPercentage`` in ``pkg/device/nvidia/device.go``), while its scheduler would
  clamp 150 to 100; without the check a pod that skipped the webhook would silently take a whole
  card, and with the exclusive rule an exclusive one. ``generate_request`` keeps HAMi's clamp.

Every resource name comes from ``RequestConfig.names`` (HAMi lets operators rename them).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import msgspec

from gpuslice.codec import errors as codec_errors
from gpuslice.codec import gangs, goparse, linkreq, pod_selectors, podspec, quantity
from gpuslice.model import config as model_config
from gpuslice.model import limits as model_limits
from gpuslice.model import requests

ResourceList = Mapping[str, object]
"""``limits`` or ``requests`` of a container: resource name to quantity."""

_EMPTY: ResourceList = {}


def _lookup(limits: ResourceList, reqs: ResourceList, name: str) -> int | None:
    """Go's AsInt64 of a resource, limits first, then requests; None when absent or not an integer.

    Raises:
        DecodeError: the value is not a quantity at all.
    """
    raw = limits[name] if name in limits else reqs.get(name)
    if raw is None:
        return None
    return quantity.as_int64(quantity.parse(raw, name))


def _present(limits: ResourceList, reqs: ResourceList, name: str) -> bool:
    return name in limits or name in reqs


def generate_request(
    limits: ResourceList, reqs: ResourceList, config: model_config.RequestConfig
) -> requests.ContainerRequest | None:
    """HAMi's ``GenerateResourceRequests`` for one container; None = the container uses no GPU.

    Rules: each value from limits, else requests. The count must be a positive integer. gpumem
    (MiB per card) is multiplied by ``memory_factor``; a non-integer value or one above
    ``MaxInt32 / memory_factor`` drops the whole request. A percentage <= 0 is unset (101),
    above 100 it is clamped to 100 (``container_request`` refuses such values before this runs;
    HAMi's own cases keep the clamp here). With neither, ``default_memory`` applies, else 100 %.
    Cores default to ``default_cores``.

    Raises:
        DecodeError: a value that is not a Kubernetes quantity.
    """
    names = config.names
    count = _lookup(limits, reqs, names.count)
    if count is None or count <= 0 or count > goparse.INT32_MAX:
        return None
    factor = max(1, config.memory_factor)
    memory = 0
    if _present(limits, reqs, names.memory):
        mem = _lookup(limits, reqs, names.memory)
        if mem is None or mem > goparse.INT32_MAX // factor:
            return None
        memory = max(mem, 0) * factor
    percentage = requests.MEMORY_PERCENTAGE_UNSET
    pct = _lookup(limits, reqs, names.memory_percentage)
    if pct is not None and pct > 0:
        percentage = min(pct, 100)
    if percentage == requests.MEMORY_PERCENTAGE_UNSET and memory == 0:
        if config.default_memory != 0:
            memory = config.default_memory
        else:
            percentage = 100
    cores = config.default_cores
    if _present(limits, reqs, names.cores):
        got = _lookup(limits, reqs, names.cores)
        if got is not None:
            if got > goparse.INT32_MAX:
                return None
            cores = max(got, 0)
    return requests.ContainerRequest(
        count=count, memory_mib=memory, memory_percentage=percentage, cores=cores
    )


def webhook_limits(limits: ResourceList, config: model_config.RequestConfig) -> ResourceList:
    """The webhook's default count: added to limits when only memory/cores/percentage are set."""
    names = config.names
    if names.count in limits or config.default_gpu_num <= 0:
        return limits
    if any(n in limits for n in (names.cores, names.memory, names.memory_percentage)):
        return {**limits, names.count: str(config.default_gpu_num)}
    return limits


def _asks_whole_card(limits: ResourceList, reqs: ResourceList, names: model_config.ResourceNames) -> bool:
    """HAMi's literal test: no gpumem and no percentage given, or a percentage of exactly 100.

    ``defaultExclusiveCoreIfNeeded`` in ``pkg/device/nvidia/device.go`` looks at what the
    container names, not at the parsed request: ``gpumem-percentage: 0`` (HAMi's "unset") and
    ``gpumem: 0`` name a memory amount, so they are not whole-card asks.

    Raises:
        DecodeError: the percentage is not a Kubernetes quantity.
    """
    if _present(limits, reqs, names.memory_percentage):
        return _lookup(limits, reqs, names.memory_percentage) == 100
    return not _present(limits, reqs, names.memory)


def webhook_request(
    limits: ResourceList, reqs: ResourceList, config: model_config.RequestConfig
) -> requests.ContainerRequest | None:
    """The request after the webhook's rules: default count, then 100 cores for whole-card memory.

    A container with cards and no ``gpucores`` that asks for a whole card (no gpumem and no
    percentage, or a percentage of exactly 100: ``_asks_whole_card``) and whose request is the
    whole card's memory gets 100 cores: a bare ``nvidia.com/gpu: 1`` is one exclusive card.
    ``gpumem-percentage: 0`` is not such an ask (HAMi adds no cores for it either), and neither is
    a bare card whose ``default_memory`` gives it less than the whole card.

    Raises:
        DecodeError: a value that is not a Kubernetes quantity.
    """
    limits = webhook_limits(limits, config)
    req = generate_request(limits, reqs, config)
    if req is None or _present(limits, reqs, config.names.cores):
        return req
    whole = req.memory_mib == 0 and req.memory_percentage == 100
    if whole and _asks_whole_card(limits, reqs, config.names):
        return msgspec.structs.replace(req, cores=100)
    return req


PERCENTAGE_RANGE = (0, 100)
"""Percentages ``container_request`` accepts: 0 (HAMi's "unset") through 100."""


def check_percentage(
    limits: ResourceList, reqs: ResourceList, names: model_config.ResourceNames, where: str
) -> None:
    """Refuse a memory percentage that is not an integer in 0..100, in limits or in requests.

    Raises:
        DecodeError: naming the percentage resource (``annotation``) and ``where`` (``field``).
    """
    name = names.memory_percentage
    low, high = PERCENTAGE_RANGE
    for source in (limits, reqs):
        if name not in source:
            continue
        raw = source[name]
        value = quantity.as_int64(quantity.parse(raw, name))
        if value is None or not low <= value <= high:
            raise codec_errors.DecodeError(
                name, where, f"{name} must be an integer in {low}..{high} (0 = unset), got {raw}"
            )


def check_card_amounts(
    limits: ResourceList, reqs: ResourceList, config: model_config.RequestConfig, where: str
) -> None:
    """Refuse a card count, memory or cores that is not an integer within its bound.

    HAMi's ``GenerateResourceRequests`` silently drops a container's whole GPU request when its
    memory exceeds ``MaxInt32 / memoryFactor`` or is not an integer (``gpumem: 16Gi`` reads as
    17179869184 MiB), and then schedules the pod as if it asked for no GPU; its device plugin
    later fails it. gpuslice refuses the pod instead, naming the resource: the count must be in
    0..``MAX_CARDS`` (no node has more cards), memory in 0..``MaxInt32 / memoryFactor`` MiB,
    cores in 0..``MaxInt32``. ``generate_request`` keeps HAMi's rule for HAMi's own cases.

    Raises:
        DecodeError: naming the resource (``annotation``) and ``where`` (``field``).
    """
    names = config.names
    bounds = (
        (names.count, model_limits.MAX_CARDS, "cards"),
        (names.memory, model_limits.MAX_CARD_MEMORY_MIB // max(1, config.memory_factor), "MiB per card"),
        (names.cores, model_limits.MAX_CARD_CORES, "percent of each card's cores"),
    )
    for name, high, unit in bounds:
        for source in (limits, reqs):
            if name not in source:
                continue
            raw = source[name]
            value = quantity.as_int64(quantity.parse(raw, name))
            if value is None or not 0 <= value <= high:
                raise codec_errors.DecodeError(
                    name, where, f"{name} must be an integer in 0..{high} ({unit}), got {raw}"
                )


def container_request(
    container: Mapping[str, Any], config: model_config.RequestConfig, where: str = "container"
) -> requests.ContainerRequest | None:
    """One container's GPU request, with the webhook's rules when ``config.exclusive_whole_card``.

    The amounts are checked first, with or without the webhook's rules (see the module docstring
    and ``check_card_amounts``): a percentage outside 0..100 is an error, not HAMi's clamp, and a
    count, memory or cores outside its bound is an error, not HAMi's dropped request.

    Raises:
        DecodeError: a malformed container or quantity, or an amount outside its bound (naming
            the resource and ``where``, the container's path such as ``spec.containers[0]``).
    """
    limits, reqs = podspec.resources(container, where)
    check_percentage(limits, reqs, config.names, where)
    check_card_amounts(limits, reqs, config, where)
    if config.exclusive_whole_card:
        return webhook_request(limits, reqs, config)
    return generate_request(limits, reqs, config)


HOST_BOUNDS = {"cpu": model_limits.MAX_CPU_MILLI, "memory": model_limits.MAX_MEMORY_MIB}
"""The host resources gpuslice reads, and the bound of each (millicores, MiB)."""
_HOST_UNITS = {"cpu": "millicores", "memory": "MiB"}


def check_host(name: str, value: int, where: str, what: str = "") -> int:
    """``value`` (of ``cpu`` in millicores or ``memory`` in MiB) when it lies within its bound.

    Raises:
        DecodeError: naming the resource and ``where``.
    """
    high = HOST_BOUNDS[name]
    if not 0 <= value <= high:
        raise codec_errors.DecodeError(
            name, where, f"{what or name} must be in 0..{high} {_HOST_UNITS[name]}, got {value}"
        )
    return value


def _host(limits: ResourceList, reqs: ResourceList, name: str, milli: bool, where: str) -> int:
    raw = reqs[name] if name in reqs else limits.get(name)
    if raw is None:
        return 0
    q = quantity.parse(raw, name)
    return check_host(name, quantity.milli_value(q) if milli else quantity.value(q / 2**20), where)


def container_host(limits: ResourceList, reqs: ResourceList, where: str = "container") -> tuple[int, int]:
    """One container's host request: CPU in millicores and memory in MiB (rounded up).

    The request, or the limit when no request is given (the API server defaults a missing request
    to the limit, so a stored pod always has it; a pod under admission may not yet).

    Raises:
        DecodeError: a malformed quantity, or one outside 0..``HOST_BOUNDS`` (naming ``where``).
    """
    return _host(limits, reqs, "cpu", True, where), _host(limits, reqs, "memory", False, where)


def host_request(
    apps: Sequence[tuple[int, int]], inits: Sequence[tuple[int, int]], sidecars: Collection[int] = ()
) -> tuple[int, int]:
    """A pod's host request (CPU milli, memory MiB) as kube-scheduler counts it.

    Kubernetes' ``PodRequests`` (``k8s.io/component-helpers/resource/helpers.go``): the app
    containers add up; init containers run one at a time, each beside the native sidecars started
    before it (``sidecars``: positions of init containers with ``restartPolicy: Always``), which
    also keep running beside the app containers. The pod needs the larger of the two phases.
    """
    cpu = sum(c for c, _ in apps)
    mem = sum(m for _, m in apps)
    side_cpu = side_mem = peak_cpu = peak_mem = 0
    for i, (c, m) in enumerate(inits):
        if i in sidecars:
            side_cpu, side_mem = side_cpu + c, side_mem + m
            cpu, mem = cpu + c, mem + m
            peak_cpu, peak_mem = max(peak_cpu, side_cpu), max(peak_mem, side_mem)
        else:
            peak_cpu, peak_mem = max(peak_cpu, c + side_cpu), max(peak_mem, m + side_mem)
    return max(cpu, peak_cpu), max(mem, peak_mem)


def allocatable_host(allocatable: Mapping[str, str]) -> tuple[int, int]:
    """A node's allocatable CPU (milli) and memory (MiB, rounded down); 0 where absent.

    What kube-scheduler's ``NodeResourcesFit`` fits pods' requests into (``status.allocatable``).

    Raises:
        DecodeError: a malformed quantity.
    """
    cpu = allocatable.get("cpu")
    mem = allocatable.get("memory")
    cpu_milli = quantity.milli_value(quantity.parse(cpu, "cpu")) if cpu else 0
    mem_mib = math.floor(quantity.parse(mem, "memory") / 2**20) if mem else 0
    where = "status.allocatable"
    return check_host("cpu", max(cpu_milli, 0), where), check_host("memory", max(mem_mib, 0), where)


def _host_usage(
    init: list[Mapping[str, Any]], app: list[Mapping[str, Any]], sidecars: Collection[int]
) -> tuple[int, int]:
    """The pod's host request (``host_request``) from its container dicts."""

    def one(c: Mapping[str, Any], where: str) -> tuple[int, int]:
        return container_host(*podspec.resources(c, where), where)

    inits = [one(c, f"spec.initContainers[{i}]") for i, c in enumerate(init)]
    apps = [one(c, f"spec.containers[{i}]") for i, c in enumerate(app)]
    return checked_host_request(apps, inits, sidecars)


def checked_host_request(
    apps: Sequence[tuple[int, int]], inits: Sequence[tuple[int, int]], sidecars: Collection[int] = ()
) -> tuple[int, int]:
    """``host_request``, refused when the pod's total lies beyond ``HOST_BOUNDS``.

    Raises:
        DecodeError: naming the resource, field ``spec``.
    """
    cpu, mem = host_request(apps, inits, sidecars)
    return (
        check_host("cpu", cpu, "spec", "the pod's cpu request"),
        check_host("memory", mem, "spec", "the pod's memory request"),
    )


def check_annotation_size(annotations: Mapping[str, object]) -> None:
    """Refuse annotations larger in total than Kubernetes allows (``MAX_ANNOTATION_BYTES``).

    The API server never stores such a pod; a request carrying one did not come from it.

    Raises:
        DecodeError: field ``metadata.annotations``.
    """
    size = 0
    for k, v in annotations.items():
        size += len(k) + (len(v) if isinstance(v, str) else 0)
    limit = model_limits.MAX_ANNOTATION_BYTES
    if size > limit:
        raise codec_errors.DecodeError(
            "pod",
            "metadata.annotations",
            f"annotations total {size} bytes, more than Kubernetes allows ({limit})",
        )


def parse_pod(
    pod: Mapping[str, Any], config: model_config.RequestConfig = model_config.DEFAULT_REQUEST_CONFIG
) -> requests.PodRequest:
    """A Kubernetes pod dict as a ``PodRequest``: init containers first, selectors, overrides.

    Also its ``hami.io/gpu-topology-requirement`` (``codec.linkreq``), its controller owner's UID
    and its labels (``PodRequest.job``: the balanced policy's task affinity).

    Raises:
        DecodeError: a malformed pod structure, quantity, ``hami.io/numa-hint`` or
            ``hami.io/gpu-topology-requirement``, or an amount beyond ``gpuslice.model.limits``
            (each naming its field).
    """
    metadata = podspec.metadata(pod)
    annotations = podspec.pod_annotations(pod)
    check_annotation_size(annotations)
    init = podspec.containers(pod, "initContainers")
    app = podspec.containers(pod, "containers")
    containers = tuple(
        [container_request(c, config, f"spec.initContainers[{i}]") for i, c in enumerate(init)]
        + [container_request(c, config, f"spec.containers[{i}]") for i, c in enumerate(app)]
    )
    sidecars = podspec.sidecars(init)
    cpu, mem = _host_usage(init, app, sidecars)
    return requests.PodRequest(
        namespace=str(metadata.get("namespace") or "default"),
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
        containers=containers,
        init_count=len(init),
        sidecars=sidecars,
        selectors=pod_selectors.selectors(annotations),
        node_policy=pod_selectors.node_policy(annotations),
        card_policy=pod_selectors.card_policy(annotations),
        scoring_weights=pod_selectors.scoring_weights(annotations),
        cpu_milli=cpu,
        memory_mib=mem,
        topology=linkreq.requirement(annotations),
        owner=controller_uid(metadata.get("ownerReferences")),
        labels=_labels(metadata.get("labels")),
        gang=gangs.gang_of(pod),
    )


def controller_uid(owners: object) -> str:
    """The UID of the owner reference marked ``controller: true`` ('' when none or malformed)."""
    if not isinstance(owners, list):
        return ""
    for ref in owners:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            uid = ref.get("uid")
            return uid if isinstance(uid, str) else ""
    return ""


def _labels(labels: object) -> tuple[tuple[str, str], ...]:
    """``metadata.labels`` as sorted pairs (non-string values, which the API never stores, skipped)."""
    if not isinstance(labels, Mapping) or not labels:
        return ()
    return tuple(sorted((k, v) for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)))


class QuotaLimits(msgspec.Struct, frozen=True, kw_only=True):
    """GPU limits of one ResourceQuota; None = not limited.

    Attributes:
        count: cards (``nvidia.com/gpu``, or the configured count name).
        memory_mib: total MiB over all cards of all pods (already times ``memory_factor``).
        cores: total cores over all cards of all pods.
    """

    count: int | None = None
    memory_mib: int | None = None
    cores: int | None = None

    @property
    def unlimited(self) -> bool:
        """True when the quota limits none of the GPU resources."""
        return self.count is None and self.memory_mib is None and self.cores is None


def _quota_value(hard: Mapping[str, object], *names: str) -> int | None:
    """The smallest value of ``names`` in ``hard`` (bare, ``requests.``, ``limits.``); None if none."""
    found = [
        quantity.value(quantity.parse(hard[k], k))
        for name in names
        for k in (name, f"requests.{name}", f"limits.{name}")
        if k in hard
    ]
    return min(found) if found else None


def parse_quota(
    hard: Mapping[str, object], config: model_config.RequestConfig = model_config.DEFAULT_REQUEST_CONFIG
) -> QuotaLimits:
    """GPU limits from a ResourceQuota's ``spec.hard``.

    Keys are the configured resource names (``config.names``). Each resource may be given bare,
    with ``requests.`` or with ``limits.``; GPU requests always equal limits, so the smallest of
    the given values applies. HAMi reads only ``limits.nvidia.com/gpumem`` and
    ``limits.nvidia.com/gpucores``; gpuslice honours every form (HAMi issue #893). Cores may also
    be given as ``nvidia.com/cores`` (any form; the design documents' key) while the cores
    resource keeps its default name (``ResourceNames.cores_quota_aliases``); the smallest of all
    applies.

    Raises:
        DecodeError: a value that is not a Kubernetes quantity.
    """
    names = config.names
    memory = _quota_value(hard, names.memory)
    return QuotaLimits(
        count=_quota_value(hard, names.count),
        memory_mib=None if memory is None else memory * max(1, config.memory_factor),
        cores=_quota_value(hard, names.cores, *names.cores_quota_aliases),
    )
