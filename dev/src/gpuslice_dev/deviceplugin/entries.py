"""``hami.io/vgpu-devices-to-allocate`` as the device plugin consumes it, one container at a time (pure).

The value holds one entry per container, init containers first, each terminated by ``;``
(``codec.pod_devices``). Every container that asks for GPUs gets one kubelet ``Allocate``
request, in the same order, so each request takes the first entry that still lists a card and
blanks it (HAMi's ``popNextContainerDevices``). Blanking is textual: the other entries and the
number of ``;`` stay as written, so positions keep naming containers (HAMi re-encodes the decoded
list, which adds one ``;`` per call; readers accept both).
"""

from __future__ import annotations

import dataclasses

from gpuslice.codec import keys, pod_devices
from gpuslice.model import allocations, devices

SEPARATOR = ";"


@dataclasses.dataclass(frozen=True)
class Popped:
    """The entry one ``Allocate`` request takes.

    Attributes:
        position: the entry's index (the container, init containers first).
        grants: its cards.
        remaining: the annotation value with that entry blanked.
    """

    position: int
    grants: allocations.ContainerAllocation
    remaining: str


def pop_next(value: str) -> Popped | None:
    """Take the first entry that lists a card; None when no entry does.

    Raises:
        codec.errors.DecodeError: a malformed entry anywhere in the value (HAMi decodes the whole
            annotation before taking one).
    """
    decoded = pod_devices.decode(value, keys.DEVICES_TO_ALLOCATE)
    parts = value.split(SEPARATOR)
    for position, grants in enumerate(decoded):
        if grants:
            parts[position] = ""
            return Popped(position=position, grants=grants, remaining=SEPARATOR.join(parts))
    return None


def has_pending(value: str) -> bool:
    """HAMi's completion test (``podAllocationTrySuccess``): the vendor keyword is still in the value."""
    return devices.VENDOR_NVIDIA in value


def first_pending(value: str) -> allocations.ContainerAllocation | None:
    """The cards of the next entry to be allocated, or None (malformed values give None too)."""
    try:
        popped = pop_next(value)
    except ValueError:
        return None
    return None if popped is None else popped.grants
