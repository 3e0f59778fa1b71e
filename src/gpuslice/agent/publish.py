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


def telemetry_changed(
    current: str | None, cards: tuple[nodes.CardTelemetry, ...], now: float, max_age_s: float
) -> bool:
    """Whether new readings are worth a patch.

    True when they differ from the published ones, when those are older than ``max_age_s``
    (readers judge freshness by the timestamp), or when nothing valid is published.
    """
    if current is None:
        return True
    try:
        old = telemetry.decode(current)
    except errors.DecodeError:
        return True
    if old.cards != cards:
        return True
    return now - old.timestamp.timestamp() >= max_age_s
