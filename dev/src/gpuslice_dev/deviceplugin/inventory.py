"""The node's cards as the device plugin serves them: kubelet's replica list and HAMi's registration.

Cards come from the node agent's backend (``agent.backend``: NVML, or a recorded fake shape) read
through ``agent.collect`` and interpreted by ``agent.discover``, so the registered type, memory
and core scaling are the agent's rules. Health is a mapping of NVML index to a flag, kept by the
agent's ``health.Tracker`` (HAMi marks a card unhealthy on a critical XID).

kubelet sees every card ``split_count`` times: device IDs ``<UUID>-<i>`` for ``i`` in
``0..split_count-1`` (HAMi's ``GetPluginDevices``), all with the card's health and, when the card
has a NUMA node, its topology.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from gpuslice.agent import collect, discover
from gpuslice.codec import registrations
from gpuslice.model import devices
from gpuslice_dev.deviceplugin.v1beta1 import api_pb2

HEALTHY = "Healthy"
"""``v1beta1.Healthy``."""
UNHEALTHY = "Unhealthy"
"""``v1beta1.Unhealthy``."""


@dataclasses.dataclass(frozen=True)
class Card:
    """One physical card.

    Attributes:
        uuid: NVML UUID.
        index: NVML index (also the minor number of ``/dev/nvidia<index>``).
        numa: NUMA node; None when NVML and sysfs do not know it.
        registered: the card as written in ``hami.io/node-nvidia-register`` (with its health).
    """

    uuid: str
    index: int
    numa: int | None
    registered: devices.GpuDevice

    @property
    def healthy(self) -> bool:
        """The card's health as registered."""
        return self.registered.health


@dataclasses.dataclass(frozen=True)
class Inventory:
    """The cards of one node at one moment (immutable; a health change makes a new one).

    Attributes:
        cards: by NVML index order.
        notes: what discovery could not read, in words (for the log).
    """

    cards: tuple[Card, ...] = ()
    notes: tuple[str, ...] = ()

    def by_uuid(self) -> dict[str, Card]:
        """Cards keyed by UUID."""
        return {c.uuid: c for c in self.cards}

    def registration(self) -> str:
        """The ``hami.io/node-nvidia-register`` value (HAMi's JSON form)."""
        return registrations.encode_json(c.registered for c in self.cards)


def build(
    records: collect.Records, config: discover.RegistrationConfig, health: Mapping[int, bool] | None = None
) -> Inventory:
    """Interpret a backend's records (``collect.inventory``) with the registration settings."""
    found = discover.discover(records, config, health)
    cards = tuple(
        Card(uuid=d.uuid, index=d.index, numa=numa if numa is not None and numa >= 0 else None, registered=d)
        for d, numa in zip(found.devices, found.numa, strict=True)
    )
    return Inventory(cards=cards, notes=found.notes)


def replica_ids(card: Card, split_count: int) -> list[str]:
    """Kubelet's device IDs for one card: ``<UUID>-0`` .. ``<UUID>-<split_count-1>``."""
    return [f"{card.uuid}-{i}" for i in range(split_count)]


def kubelet_devices(
    inventory: Inventory, split_count: int, numa_topology: bool = True
) -> list[api_pb2.Device]:
    """The ``ListAndWatch`` list: every replica of every card, with health and NUMA topology."""
    out: list[api_pb2.Device] = []
    for card in inventory.cards:
        topology = None
        if numa_topology and card.numa is not None:
            topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=card.numa)])
        health = HEALTHY if card.healthy else UNHEALTHY
        for device_id in replica_ids(card, split_count):
            out.append(api_pb2.Device(ID=device_id, health=health, topology=topology))
    return out


def physical_id(device_id: str) -> str:
    """The card UUID of a kubelet device ID, by HAMi's rule (``physicalDeviceID`` in server.go).

    ``<UUID>::<n>`` (NVIDIA's annotated replica) gives the part before ``::``; an ID with exactly six
    dashes whose last part is a number (``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx-3``) loses that
    suffix; anything else is already a card ID.
    """
    if "::" in device_id:
        return device_id.split("::", 1)[0]
    if device_id.count("-") == 6:
        head, _, tail = device_id.rpartition("-")
        if tail.isdigit():
            return head
    return device_id


def card_order(inventory: Inventory) -> dict[str, int]:
    """Position of each card UUID in the inventory (ties and sort keys for preferred allocations)."""
    return {c.uuid: pos for pos, c in enumerate(inventory.cards)}


def health_of(inventory: Inventory) -> dict[int, bool]:
    """Healthy flag per NVML index."""
    return {c.index: c.healthy for c in inventory.cards}


def unique(items: Sequence[str]) -> list[str]:
    """Items in first-seen order without repeats."""
    return list(dict.fromkeys(items))
