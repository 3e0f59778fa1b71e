"""``GetPreferredAllocation``: which replica IDs kubelet should hand to a container (pure).

HAMi (``GetPreferredAllocation`` / ``selectPreferredDeviceIDsFromAnnotatedDevices`` in
server.go): when the pod being allocated is known, the container's cards are those of the next
non-empty entry of ``hami.io/vgpu-devices-to-allocate``; keep kubelet's must-include IDs, then
for each annotated card not yet covered by them take the first available replica of that card.
When that fails (or no pod is known) HAMi sends no answer for the container and kubelet picks
by itself; gpuslice answers instead with a sensible default: must-include first, then one
replica per card not yet used, cards in NVML order, before second replicas of any card (each
HAMi container's cards are different physical cards).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuslice.model import allocations
from gpuslice_dev.deviceplugin import inventory


class NoPreference(Exception):
    """The annotated cards cannot be served from the IDs kubelet offers."""


def from_annotation(
    available: Sequence[str],
    must_include: Sequence[str],
    desired: allocations.ContainerAllocation,
    size: int,
) -> list[str]:
    """HAMi's choice: the replicas of the annotated cards.

    Raises:
        NoPreference: fewer annotated cards than ``size``, or an annotated card with no free replica.
    """
    if len(desired) < size:
        raise NoPreference(f"annotated devices {len(desired)} smaller than requested allocation size {size}")
    selected = list(must_include)
    required = {inventory.physical_id(i): 0 for i in must_include}
    for device_id in must_include:
        required[inventory.physical_id(device_id)] += 1
    taken = set(must_include)
    free: dict[str, list[str]] = {}
    for device_id in available:
        if device_id not in taken:
            free.setdefault(inventory.physical_id(device_id), []).append(device_id)
    for grant in desired[:size]:
        card = inventory.physical_id(grant.uuid)
        if required.get(card, 0) > 0:
            required[card] -= 1
            continue
        candidates = free.get(card)
        if not candidates:
            raise NoPreference(f"no available slice device found for annotated GPU {card}")
        selected.append(candidates.pop(0))
    if len(selected) != size:
        raise NoPreference(f"preferred allocation selected {len(selected)} devices, want {size}")
    return selected


def default(
    available: Sequence[str], must_include: Sequence[str], size: int, order: Mapping[str, int]
) -> list[str]:
    """Must-include first, then replicas spread over distinct cards (NVML order), up to ``size``."""
    selected = list(dict.fromkeys(must_include))
    used = {inventory.physical_id(i) for i in selected}
    rest = sorted(
        (i for i in dict.fromkeys(available) if i not in selected),
        key=lambda i: (order.get(inventory.physical_id(i), len(order)), inventory.physical_id(i), i),
    )
    rounds: list[list[str]] = []  # rounds[k]: the k-th unused replica of each card, cards in order
    seen: dict[str, int] = {}
    for device_id in rest:
        card = inventory.physical_id(device_id)
        k = seen.get(card, 0) + (1 if card in used else 0)
        seen[card] = seen.get(card, 0) + 1
        while len(rounds) <= k:
            rounds.append([])
        rounds[k].append(device_id)
    for batch in rounds:
        for device_id in batch:
            if len(selected) >= size:
                return selected
            selected.append(device_id)
    return selected


def choose(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    desired: allocations.ContainerAllocation | None,
    order: Mapping[str, int],
) -> list[str]:
    """HAMi's annotated choice when it works, else ``default``."""
    if desired:
        try:
            return from_annotation(available, must_include, desired, size)
        except NoPreference:
            pass
    return default(available, must_include, size, order)
