"""The validating route: refuse GPU pods the scheduler could never place or would misread (pure).

A GPU pod (``gpupod.wants_gpu``) being created is refused, with every problem named in one
message, when:

* a managed resource (``nvidia.com/gpu``, ``gpumem``, ``gpumem-percentage``, ``gpucores``, or
  their configured names) in limits or requests is not a non-negative integer;
  ``gpumem-percentage`` is outside 1..100 or ``gpucores`` outside 0..100. HAMi's webhook refuses
  percentages outside 0..100 (``validateMemoryPercentage`` in ``pkg/device/nvidia/device.go``)
  and so does the scheduler's reader (``codec.resources.container_request``: the same upper
  bound, ``resources.PERCENTAGE_RANGE``), so what this route lets through the scheduler reads.
  0 is refused here only: the scheduler reads it as HAMi does, as "unset" (the memory then
  comes from gpumem, the default memory or the whole card, and no exclusive card), which a user
  writing 0 % almost never means, so at create time it is refused as a likely mistake;
* a container asks more cards than the largest registered node has (``max_cards``). This check
  fails open: with no GPU node registered yet, or before the node informer has listed,
  ``max_cards`` is None and the check is skipped, so an operator who installs gpuslice before
  the device plugins is not blocked;
* ``hami.io/node-scheduler-policy`` names no registered policy, or
  ``hami.io/gpu-scheduler-policy`` is neither a registered policy nor a valid HAMi chain of sort
  keys and filters (``binpack,numa``, ``mutex,spread``; ``policy.chains``). The values are read by
  ``codec.pod_selectors`` and resolved exactly as the extender resolves them, so the webhook
  refuses what the scheduler would answer ``InvalidRequest`` to;
* ``hami.io/device-scoring-weights`` or ``hami.io/numa-hint`` is malformed, or anything else
  ``codec.resources.parse_pod`` (the scheduler's reader) rejects;
* ``spec.nodeName`` is preset (HAMi: ``pod has node assigned``): the pod would bypass the scheduler;
* with ``deny_privileged``, a container is privileged (HAMi: ``container %s is privileged``).

Pods without GPU resources, pods labelled ``hami.io/webhook: ignore`` and every operation other
than CREATE are allowed untouched.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from gpuslice.codec import errors as codec_errors
from gpuslice.codec import keys, pod_selectors, podspec, quantity, resources
from gpuslice.framework import registry
from gpuslice.model import config as model_config
from gpuslice.policy import api
from gpuslice.webhook import gpupod, review

INVALID = 400
FORBIDDEN = 403


class Options(msgspec.Struct, frozen=True, kw_only=True):
    """How the validating route judges pods.

    Attributes:
        deny_privileged: refuse GPU pods with a privileged container.
        request_config: resource names and the scheduler's parse settings.
    """

    deny_privileged: bool = False
    request_config: model_config.RequestConfig = model_config.DEFAULT_REQUEST_CONFIG


def _amount(container: str, name: str, raw: object) -> tuple[int | None, str | None]:
    """An integer amount, or the problem with it."""
    try:
        q = quantity.parse(raw, name)
    except codec_errors.DecodeError as err:
        return None, f"container {_quote(container)}: {name} {err.detail}"
    value = quantity.as_int64(q)
    if value is None or value < 0:
        return None, f"container {_quote(container)}: {name} must be a non-negative integer, got {raw}"
    return value, None


def _range(config: model_config.RequestConfig) -> dict[str, tuple[int, int]]:
    """Allowed values per resource: the reader's percentage range without 0, cores 0..100."""
    names = config.names
    high = resources.PERCENTAGE_RANGE[1]
    return {names.memory_percentage: (1, high), names.cores: (0, 100)}


def container_problems(
    c: gpupod.Container, config: model_config.RequestConfig, max_cards: int | None
) -> list[str]:
    """Problems with one container's GPU amounts (every value in limits and in requests).

    Every percentage ``codec.resources.container_request`` refuses is refused here too, with the
    container's name; 0 is refused here as well (see the module docstring).
    """
    problems: list[str] = []
    ranges = _range(config)
    name_q = _quote(c.name)
    amounts: dict[str, int] = {}
    for name in gpupod.managed(config.names):
        seen: list[object] = []
        for source in (c.limits, c.requests):
            if name not in source or source[name] in seen:
                continue
            seen.append(source[name])
            value, problem = _amount(c.name, name, source[name])
            if problem is not None:
                problems.append(problem)
                continue
            assert value is not None
            amounts.setdefault(name, value)  # limits first, as the scheduler reads them
            low, high = ranges.get(name, (0, value))
            if not low <= value <= high:
                problems.append(f"container {name_q}: {name} must be in {low}..{high}, got {value}")
    count = amounts.get(config.names.count)
    if max_cards is not None and count is not None and count > max_cards:
        problems.append(
            f"container {name_q}: {config.names.count} is {count}, "
            f"more cards than any node registers (largest: {max_cards})"
        )
    return problems


def _quote(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def policy_problems(annotations: Mapping[str, str]) -> list[str]:
    """Unknown node or card policies (read as the extender reads them; card policies may be chains)."""
    problems: list[str] = []
    node = pod_selectors.node_policy(annotations)
    if node is not None and node not in registry.names():
        problems.append(
            f"{keys.NODE_SCHEDULER_POLICY}: unknown policy {node!r}; known: {', '.join(registry.names())}"
        )
    card = pod_selectors.card_policy(annotations)
    if card is not None:
        try:
            registry.card_policy(card)
        except api.UnknownPolicyError as err:
            problems.append(f"{keys.GPU_SCHEDULER_POLICY}: {err}")
    return problems


def annotation_problems(annotations: Mapping[str, str]) -> list[str]:
    """Malformed GPU annotations: policies, scoring weights, NUMA hint."""
    problems = policy_problems(annotations)
    for check in (pod_selectors.scoring_weights, pod_selectors.numa_hint):
        try:
            check(annotations)
        except codec_errors.DecodeError as err:
            problems.append(f"{err.annotation}: {err.detail}")
    return problems


def _privileged(c: gpupod.Container) -> bool:
    context = c.spec.get("securityContext")
    return isinstance(context, Mapping) and context.get("privileged") is True


def validate_pod(pod: Mapping[str, object], options: Options, max_cards: int | None) -> review.Decision:
    """The validating webhook's decision for one pod being created.

    Args:
        pod: the pod object.
        options: what to refuse.
        max_cards: the most cards any registered node has; None = unknown (skip that check).
    """
    config = options.request_config
    try:
        items = gpupod.containers(pod)
        if gpupod.opted_out(pod) or not gpupod.wants_gpu(items, config.names):
            return review.allow()
        annotations = podspec.pod_annotations(pod)
        node_name = podspec.spec(pod).get("nodeName")
    except codec_errors.DecodeError as err:
        return review.undecodable(f"cannot decode the pod: {err}")
    invalid: list[str] = []
    for c in items:
        invalid.extend(container_problems(c, config, max_cards))
    invalid.extend(annotation_problems(annotations))
    if not invalid:
        try:
            resources.parse_pod(pod, config)  # anything else the scheduler's reader refuses
        except codec_errors.DecodeError as err:
            invalid.append(f"cannot read the pod's GPU request: {err}")
    forbidden: list[str] = []
    if options.deny_privileged:
        privileged = next((c for c in items if _privileged(c)), None)
        if privileged is not None:
            forbidden.append(f"container {_quote(privileged.name)} is privileged")
    if node_name:
        forbidden.append("pod has node assigned")
    if invalid or forbidden:
        return review.deny("; ".join(invalid + forbidden), INVALID if invalid else FORBIDDEN)
    return review.allow()


def admit(request: review.AdmissionRequest, options: Options, max_cards: int | None) -> review.Decision:
    """The validating webhook's decision for one admission request (pods on CREATE only)."""
    if not review.is_pod(request) or request.operation != review.CREATE:
        return review.allow(f"not a pod creation ({request.kind.kind} {request.operation})")
    pod = review.pod_object(request)
    if isinstance(pod, review.Decision):
        return pod
    return validate_pod(pod, options, max_cards)
