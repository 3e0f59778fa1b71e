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
from gpuslice.codec import resources
from gpuslice.kube import objects
from gpuslice.model import config as model_config
from gpuslice.model import requests, status

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
