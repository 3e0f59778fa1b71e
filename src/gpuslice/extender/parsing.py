"""A pod's GPU request, or the one refusal every caller checks: a ``status.Status``.

The filter's request memo (``http.app._Requests``), ``/explain``, the cluster view and
``gpuslice explain`` all parse through ``parse_pod``. A request that does not decode is not a bare
string but ``status.invalid_request``: unresolvable, reason ``InvalidRequest``, the decoder's
words in ``message`` (which the wire answers and events quote unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from gpuslice.codec import errors as codec_errors
from gpuslice.codec import gangs as codec_gangs
from gpuslice.codec import keys, resources
from gpuslice.kube import objects
from gpuslice.model import config as model_config
from gpuslice.model import gangs, requests, status

Parsed = requests.PodRequest | status.Status
"""A pod's request, or why it has none (``status.invalid_request``)."""


def parse_pod(
    pod: Mapping[str, Any], config: model_config.RequestConfig = model_config.DEFAULT_REQUEST_CONFIG
) -> Parsed:
    """``codec.resources.parse_pod`` of a pod as builtins, its DecodeError as a refusing Status."""
    try:
        return resources.parse_pod(pod, config)
    except codec_errors.DecodeError as err:
        return status.invalid_request(str(err))


def request_of(
    pod: objects.Pod, config: model_config.RequestConfig = model_config.DEFAULT_REQUEST_CONFIG
) -> Parsed:
    """A watched or read pod's GPU request, or why it is invalid."""
    as_dict = msgspec.to_builtins(pod)
    as_dict.setdefault("metadata", {})["namespace"] = pod.metadata.namespace
    return parse_pod(as_dict, config)


def gang_of(
    namespace: str,
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
    scheduling_group: object = None,
    workload_ref: object = None,
) -> gangs.GangRef | None | status.Status:
    """The gang a pod names (``codec.gangs.gang_of``), or why its gang fields are invalid.

    Takes only the parts that name a gang, so a pod without them costs a few lookups.
    """
    label = labels.get(keys.POD_GROUP_LABEL) if labels else None
    annotations = annotations or {}
    own = {k: annotations[k] for k in _GANG_ANNOTATIONS if k in annotations}
    if label is None and scheduling_group is None and workload_ref is None and not own:
        return None
    spec = {
        k: v
        for k, v in (("schedulingGroup", scheduling_group), ("workloadRef", workload_ref))
        if v is not None
    }
    part: dict[str, Any] = {
        "metadata": {
            "namespace": namespace,
            "labels": {} if label is None else {keys.POD_GROUP_LABEL: label},
            "annotations": own,
        },
        "spec": spec,
    }
    try:
        return codec_gangs.gang_of(part)
    except codec_errors.DecodeError as err:
        return status.invalid_request(str(err))


_GANG_ANNOTATIONS = (keys.GANG, keys.GANG_MIN_MEMBERS, keys.GANG_TIMEOUT_SECONDS)
