"""Container resources to GPU requests: HAMi's parse, the webhook's rules, whole pods, quotas.

``generate_request`` is HAMi's ``GenerateResourceRequests`` exactly (it never adds cores);
``webhook_request`` adds the mutating webhook's defaults on top, so a pod reads the same whether
or not it went through a webhook. ``parse_pod`` does both for every container of a pod dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from gpuslice.codec import goparse, pod_selectors, podspec, quantity
from gpuslice.model import config as model_config
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
    above 100 it is clamped to 100. With neither, ``default_memory`` applies, else 100 %.
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


def webhook_request(
    limits: ResourceList, reqs: ResourceList, config: model_config.RequestConfig
) -> requests.ContainerRequest | None:
    """The request after the webhook's rules: default count, then 100 cores for whole-card memory.

    A container with cards, no ``gpucores`` and whole-card memory (no gpumem and no percentage,
    or percentage 100) gets 100 cores: a bare ``nvidia.com/gpu: 1`` is one exclusive card.

    Raises:
        DecodeError: a value that is not a Kubernetes quantity.
    """
    limits = webhook_limits(limits, config)
    req = generate_request(limits, reqs, config)
    if req is None or _present(limits, reqs, config.names.cores):
        return req
    if req.memory_mib == 0 and req.memory_percentage == 100:
        return msgspec.structs.replace(req, cores=100)
    return req


def container_request(
    container: Mapping[str, Any], config: model_config.RequestConfig, where: str = "container"
) -> requests.ContainerRequest | None:
    """One container's GPU request, with the webhook's rules when ``config.exclusive_whole_card``.

    Raises:
        DecodeError: a malformed container or quantity.
    """
    limits, reqs = podspec.resources(container, where)
    if config.exclusive_whole_card:
        return webhook_request(limits, reqs, config)
    return generate_request(limits, reqs, config)


def _host(limits: ResourceList, reqs: ResourceList, name: str, milli: bool) -> int:
    raw = reqs[name] if name in reqs else limits.get(name)
    if raw is None:
        return 0
    q = quantity.parse(raw, name)
    return quantity.milli_value(q) if milli else quantity.value(q / 2**20)


def _host_usage(init: list[Mapping[str, Any]], app: list[Mapping[str, Any]]) -> tuple[int, int]:
    """Effective CPU (milli) and memory (MiB): max(largest init container, sum of app containers)."""

    def one(c: Mapping[str, Any], where: str) -> tuple[int, int]:
        limits, reqs = podspec.resources(c, where)
        return _host(limits, reqs, "cpu", True), _host(limits, reqs, "memory", False)

    inits = [one(c, f"spec.initContainers[{i}]") for i, c in enumerate(init)]
    apps = [one(c, f"spec.containers[{i}]") for i, c in enumerate(app)]
    cpu = max(sum(a[0] for a in apps), max((i[0] for i in inits), default=0))
    mem = max(sum(a[1] for a in apps), max((i[1] for i in inits), default=0))
    return cpu, mem


def parse_pod(
    pod: Mapping[str, Any], config: model_config.RequestConfig = model_config.DEFAULT_REQUEST_CONFIG
) -> requests.PodRequest:
    """A Kubernetes pod dict as a ``PodRequest``: init containers first, selectors, overrides.

    Raises:
        DecodeError: a malformed pod structure, quantity or ``hami.io/numa-hint``.
    """
    metadata = podspec.metadata(pod)
    annotations = podspec.pod_annotations(pod)
    init = podspec.containers(pod, "initContainers")
    app = podspec.containers(pod, "containers")
    containers = tuple(
        [container_request(c, config, f"spec.initContainers[{i}]") for i, c in enumerate(init)]
        + [container_request(c, config, f"spec.containers[{i}]") for i, c in enumerate(app)]
    )
    cpu, mem = _host_usage(init, app)
    return requests.PodRequest(
        namespace=str(metadata.get("namespace") or "default"),
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
        containers=containers,
        init_count=len(init),
        selectors=pod_selectors.selectors(annotations),
        node_policy=pod_selectors.node_policy(annotations),
        card_policy=pod_selectors.card_policy(annotations),
        cpu_milli=cpu,
        memory_mib=mem,
    )


class QuotaLimits(msgspec.Struct, frozen=True, kw_only=True):
    """GPU limits of one ResourceQuota; None = not limited.

    Attributes:
        count: cards (``nvidia.com/gpu``).
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


def _quota_value(hard: Mapping[str, object], name: str) -> int | None:
    found = [
        quantity.value(quantity.parse(hard[k], k))
        for k in (name, f"requests.{name}", f"limits.{name}")
        if k in hard
    ]
    return min(found) if found else None


def parse_quota(
    hard: Mapping[str, object], config: model_config.RequestConfig = model_config.DEFAULT_REQUEST_CONFIG
) -> QuotaLimits:
    """GPU limits from a ResourceQuota's ``spec.hard``.

    Each resource may be given bare, with ``requests.`` or with ``limits.``; GPU requests always
    equal limits, so the smallest of the given values applies. HAMi reads only
    ``limits.nvidia.com/gpumem`` and ``limits.nvidia.com/gpucores``; gpuslice honours every form
    (HAMi issue #893).

    Raises:
        DecodeError: a value that is not a Kubernetes quantity.
    """
    names = config.names
    memory = _quota_value(hard, names.memory)
    return QuotaLimits(
        count=_quota_value(hard, names.count),
        memory_mib=None if memory is None else memory * max(1, config.memory_factor),
        cores=_quota_value(hard, names.cores),
    )
