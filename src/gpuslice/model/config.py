"""Scheduler-side settings that change how requests are read (HAMi's ``nvidia:`` config block).

Resource names are settings, as in HAMi (``resourceCountName``, ``resourceMemoryName``,
``resourceMemoryPercentageName``, ``resourceCoreName``, ``resourcePriorityName`` in
``pkg/device/nvidia/device.go`` ``NvidiaConfig``). Each must be a Kubernetes extended-resource
name (``extended_resource_problem``) and the five must differ (``resource_name_problems``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

import msgspec

CORES_QUOTA_ALIAS = "nvidia.com/cores"
"""Quota key the design documents use for GPU cores; read as the cores resource (see
``ResourceNames.cores_quota_aliases``)."""

DEFAULT_CORES_NAME = "nvidia.com/gpucores"


class ResourceNames(msgspec.Struct, frozen=True, kw_only=True):
    """Extended-resource names a pod uses to ask for GPUs.

    Attributes:
        count: cards (HAMi's ``resourceCountName``).
        memory: MiB per card (``resourceMemoryName``).
        memory_percentage: percent of each card's memory (``resourceMemoryPercentageName``).
        cores: percent of each card's SMs (``resourceCoreName``).
        priority: task priority, which only becomes ``CUDA_TASK_PRIORITY`` in the container
            (``resourcePriorityName``).
    """

    count: str = "nvidia.com/gpu"
    memory: str = "nvidia.com/gpumem"
    memory_percentage: str = "nvidia.com/gpumem-percentage"
    cores: str = DEFAULT_CORES_NAME
    priority: str = "nvidia.com/priority"

    def all(self) -> tuple[str, str, str, str, str]:
        """The five names: count, memory, percentage, cores, priority."""
        return (self.count, self.memory, self.memory_percentage, self.cores, self.priority)

    @property
    def cores_quota_aliases(self) -> tuple[str, ...]:
        """Other ResourceQuota keys read as the cores resource: ``nvidia.com/cores``, or none.

        The alias belongs to the default naming: it applies while the cores resource is
        ``nvidia.com/gpucores`` and no configured name is ``nvidia.com/cores`` itself. With a
        renamed cores resource, quotas name that resource only (an operator who renames it has
        no use for an ``nvidia.com`` key, and the alias must never shadow a configured name).
        """
        if self.cores != DEFAULT_CORES_NAME or CORES_QUOTA_ALIAS in self.all():
            return ()
        return (CORES_QUOTA_ALIAS,)


NAME_SETTINGS: dict[str, str] = {
    "resource_count_name": "count",
    "resource_memory_name": "memory",
    "resource_memory_percentage_name": "memory_percentage",
    "resource_core_name": "cores",
    "resource_priority_name": "priority",
}
"""Setting -> ``ResourceNames`` field, the same in every command (HAMi's keys in snake case)."""

_DNS1123_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(?:\.{_DNS1123_LABEL})*", re.ASCII)
_NAME_PART = re.compile(r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]", re.ASCII)
_QUOTA_PREFIX = "requests."


def extended_resource_problem(name: str) -> str | None:
    """Why ``name`` is not a Kubernetes extended-resource name; None when it is one.

    Kubernetes' rule (``IsExtendedResourceName`` in ``pkg/apis/core/helper/helpers.go``, with
    apimachinery's ``IsQualifiedName``): a domain prefix and a name (``example.com/vgpu``); not a
    native resource (no prefix, or one containing ``kubernetes.io/``); not starting with
    ``requests.``; and ``requests.<name>`` must still be a qualified name (prefix a DNS-1123
    subdomain of at most 253 characters, name part at most 63 alphanumerics, ``-``, ``_``, ``.``).
    """
    if "/" not in name:
        return "needs a domain prefix such as example.com/ (a name without one is a native resource)"
    if "kubernetes.io/" in name:
        return "the kubernetes.io/ prefix is reserved for native resources"
    if name.startswith(_QUOTA_PREFIX):
        return "must not start with requests. (the ResourceQuota prefix)"
    prefix, _, part = name.partition("/")
    quota_prefix = _QUOTA_PREFIX + prefix
    if not prefix or len(quota_prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(quota_prefix):
        return "the prefix must be a lower-case DNS subdomain such as example.com"
    if len(part) > 63 or not _NAME_PART.fullmatch(part):
        return "the name after / must be 1..63 letters, digits, -, _ or . and start and end alphanumeric"
    return None


def resource_name_problems(names: ResourceNames) -> list[str]:
    """Problems with configured resource names, each naming its setting; empty when valid."""
    problems: list[str] = []
    by_name: dict[str, list[str]] = {}
    for setting, field in NAME_SETTINGS.items():
        value = getattr(names, field)
        problem = extended_resource_problem(value)
        if problem is not None:
            problems.append(f"{setting}: {value!r} is not an extended-resource name: {problem}")
        by_name.setdefault(value, []).append(setting)
    problems.extend(
        f"{' and '.join(settings)} must differ, got {value!r} for each"
        for value, settings in by_name.items()
        if len(settings) > 1
    )
    return problems


def resource_names(values: Mapping[str, str]) -> ResourceNames:
    """``ResourceNames`` from settings keyed as ``NAME_SETTINGS`` (missing keys keep the default)."""
    return ResourceNames(**{field: values[s] for s, field in NAME_SETTINGS.items() if s in values})


class RequestConfig(msgspec.Struct, frozen=True, kw_only=True):
    """How container resources become a ``ContainerRequest``.

    Attributes:
        names: resource names.
        memory_factor: multiplies ``gpumem`` (and quota limits).
        default_memory: MiB when neither gpumem nor a percentage is given; 0 = whole card.
        default_cores: cores when gpucores is absent; 0 = no SM limit.
        default_gpu_num: count added when only memory/cores/percentage is given (webhook rule).
        exclusive_whole_card: apply the webhook's rule that a bare ``nvidia.com/gpu`` (whole-card
            memory, no cores) asks for 100 cores, i.e. an exclusive card. gpuslice applies it at
            parse time so pods behave the same with or without the mutating webhook.
    """

    names: ResourceNames = ResourceNames()
    memory_factor: int = 1
    default_memory: int = 0
    default_cores: int = 0
    default_gpu_num: int = 1
    exclusive_whole_card: bool = True


DEFAULT_REQUEST_CONFIG = RequestConfig()


NODE_CHOICES = ("extender", "rank", "blend")
"""How the node policy's judgement reaches kube-scheduler (``docs/node-choice.md``):

* ``extender``: the filter answers only the node the extender chooses (best score, then the lowest
  node name), so kube-scheduler's score plugins take no part; HAMi's scheduler answers this way.
* ``rank``: the filter answers every feasible node and prioritize answers ranks in that order
  (the best node 10, the next 9, ..., 0 from the eleventh on), weighted to outrank kube-scheduler's
  resource-balance plugins.
* ``blend``: prioritize answers the policy's 0..100 score scaled to 0..10, summed with
  kube-scheduler's plugins (the behaviour before ``node_choice`` existed).
"""
DEFAULT_NODE_CHOICE = "extender"

DEFAULT_LOCK_MARGIN = 0.05
"""``lock_margin``: among the nodes scoring within this fraction of the score scale of the best,
prefer one whose HAMi node lock is free (``policy.lockchoice``, docs/node-choice.md); 0 = the
policy's choice exactly. A performance setting, in [0, 1].

0.05 (5 points of 100): in the FGD benchmark with the lock window modelled
(``bench/bench_lockmargin.py``) it cost no policy any U(100), while fgd-lookahead's bursts bound
in a third of the time (most of its nodes near the best score alike); binpack, which keeps one
partly filled node per shape, barely moves at 0.05, and wider margins mostly move binpack's pods
off the node it packs."""


# ----------------------------------------------------------------------------- learned target workload

WORKLOAD_FALLBACK_POD = "pod"
"""The ``fallback`` that keeps the learning policy and gives it no workload, so it measures
fragmentation against the pod's own shape (the behaviour before the histogram had settings)."""


class WorkloadSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the target workload of FGD-style policies is learned from the requests seen so far.

    The same settings drive ``gpuslice serve`` (``--workload-decay`` ... flags, ``GPUSLICE_WORKLOAD_*``
    environment, YAML) and ``gpuslice simulate --workload online`` (the same flags); the histogram
    itself is ``cache.shapes.ShapeHistogram`` and docs/workload.md explains the rules.

    Attributes:
        decay: per-request weight multiplier in (0, 1]: a request seen k requests ago weighs
            ``decay**k`` (effective memory ``1 / (1 - decay)`` requests).
        window: at most this many most recent requests count; 0 = unbounded. ``decay`` 1 with a
            window is a plain sliding window.
        min_count: requests observed before the histogram is trusted; until then the learning
            policies are replaced by ``fallback``.
        fallback: the registered policy that scores and chooses cards for a learning policy while
            the histogram is untrusted, or ``pod`` (``WORKLOAD_FALLBACK_POD``): keep the learning
            policy and give it no workload (FGD then measures against the pod's own shape).
        drift: the workload handed to policies is a snapshot, re-taken only when the live
            histogram's normalized weights have moved by at least this total-variation distance
            from it (0 = after every request). Cached node scores survive between snapshots.
    """

    decay: float = 0.9995
    window: int = 0
    min_count: int = 50
    fallback: str = "binpack"
    drift: float = 0.05


DEFAULT_WORKLOAD = WorkloadSettings()
"""The defaults of ``gpuslice serve`` and ``gpuslice simulate --workload online`` (the one place)."""

WORKLOAD_SETTINGS: dict[str, str] = {
    "workload_decay": "decay",
    "workload_window": "window",
    "workload_min_count": "min_count",
    "workload_fallback": "fallback",
    "workload_drift": "drift",
}
"""Setting -> ``WorkloadSettings`` field, the same in every command (flags ``--workload-decay`` ...)."""


class WorkloadSettingError(ValueError):
    """An invalid learned-workload setting; ``setting`` names it (``workload_decay``, ...)."""

    def __init__(self, setting: str, problem: str) -> None:
        """Name the setting and say what is wrong with it."""
        super().__init__(f"{setting}: {problem}")
        self.setting = setting
        self.problem = problem


def workload_errors(
    ws: WorkloadSettings, policies: Collection[str] | None = None
) -> list[WorkloadSettingError]:
    """Every problem with ``ws``, each naming its setting; empty when valid.

    Args:
        ws: the settings.
        policies: the registered policy names ``fallback`` may take (besides ``pod``); None skips
            that check (this layer does not know the registry;
            ``framework.registry.workload_errors`` passes it).
    """
    out: list[WorkloadSettingError] = []
    if not 0.0 < ws.decay <= 1.0:  # also refuses NaN
        out.append(WorkloadSettingError("workload_decay", f"must be in (0, 1], got {ws.decay!r}"))
    if ws.window < 0:
        out.append(WorkloadSettingError("workload_window", f"must be >= 0 (0: unbounded), got {ws.window}"))
    if ws.min_count < 0:
        out.append(WorkloadSettingError("workload_min_count", f"must be >= 0, got {ws.min_count}"))
    if not 0.0 <= ws.drift <= 1.0:
        out.append(WorkloadSettingError("workload_drift", f"must be in [0, 1], got {ws.drift!r}"))
    if policies is not None and ws.fallback != WORKLOAD_FALLBACK_POD and ws.fallback not in policies:
        known = ", ".join([WORKLOAD_FALLBACK_POD, *sorted(policies)])
        out.append(
            WorkloadSettingError("workload_fallback", f"unknown policy {ws.fallback!r}; known: {known}")
        )
    return out


def workload_settings(
    values: Mapping[str, Any], base: WorkloadSettings = DEFAULT_WORKLOAD
) -> WorkloadSettings:
    """``WorkloadSettings`` from values keyed as ``WORKLOAD_SETTINGS`` (missing keys keep ``base``'s).

    Raises:
        WorkloadSettingError: a value of the wrong type (range checks are ``workload_errors``').
    """
    fields: dict[str, Any] = {}
    for setting, field in WORKLOAD_SETTINGS.items():
        if setting not in values:
            continue
        value = values[setting]
        try:
            fields[field] = msgspec.convert(value, type(getattr(base, field)), strict=False)
        except msgspec.ValidationError as err:
            raise WorkloadSettingError(setting, f"{err} (got {value!r})") from None
    return msgspec.structs.replace(base, **fields)
