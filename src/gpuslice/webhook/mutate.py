"""The mutating route: scheduler name and HAMi's resource defaults as a JSON patch (pure).

Follows HAMi's ``pkg/scheduler/webhook.go`` (``Handle``) and ``pkg/device/nvidia/device.go``
(``MutateAdmission``):

* only pods that name a managed GPU resource are touched (``gpupod.wants_gpu``), and not those
  labelled ``hami.io/webhook: ignore``;
* a pod naming a scheduler other than ``default-scheduler`` and ours is left alone entirely;
  otherwise ``spec.schedulerName`` becomes ours;
* per container (init containers too): the default count (``defaultGPUNum``, 1) is added when
  limits give only gpumem / gpumem-percentage / gpucores, and ``nvidia.com/gpucores: 100`` when
  the container has cards, no gpucores and whole-card memory (HAMi's exclusive whole card).

Resource names come from ``Options.request_config.names`` (``--resource-*-name``), never constants.
The rules themselves are ``gpuslice.codec.resources.webhook_limits`` and ``webhook_request``, the
code the scheduler reads pods with; the patch adds exactly the difference between the request
with the webhook's rules and HAMi's plain parse of the patched container, so a pod parses to the
same request before and after the patch. Keys are added to ``limits`` (as HAMi does) and also to
``requests`` when the container's requests already name a managed resource (the apiserver
copies limits into requests before admission; an extended resource needs requests == limits);
a key already given there keeps its value.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from gpuslice.codec import errors as codec_errors
from gpuslice.codec import podspec, resources
from gpuslice.model import config as model_config
from gpuslice.webhook import gpupod, review


class Options(msgspec.Struct, frozen=True, kw_only=True):
    """How the mutating route defaults pods.

    Attributes:
        scheduler_name: the schedulerName GPU pods get.
        request_config: resource names and HAMi's defaults (``default_gpu_num``).
    """

    scheduler_name: str = "gpuslice-scheduler"
    request_config: model_config.RequestConfig = model_config.DEFAULT_REQUEST_CONFIG


def container_defaults(c: gpupod.Container, config: model_config.RequestConfig) -> dict[str, str]:
    """The resources the webhook adds to one container (name -> quantity); empty for none.

    Raises:
        DecodeError: a managed resource whose value is not a quantity.
    """
    names = config.names
    added: dict[str, str] = {}
    defaulted = resources.webhook_limits(c.limits, config)
    if names.count not in c.limits and names.count in defaulted:
        added[names.count] = str(defaulted[names.count])
    if names.cores in c.limits or names.cores in c.requests:
        return added
    want = resources.webhook_request(c.limits, c.requests, config)
    plain = resources.generate_request({**c.limits, **added}, c.requests, config)
    if want is not None and plain is not None and want.cores != plain.cores:
        added[names.cores] = str(want.cores)
    return added


def container_patch(
    c: gpupod.Container, added: Mapping[str, str], config: model_config.RequestConfig
) -> list[review.PatchOp]:
    """JSON patch operations adding ``added`` where the container gives its GPU resources.

    To ``limits`` when they name a managed resource (as HAMi does), and to ``requests`` when
    they do; a container naming GPU resources in requests only gets the keys there, since the
    scheduler's reader applies the default count when limits name a GPU resource.
    """
    if not added:
        return []
    keys = gpupod.managed(config.names)
    in_requests = any(n in c.requests for n in keys)
    in_limits = any(n in c.limits for n in keys)
    base: list[str | int] = ["spec", c.field, c.position, "resources"]
    ops: list[review.PatchOp] = []
    for where, present, current in (("limits", in_limits, c.limits), ("requests", in_requests, c.requests)):
        if present:  # the map exists: it names a managed resource
            ops.extend(
                review.add([*base, where, name], value)
                for name, value in added.items()
                if name not in current
            )
    return ops


def mutate_pod(pod: Mapping[str, object], options: Options) -> review.Decision:
    """The mutating webhook's decision for one pod being created."""
    try:
        items = gpupod.containers(pod)
        if gpupod.opted_out(pod):
            return review.allow(f"labelled {gpupod.IGNORE_LABEL}={gpupod.IGNORE_VALUE}")
        config = options.request_config
        if not gpupod.wants_gpu(items, config.names):
            return review.allow("no GPU resource")
        current = podspec.spec(pod).get("schedulerName") or ""
        if current not in ("", gpupod.DEFAULT_SCHEDULER, options.scheduler_name):
            return review.allow(f"pod names scheduler {current!r}")
        ops: list[review.PatchOp] = []
        if current != options.scheduler_name:
            ops.append(review.add(["spec", "schedulerName"], options.scheduler_name))
        for c in items:
            ops.extend(container_patch(c, container_defaults(c, config), config))
    except codec_errors.DecodeError as err:
        return review.undecodable(f"cannot decode the pod: {err}")
    return review.Decision(allowed=True, patch=tuple(ops))


def admit(request: review.AdmissionRequest, options: Options) -> review.Decision:
    """The mutating webhook's decision for one admission request (pods on CREATE only)."""
    if not review.is_pod(request) or request.operation != review.CREATE:
        return review.allow(f"not a pod creation ({request.kind.kind} {request.operation})")
    pod = review.pod_object(request)
    if isinstance(pod, review.Decision):
        return pod
    return mutate_pod(pod, options)
