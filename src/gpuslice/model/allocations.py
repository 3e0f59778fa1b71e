"""What a pod was given: per container, the cards and the memory/cores taken on each."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from gpuslice.model import devices, mig, nodes


class DeviceGrant(msgspec.Struct, frozen=True):
    """One card given to one container (HAMi's ``ContainerDevice``).

    On a card in MIG mode the grant is one GPU instance: ``mig`` names its profile and placement,
    and ``memory_mib`` / ``cores`` are the profile's, as HAMi's ``AddResourceUsage`` records them.
    A container may hold several instances of one card.
    """

    uuid: str
    memory_mib: int
    cores: int
    vendor: str = devices.VENDOR_NVIDIA
    mig: mig.Slice | None = None


def grant_usage(g: DeviceGrant) -> nodes.CardUsage:
    """What one grant alone takes on its card: one slot, its memory and cores, its MIG slice."""
    return nodes.CardUsage(1, g.memory_mib, g.cores, () if g.mig is None else (g.mig,))


ContainerAllocation = tuple[DeviceGrant, ...]
"""The cards of one container; empty for a container without GPUs."""


class PodAllocation(msgspec.Struct, frozen=True, kw_only=True):
    """A pod's placement: the node and one entry per container, init containers first.

    Attributes:
        node: the node name.
        containers: per container (init containers first, then app containers), its grants.
        init_count: how many of ``containers`` are init containers.
        sidecars: positions of the init containers that keep running beside the app containers
            (Kubernetes native sidecars, ``restartPolicy: Always``).
        cpu_milli: host CPU reserved (simulator only; 0 in the extender).
        memory_mib: host memory reserved (simulator only; 0 in the extender).
    """

    node: str
    containers: tuple[ContainerAllocation, ...]
    init_count: int = 0
    sidecars: tuple[int, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0


def card_charge(
    init_peak: tuple[int, int], app_sum: tuple[int, int, int], sidecar_sum: tuple[int, int, int]
) -> nodes.CardUsage:
    """What one card is charged for a pod's grants on it.

    ``init_peak`` is (memory, cores) of the largest init container, ``app_sum`` and
    ``sidecar_sum`` are (memory, cores, tasks) summed over app containers and native sidecars:
    memory and cores = sidecars + max(init peak, apps), slots = max(1, sidecar and app tasks).
    Sidecars start before the later init containers and run beside the app containers, so they
    add to both phases.
    """
    imem, icores = init_peak
    amem, acores, aslots = app_sum
    smem, scores, sslots = sidecar_sum
    return nodes.CardUsage(
        slots=max(1, aslots + sslots), memory_mib=smem + max(imem, amem), cores=scores + max(icores, acores)
    )


def card_reservation(alloc: PodAllocation, inits_done: bool = False) -> dict[str, nodes.CardUsage]:
    """Usage a pod holds per card UUID, with HAMi's init-container rule (``card_charge``).

    Init containers run one at a time, before the app containers, so each card is charged the
    peak over init containers, while app containers are summed: memory and cores =
    max(init peak, app sum) and slots = max(1, app occurrences) on every card the pod touches.
    Native sidecars (``alloc.sidecars``) are summed on top of both.

    Once every init container that is not a sidecar has succeeded (``inits_done``, see
    ``kube.objects.Pod.inits_done``) only the app containers and sidecars are charged, and a card
    that only those init containers touched is not charged at all. HAMi does the same
    (``CollapseInitContainerUsage`` / ``AppContainersOnly`` in ``pkg/device/initcontainer.go``).
    The result with ``inits_done`` is never larger, per card and in total, than without.
    """
    init_peak: dict[str, tuple[int, int]] = {}
    app_sum: dict[str, tuple[int, int, int]] = {}
    side_sum: dict[str, tuple[int, int, int]] = {}
    held: dict[str, list[mig.Slice]] = {}
    sidecars = alloc.sidecars
    for position, grants in enumerate(alloc.containers):
        for g in grants:
            if g.mig is not None:
                held.setdefault(g.uuid, []).append(g.mig)
        if position < alloc.init_count and position not in sidecars:
            if inits_done:
                continue
            for g in grants:
                mem, cores = init_peak.get(g.uuid, (0, 0))
                init_peak[g.uuid] = (max(mem, g.memory_mib), max(cores, g.cores))
        else:
            sums = side_sum if position < alloc.init_count else app_sum
            for g in grants:
                mem, cores, slots = sums.get(g.uuid, (0, 0, 0))
                sums[g.uuid] = (mem + g.memory_mib, cores + g.cores, slots + 1)
    out = {
        uuid: card_charge(init_peak.get(uuid, (0, 0)), app_sum.get(uuid, _NONE), side_sum.get(uuid, _NONE))
        for uuid in init_peak.keys() | app_sum.keys() | side_sum.keys() | held.keys()
    }
    for uuid, slices in held.items():
        out[uuid] = msgspec.structs.replace(out[uuid], mig=tuple(sorted(slices)))
    return out


_NONE = (0, 0, 0)


def charge_totals(
    reservation: Mapping[str, nodes.CardUsage] | Iterable[tuple[str, nodes.CardUsage]],
) -> tuple[int, int, int]:
    """Namespace quota usage of a reservation: (count, memory MiB, cores).

    count is the slots summed over cards, memory and cores are summed over cards. This and
    ``card_reservation`` are what the cluster cache charges a namespace, and what the filter
    checks a namespace's quota with. ``reservation``: UUID -> usage, or its ``(uuid, usage)``
    pairs (the cache keeps a pod's reservation as a sorted tuple of them).
    """
    usages = reservation.values() if isinstance(reservation, Mapping) else (r for _, r in reservation)
    count = memory = cores = 0
    for r in usages:
        count += r.slots
        memory += r.memory_mib
        cores += r.cores
    return count, memory, cores


def apply(
    state: nodes.NodeState, alloc: PodAllocation, sign: int = 1, inits_done: bool = False
) -> nodes.NodeState:
    """The node state with a pod's reservation added (sign=1) or removed (sign=-1).

    ``inits_done`` selects the reservation once every init container succeeded (see
    ``card_reservation``). Grants on UUIDs the node does not have are ignored (the caller
    reports them).
    """
    per_card = card_reservation(alloc, inits_done)
    usage = list(state.usage)
    for i, dev in enumerate(state.inventory.devices):
        r = per_card.get(dev.uuid)
        if r is None:
            continue
        usage[i] = usage[i].add(r, sign)
    return nodes.NodeState(
        inventory=state.inventory,
        usage=tuple(usage),
        cpu_used_milli=state.cpu_used_milli + sign * alloc.cpu_milli,
        memory_used_mib=state.memory_used_mib + sign * alloc.memory_mib,
    )
