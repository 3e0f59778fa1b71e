"""What the agent writes on its Node: annotation values from a discovery, and the patch to send.

Pure: values come from the codecs, every value is decoded again before it may be written (so a
bug can never publish a malformed annotation), and only keys whose value changed are patched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from gpuslice.agent import discover
from gpuslice.codec import errors, instants, keys, registrations, telemetry, topology
from gpuslice.model import nodes

log = logging.getLogger(__name__)

TOPOLOGY_KEYS = (keys.NODE_PAIR_SCORE, keys.GPU_TOPOLOGY)
"""Written whenever the node has cards."""


def _numa(found: discover.Discovery) -> list[int] | None:
    """NUMA nodes for the topology annotation; omitted when NVML knew none of them."""
    if all(n is None for n in found.numa):
        return None
    return [max(n or 0, 0) for n in found.numa]


def topology_annotations(found: discover.Discovery, *, register: bool) -> dict[str, str]:
    """The annotations for a discovery: pair scores and topology, plus the registration if asked.

    A node without cards gets no topology keys, and with ``register`` HAMi's empty list ``[]``.
    """
    out: dict[str, str] = {}
    if found.topology is not None:
        out[keys.NODE_PAIR_SCORE] = topology.encode_score_matrix(found.topology.uuids, found.scores)
        out[keys.GPU_TOPOLOGY] = topology.encode_topology(found.topology, _numa(found))
    if register:
        out[keys.NODE_REGISTER] = registrations.encode_json(found.devices)
    return _checked(out)


def telemetry_annotation(cards: Iterable[nodes.CardTelemetry], now: instants.Instant) -> dict[str, str]:
    """The telemetry annotation for readings taken at ``now`` (wall-clock)."""
    return _checked({keys.GPU_TELEMETRY: telemetry.encode(cards, now)})


_CHECKS: dict[str, Callable[[str], object]] = {
    keys.NODE_REGISTER: registrations.decode,
    keys.NODE_PAIR_SCORE: topology.decode_pair_scores,
    keys.GPU_TOPOLOGY: topology.decode_topology,
    keys.GPU_TELEMETRY: telemetry.decode,
}


def _checked(values: dict[str, str]) -> dict[str, str]:
    """Drop (and log) any value its own decoder rejects."""
    out: dict[str, str] = {}
    for key, value in values.items():
        try:
            _CHECKS[key](value)
        except (errors.DecodeError, ValueError) as e:
            log.error("not publishing %s: the encoded value does not decode (%s)", key, e)
            continue
        out[key] = value
    return out


def changes(
    current: Mapping[str, str], desired: Mapping[str, str], remove: Iterable[str] = ()
) -> dict[str, str | None]:
    """The merge patch: desired keys whose value differs, and ``remove`` keys still present (None)."""
    patch: dict[str, str | None] = {k: v for k, v in desired.items() if current.get(k) != v}
    for key in remove:
        if key not in desired and key in current:
            patch[key] = None
    return patch


TEMPERATURE_STEP_C = 2.0
"""Temperature changes smaller than this are not worth a patch."""
POWER_STEP = 0.05
"""Power changes smaller than this share of the limit (or of 200 W without a limit) are not."""
UTILIZATION_STEP_PCT = 5.0
MEMORY_STEP_MIB = 256


def _moved(old: float | None, new: float | None, step: float) -> bool:
    if old is None or new is None:
        return (old is None) != (new is None)
    return abs(new - old) >= step


def material_change(old: nodes.CardTelemetry, new: nodes.CardTelemetry) -> bool:
    """Whether a card's readings moved enough to publish (jitter below the steps is not)."""
    power_step = POWER_STEP * (new.power_limit_w or old.power_limit_w or 200.0)
    return (
        _moved(old.temperature_c, new.temperature_c, TEMPERATURE_STEP_C)
        or _moved(old.power_draw_w, new.power_draw_w, power_step)
        or _moved(old.power_limit_w, new.power_limit_w, power_step)
        or _moved(old.utilization_pct, new.utilization_pct, UTILIZATION_STEP_PCT)
        or _moved(old.memory_used_mib, new.memory_used_mib, MEMORY_STEP_MIB)
    )


def telemetry_changed(
    current: str | None, cards: tuple[nodes.CardTelemetry, ...], now: float, max_age_s: float
) -> bool:
    """Whether new readings are worth a patch.

    True when a card came or went or moved materially (``material_change``), when the published
    readings are older than ``max_age_s`` (readers judge freshness by the timestamp), or when
    nothing valid is published. Small jitter alone never patches the Node, so a busy cluster's
    Nodes are not rewritten every telemetry period.
    """
    if current is None:
        return True
    try:
        old = telemetry.decode(current)
    except errors.DecodeError:
        return True
    if [c.uuid for c in old.cards] != [c.uuid for c in cards]:
        return True
    if any(material_change(o, n) for o, n in zip(old.cards, cards, strict=True)):
        return True
    return now - old.timestamp.timestamp() >= max_age_s
