"""``hami.io/gpu-topology-requirement``: what a multi-card container needs between its cards.

The value is a JSON object with the topology-aware design document's field names::

    {"RequireNVLink": true, "MinGPUBandwidth": 200}

``RequireNVLink`` (a JSON boolean, default false): every pair of a container's cards must be
NVLink-connected. ``MinGPUBandwidth`` (a JSON number, GB/s per direction, default 0): every pair's
link bandwidth must be at least this. Both are optional; an empty object, an absent or blank
annotation, or one that asks for nothing (false and 0) is no requirement.

Anything else is an invalid request, refused with a ``DecodeError`` naming the annotation and the
field, as the other pod annotations are: malformed JSON, not an object, a field of the wrong type
(``"true"`` is a string, not a boolean), a negative or non-finite bandwidth, or an unknown field
(a misspelt ``requireNVLink`` must not silently ask for nothing). See docs/topology.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from gpuslice.codec import errors, keys
from gpuslice.model import requests

REQUIRE_NVLINK = "RequireNVLink"
MIN_BANDWIDTH = "MinGPUBandwidth"
_FIELDS = (REQUIRE_NVLINK, MIN_BANDWIDTH)


def _fail(field: str, detail: str) -> errors.DecodeError:
    return errors.DecodeError(keys.GPU_TOPOLOGY_REQUIREMENT, field, detail)


def requirement(annotations: Mapping[str, str]) -> requests.TopologyRequirement | None:
    """The pod's topology requirement, or None when it asks for nothing.

    Raises:
        DecodeError: see the module docstring; ``field`` names the offending field (``json`` for
            a value that is not a JSON object).
    """
    raw = annotations.get(keys.GPU_TOPOLOGY_REQUIREMENT, "").strip()
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise _fail("json", f"invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise _fail("json", f"must be a JSON object with {' and/or '.join(_FIELDS)}, got {raw}")
    unknown = sorted(k for k in value if k not in _FIELDS)
    if unknown:
        raise _fail(unknown[0], f"unknown field {unknown[0]!r}; known: {', '.join(_FIELDS)}")
    nvlink = value.get(REQUIRE_NVLINK, False)
    if not isinstance(nvlink, bool):
        raise _fail(REQUIRE_NVLINK, f"{REQUIRE_NVLINK} must be true or false, got {json.dumps(nvlink)}")
    bandwidth = value.get(MIN_BANDWIDTH, 0)
    if isinstance(bandwidth, bool) or not isinstance(bandwidth, int | float):
        raise _fail(MIN_BANDWIDTH, f"{MIN_BANDWIDTH} must be a number (GB/s), got {json.dumps(bandwidth)}")
    if not math.isfinite(bandwidth) or bandwidth < 0:
        raise _fail(MIN_BANDWIDTH, f"{MIN_BANDWIDTH} must be a non-negative number (GB/s), got {bandwidth}")
    got = requests.TopologyRequirement(require_nvlink=nvlink, min_bandwidth_gbps=float(bandwidth))
    return got if got.active else None


def encode(req: requests.TopologyRequirement) -> str:
    """The annotation value for a requirement (tests, tools)."""
    return json.dumps({REQUIRE_NVLINK: req.require_nvlink, MIN_BANDWIDTH: req.min_bandwidth_gbps})
