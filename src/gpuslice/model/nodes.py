"""A node's GPU inventory (what it registered) and its state (inventory plus per-card usage)."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from gpuslice.model import devices, mig, topology


class CardTelemetry(msgspec.Struct, frozen=True, kw_only=True):
    """Slow-moving health and load readings of one card, published by the node agent."""

    uuid: str
    temperature_c: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    utilization_pct: float | None = None
    memory_used_mib: int | None = None


class NodeInventory(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a node tells the scheduler about its GPUs.

    Attributes:
        name: node name.
        devices: registered cards, in registration order.
        topology: pairwise links, when the node published them.
        cordoned: UUIDs excluded from new allocations (``hami.io/device-cordon``).
        telemetry: per-card readings, when the agent published them.
        cpu_milli: allocatable CPU, when tracked (the simulator tracks it; the extender leaves
            host resources to kube-scheduler and keeps 0 = untracked).
        memory_mib: allocatable host memory, when tracked (0 = untracked).
        telemetry_at: when ``telemetry`` was read (Unix seconds, the annotation's ``ts``); None
            when unknown (the simulator, tests): such readings never count as stale.
    """

    name: str
    devices: tuple[devices.GpuDevice, ...] = ()
    topology: topology.Topology | None = None
    cordoned: frozenset[str] = frozenset()
    telemetry: tuple[CardTelemetry, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    telemetry_at: float | None = None

    @property
    def model(self) -> str:
        """The model name of the first card ('' for a node without GPUs)."""
        return self.devices[0].type if self.devices else ""


class CardUsage(msgspec.Struct, frozen=True):
    """What is taken on one card: slots (tasks), memory MiB, cores (percent) and MIG slices.

    ``mig`` lists the GPU instances held on a card in MIG mode, sorted by start; a MIG grant
    also charges its profile's memory and cores, as HAMi's ``AddResourceUsage`` does.
    """

    slots: int = 0
    memory_mib: int = 0
    cores: int = 0
    mig: tuple[mig.Slice, ...] = ()

    def plus(self, other: CardUsage) -> CardUsage:
        """This usage with ``other`` added."""
        return CardUsage(
            self.slots + other.slots,
            self.memory_mib + other.memory_mib,
            self.cores + other.cores,
            tuple(sorted(self.mig + other.mig)) if other.mig else self.mig,
        )

    def add(self, other: CardUsage, sign: int) -> CardUsage:
        """This usage with ``other`` added (sign 1) or taken off (-1), exactly (no clamping)."""
        if sign > 0:
            return self.plus(other)
        return CardUsage(
            self.slots - other.slots,
            self.memory_mib - other.memory_mib,
            self.cores - other.cores,
            _without(self.mig, other.mig),
        )

    def minus(self, other: CardUsage) -> CardUsage:
        """This usage with ``other`` taken off, never below zero; each slice of ``other`` once."""
        return CardUsage(
            max(0, self.slots - other.slots),
            max(0, self.memory_mib - other.memory_mib),
            max(0, self.cores - other.cores),
            _without(self.mig, other.mig),
        )


def _without(held: tuple[mig.Slice, ...], gone: tuple[mig.Slice, ...]) -> tuple[mig.Slice, ...]:
    """``held`` with each slice of ``gone`` removed once (slices it lacks are ignored)."""
    if not gone:
        return held
    rest = list(held)
    for s in gone:
        if s in rest:
            rest.remove(s)
    return tuple(rest)


EMPTY_CARD = CardUsage()


class JobOnNode(msgspec.Struct, frozen=True):
    """The pods of one job held on a node (``NodeState.jobs``).

    Attributes:
        job: the job key (``requests.PodRequest.job``).
        pods: how many of its pods the node holds.
        cards: positions (into ``inventory.devices``) of the cards they hold, sorted.
    """

    job: str
    pods: int
    cards: tuple[int, ...] = ()


class NodeState(msgspec.Struct, frozen=True, kw_only=True):
    """A node as policies judge it: its inventory and what is in use on each card.

    ``usage[i]`` belongs to ``inventory.devices[i]``. ``jobs`` lists, sorted by job, the jobs
    whose pods the node holds (empty where nobody tracks jobs, e.g. the simulator).
    """

    inventory: NodeInventory
    usage: tuple[CardUsage, ...]
    cpu_used_milli: int = 0
    memory_used_mib: int = 0
    jobs: tuple[JobOnNode, ...] = ()

    def job(self, key: str) -> JobOnNode | None:
        """The node's pods of job ``key``, or None when it holds none."""
        for j in self.jobs:
            if j.job == key:
                return j
        return None

    @property
    def name(self) -> str:
        """The node name."""
        return self.inventory.name

    def free_memory(self, i: int) -> int:
        """Free memory of card i in MiB (negative if overcommitted by an external change)."""
        return self.inventory.devices[i].memory_mib - self.usage[i].memory_mib

    def free_cores(self, i: int) -> int:
        """Free cores of card i in percent of its registered core capacity."""
        return self.inventory.devices[i].cores - self.usage[i].cores

    def free_slots(self, i: int) -> int:
        """Free task slots of card i."""
        return self.inventory.devices[i].split_count - self.usage[i].slots

    @property
    def cpu_free_milli(self) -> int:
        """Free CPU (only meaningful when the inventory tracks CPU)."""
        return self.inventory.cpu_milli - self.cpu_used_milli

    @property
    def memory_free_mib(self) -> int:
        """Free host memory (only meaningful when the inventory tracks it)."""
        return self.inventory.memory_mib - self.memory_used_mib


def empty_state(inventory: NodeInventory) -> NodeState:
    """A node with nothing allocated."""
    return NodeState(inventory=inventory, usage=tuple(EMPTY_CARD for _ in inventory.devices))


def released(
    state: NodeState,
    reservation: Iterable[tuple[str, CardUsage]],
    cpu_milli: int = 0,
    memory_mib: int = 0,
) -> NodeState:
    """The node with a pod's charge taken off: its usage per card UUID, host CPU and memory.

    ``reservation`` is what the cache charges the pod per card (``allocations.card_reservation``);
    UUIDs the node lacks are skipped. Everything else (the jobs included) is kept as it is.
    """
    index = {d.uuid: i for i, d in enumerate(state.inventory.devices)}
    usage = list(state.usage)
    for uuid, r in reservation:
        i = index.get(uuid)
        if i is None:
            continue
        usage[i] = usage[i].minus(r)
    return msgspec.structs.replace(
        state,
        usage=tuple(usage),
        cpu_used_milli=max(0, state.cpu_used_milli - cpu_milli),
        memory_used_mib=max(0, state.memory_used_mib - memory_mib),
    )
