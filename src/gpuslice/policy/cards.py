"""Per-card eligibility: the one reason a card cannot take a container's request, or None.

Checks run in HAMi's order (``pkg/device/nvidia/device.go`` ``Fit``) and the first failing one
names the card's reason:

1. ``DEVICE_UNHEALTHY`` - the card reported a fault.
2. ``DEVICE_CORDONED`` - the UUID is in the node's cordon list.
3. ``DEVICE_TYPE_MISMATCH`` - use/nouse types (case-insensitive substring) or the mode differ.
4. ``UUID_FILTERED`` - use/nouse UUIDs exclude the card.
5. ``NUMA_UNSATISFIED`` - a NUMA hint names another NUMA node.
6. ``GPU_SLOTS_EXHAUSTED`` - every slot is taken.
7. ``EXCLUSIVE_CONFLICT`` - the card policy admits only idle cards (``mutex``) and the card is
   in use.
8. ``INSUFFICIENT_GPU_MEMORY`` then 9. ``INSUFFICIENT_GPU_CORES``.
10. ``EXCLUSIVE_CONFLICT`` - a 100-core request on a card that registers exactly 100 cores and is
    in use (HAMi's ``ExclusiveDeviceAllocateConflict``). On a core-scaled card (``devcore`` 200)
    100 cores are an ordinary share, as in HAMi.
11. ``EXCLUSIVE_CONFLICT`` - a request without cores on a card whose cores are all taken (HAMi's
    ``CardComputeUnitsExhausted``: a 100-core task holds it).

Quota (``QUOTA_EXCEEDED``) is checked by ``fit`` after these, since it depends on the whole pod.
"""

from __future__ import annotations

from gpuslice.model import devices, nodes, requests, status
from gpuslice.policy import mig as migs


def type_matches(card_type: str, selectors: requests.Selectors) -> bool:
    """True when a card type passes use/nouse type selectors (case-insensitive substrings)."""
    t = card_type.lower()
    if selectors.use_types and not any(u.lower() in t for u in selectors.use_types if u):
        return False
    return not any(n.lower() in t for n in selectors.nouse_types if n)


def static_reason(
    dev: devices.GpuDevice, cordoned: frozenset[str], selectors: requests.Selectors
) -> str | None:
    """Reasons that do not depend on usage (freeing capacity never helps these)."""
    if not dev.health:
        return status.DEVICE_UNHEALTHY
    if dev.uuid in cordoned:
        return status.DEVICE_CORDONED
    if selectors is not requests.NO_SELECTORS:
        if (selectors.use_types or selectors.nouse_types) and not type_matches(dev.type, selectors):
            return status.DEVICE_TYPE_MISMATCH
        if not mode_matches(dev.mode, selectors.mode):
            return status.DEVICE_TYPE_MISMATCH
        if (selectors.use_uuids and dev.uuid not in selectors.use_uuids) or dev.uuid in selectors.nouse_uuids:
            return status.UUID_FILTERED
        if selectors.numa_node is not None and selectors.numa_node != dev.numa:
            return status.NUMA_UNSATISFIED
    return None


def held_exclusively(dev: devices.GpuDevice, usage: nodes.CardUsage) -> bool:
    """True when all of a card's cores are taken: a request without cores may not join it."""
    return dev.cores > 0 and usage.cores >= dev.cores


def capacity_reason(
    dev: devices.GpuDevice,
    usage: nodes.CardUsage,
    memory: int,
    cores: int,
    exclusive: bool,
    idle_only: bool = False,
) -> str | None:
    """Reasons that depend on what is in use (freeing capacity could help these).

    ``exclusive``: a grant asks for all 100 cores of the card (``cores`` already clamped);
    ``idle_only``: the card policy's ``mutex`` filter.
    """
    if usage.slots >= dev.split_count:
        return status.GPU_SLOTS_EXHAUSTED
    if idle_only and usage.slots > 0:
        return status.EXCLUSIVE_CONFLICT
    if dev.memory_mib - usage.memory_mib < memory:
        return status.INSUFFICIENT_GPU_MEMORY
    if dev.cores - usage.cores < cores:
        return status.INSUFFICIENT_GPU_CORES
    if exclusive and dev.cores == devices.FULL_CORES and usage.slots > 0:
        return status.EXCLUSIVE_CONFLICT
    if cores == 0 and held_exclusively(dev, usage):
        return status.EXCLUSIVE_CONFLICT
    return None


def mig_reason(
    dev: devices.GpuDevice, usage: nodes.CardUsage, memory: int, cores: int, idle_only: bool = False
) -> str | None:
    """``capacity_reason`` of a card in MIG mode, in HAMi's order (``Fit`` with its MIG rule).

    Slots, ``mutex``, memory and cores as on any card, then ``MIG_PLACEMENT_INFEASIBLE`` when no
    profile that serves ``memory`` has a free placement (``mig.fits``). HAMi's whole-card
    exclusivity checks do not apply: instances are isolated from each other.
    """
    if usage.slots >= dev.split_count:
        return status.GPU_SLOTS_EXHAUSTED
    if idle_only and usage.slots > 0:
        return status.EXCLUSIVE_CONFLICT
    if dev.memory_mib - usage.memory_mib < memory:
        return status.INSUFFICIENT_GPU_MEMORY
    if dev.cores - usage.cores < cores:
        return status.INSUFFICIENT_GPU_CORES
    if not migs.fits(dev, usage, memory):
        return status.MIG_PLACEMENT_INFEASIBLE
    return None


def admits(
    dev: devices.GpuDevice, usage: nodes.CardUsage, add: nodes.CardUsage, exclusive: bool
) -> str | None:
    """Whether a card can take a pod's whole reservation ``add`` on top of ``usage`` (for the cache).

    ``exclusive`` is True when one of the pod's grants on the card asks for 100 cores: on a card
    that registers exactly 100 cores it must then be unused. Otherwise the reservation must fit
    memory, cores and ``add.slots`` free slots, and a reservation without cores may not join a
    card whose cores are all taken.
    """
    if usage.slots + add.slots > dev.split_count:
        return status.GPU_SLOTS_EXHAUSTED
    if dev.is_mig or add.mig:
        return _mig_admits(dev, usage, add)
    return capacity_reason(dev, usage, add.memory_mib, add.cores, exclusive)


def _mig_admits(dev: devices.GpuDevice, usage: nodes.CardUsage, add: nodes.CardUsage) -> str | None:
    """A MIG card takes a reservation whose instances are legal placements on free slices.

    Memory and cores are not checked here: an instance's share is fixed by its placement, and the
    profiles' rounded-up core shares add up to more than 100 on a full card (seven ``1g`` of 15 %
    each), so the slices are the only capacity that binds.
    """
    if not dev.is_mig or len(add.mig) < add.slots:
        return status.MIG_PLACEMENT_INFEASIBLE  # an instance on a shared card, or a grant without one
    taken = migs.occupied(dev, usage)
    for s in add.mig:
        m = ((1 << s.size) - 1) << s.start
        if m & taken or not migs.legal(dev, s):
            return status.MIG_PLACEMENT_INFEASIBLE
        taken |= m
    return None


def mode_matches(card_mode: str, wanted: str | None) -> bool:
    """Whether a card's mode satisfies ``nvidia.com/vgpu-mode``.

    HAMi checks that the annotation value contains the card's mode, so ``"hami-core,mig"`` accepts
    either; None (no annotation) accepts every mode.
    """
    return wanted is None or card_mode in wanted
