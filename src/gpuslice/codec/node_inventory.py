"""A node's annotations as a ``NodeInventory``: cards, cordons, topology and telemetry."""

from __future__ import annotations

from collections.abc import Mapping

from gpuslice.codec import errors, keys, pod_selectors, registrations, telemetry, topology
from gpuslice.model import devices, limits, nodes
from gpuslice.model import topology as model_topology


def node_devices(annotations: Mapping[str, str]) -> tuple[devices.GpuDevice, ...]:
    """The registered cards, as HAMi's ``GetNodeDevices`` requires them.

    Unlike HAMi HEAD, the legacy colon format is accepted as well as JSON.

    Raises:
        AnnotationMissing: no ``hami.io/node-nvidia-register``.
        DecodeError: a malformed registration, one listing no card (``no gpu found on node``) or
            more than ``limits.MAX_CARDS`` cards.
    """
    value = annotations.get(keys.NODE_REGISTER)
    if value is None:
        raise errors.AnnotationMissing(keys.NODE_REGISTER)
    cards = registrations.decode(value)
    if not cards:
        raise errors.DecodeError(keys.NODE_REGISTER, "value", "no gpu found on node")
    if len(cards) > limits.MAX_CARDS:
        raise errors.DecodeError(
            keys.NODE_REGISTER, "value", f"{len(cards)} cards registered, more than {limits.MAX_CARDS}"
        )
    return cards


def cordoned(annotations: Mapping[str, str]) -> frozenset[str]:
    """UUIDs listed in ``hami.io/device-cordon`` (comma list; blanks ignored)."""
    return frozenset(pod_selectors.split_list(annotations.get(keys.DEVICE_CORDON)))


def node_topology(
    annotations: Mapping[str, str], cards: tuple[devices.GpuDevice, ...] = ()
) -> model_topology.Topology | None:
    """The topology: gpuslice's annotation when present, else one derived from HAMi's pair scores.

    Both are validated when both are present (HAMi fails a node whose pair scores are bad).

    Raises:
        DecodeError: a malformed topology or pair-score annotation.
    """
    scores_value = annotations.get(keys.NODE_PAIR_SCORE)
    scores = None if scores_value is None else topology.decode_pair_scores(scores_value)
    own = annotations.get(keys.GPU_TOPOLOGY)
    if own is not None:
        return topology.decode_topology(own).topology
    if scores is not None:
        return topology.topology_from_pair_scores(scores, tuple(d.uuid for d in cards))
    return None


def node_telemetry(annotations: Mapping[str, str]) -> tuple[nodes.CardTelemetry, ...]:
    """Per-card telemetry; empty when absent or malformed (telemetry is advisory, never blocking)."""
    value = annotations.get(keys.GPU_TELEMETRY)
    if value is None:
        return ()
    try:
        return telemetry.decode(value).cards
    except errors.DecodeError:
        return ()


def decode_node(name: str, annotations: Mapping[str, str]) -> nodes.NodeInventory:
    """Everything a node's annotations say about its GPUs.

    Raises:
        AnnotationMissing: the node has no registration (HAMi: ``node unregistered``).
        DecodeError: a malformed registration, topology or pair-score annotation, no cards, or a
            card with zero or negative capacity (split count, memory or cores): such a card
            could never hold a pod, and negative capacity would corrupt every sum over the node.
    """
    cards = node_devices(annotations)
    for i, card in enumerate(cards):
        for field, value in (
            ("count", card.split_count),
            ("devmem", card.memory_mib),
            ("devcore", card.cores),
        ):
            if value <= 0:
                raise errors.DecodeError(
                    keys.NODE_REGISTER,
                    f"[{i}].{field}",
                    f"card {card.uuid}: {field} must be > 0, got {value}",
                )
    return nodes.NodeInventory(
        name=name,
        devices=cards,
        topology=node_topology(annotations, cards),
        cordoned=cordoned(annotations),
        telemetry=node_telemetry(annotations),
    )
