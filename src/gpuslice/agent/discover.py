"""Pure discovery: plain NVML records to model objects (devices, topology, telemetry).

No I/O and no clock: ``collect`` gathers records from a backend, this module interprets them, and
``publish`` encodes the result with the codecs. The rules follow HAMi's device plugin where it has
one (registration fields, pair scores) and say where gpuslice differs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import msgspec

from gpuslice.agent import backend, bandwidth, collect
from gpuslice.model import devices, mig, migcatalog, nodes, topology


@dataclasses.dataclass(frozen=True)
class MigAllowlist:
    """Which MIG profiles cards of some models publish (one entry of HAMi's ``migProfileAllowlist``).

    Attributes:
        models: substrings of the registered card type (``NVIDIA A100-SXM4-40GB`` matches ``A100-SXM4``).
        profiles: profile names, e.g. ``1g.10gb``.
    """

    models: tuple[str, ...]
    profiles: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.models or not self.profiles:
            raise ValueError("a MIG profile allowlist entry needs models and profiles")
        for name in self.profiles:
            head, dot, _ = name.partition(".")
            if not dot or len(head) < 2 or not head.endswith("g") or not head[:-1].isdigit():
                raise ValueError(f"invalid MIG profile {name!r} (expected e.g. 1g.10gb)")


@dataclasses.dataclass(frozen=True)
class RegistrationConfig:
    """How physical cards become registered devices (HAMi's device-plugin settings).

    Attributes:
        split_count: slots per card (``deviceSplitCount``).
        memory_scaling: multiplies the card's memory (``deviceMemoryScaling``).
        core_scaling: multiplies the 100 cores of a card (``deviceCoreScaling``).
        mig_allowlist: the MIG profiles cards in MIG mode publish (``migProfileAllowlist``);
            empty: every profile NVML offers (HAMi publishes none without an allowlist).
    """

    split_count: int = 10
    memory_scaling: float = 1.0
    core_scaling: float = 1.0
    mig_allowlist: tuple[MigAllowlist, ...] = ()

    def __post_init__(self) -> None:
        if self.split_count < 1:
            raise ValueError(f"split count must be >= 1, got {self.split_count}")
        if self.memory_scaling <= 0 or self.core_scaling <= 0:
            raise ValueError("memory and core scaling must be positive")


class Asymmetry(msgspec.Struct, frozen=True, kw_only=True):
    """A pair whose two cards count different NVLinks to each other (HAMi scores it 0)."""

    a: int
    b: int
    forward: int
    backward: int


class Discovery(msgspec.Struct, frozen=True, kw_only=True):
    """What the agent knows about its node's cards.

    Attributes:
        devices: registered cards, by NVML index.
        topology: pairwise links (None without cards).
        scores: HAMi pair scores, ``scores[i][j]`` by position in ``topology.uuids``;
            0 for asymmetric pairs and on the diagonal.
        numa: NUMA node per card as NVML reported it (None = unknown).
        asymmetric: pairs with different link counts on each side.
        notes: what was missing or odd, in words.
    """

    devices: tuple[devices.GpuDevice, ...] = ()
    topology: topology.Topology | None = None
    scores: tuple[tuple[int, ...], ...] = ()
    numa: tuple[int | None, ...] = ()
    asymmetric: tuple[Asymmetry, ...] = ()
    notes: tuple[str, ...] = ()


def hami_type(name: str) -> str:
    """The registered type: the NVML name, prefixed ``NVIDIA-`` unless it starts with ``NVIDIA``."""
    return name if name.startswith("NVIDIA") else f"NVIDIA-{name}"


def bus_key(bus_id: str) -> tuple[int, int, int, int] | None:
    """Parse ``DDDDDDDD:BB:DD.F`` (any domain width, any case) to numbers; None if malformed."""
    try:
        domain, bus, rest = bus_id.strip().split(":")
        dev, fn = rest.split(".")
        return int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        return None


def nvlink_matrix(
    gpus: tuple[backend.GpuRecord, ...], links: tuple[tuple[backend.NvLinkRecord, ...], ...]
) -> list[list[int]]:
    """``m[i][j]``: NVLinks card i counts towards card j (positions, not NVML indices).

    Direct links (remote type GPU) count when the far end's bus id is card j's. Links into
    NVSwitches reach every other card behind a switch; as HAMi does, such a pair gets the smaller
    of the two cards' switch-link counts.
    """
    n = len(gpus)
    pos = {bus_key(g.pci_bus_id): i for i, g in enumerate(gpus)}
    direct = [[0] * n for _ in range(n)]
    to_switch = [0] * n
    for i, mine in enumerate(links):
        for link in mine:
            if link.remote_type == backend.REMOTE_SWITCH:
                to_switch[i] += 1
            elif link.remote_type == backend.REMOTE_GPU:
                j = pos.get(bus_key(link.remote_bus_id))
                if j is not None and j != i:
                    direct[i][j] += 1
    return [
        [0 if i == j else direct[i][j] + min(to_switch[i], to_switch[j]) for j in range(n)] for i in range(n)
    ]


def _level(value: int | None) -> topology.PcieLevel | None:
    if value is None:
        return None
    try:
        return topology.PcieLevel(value)
    except ValueError:
        return None


def discover(
    records: collect.Records,
    config: RegistrationConfig,
    health: Mapping[int, bool] | None = None,
) -> Discovery:
    """Interpret one node's records.

    Args:
        records: what ``collect.inventory`` read.
        config: registration settings.
        health: healthy flag per NVML index (missing = healthy).

    Returns:
        The devices, topology and pair scores; cards with an empty or repeated UUID, or without
        memory, are left out (with a note) so that no annotation names a card twice, by an empty
        id, or with a capacity the extender must refuse.
    """
    notes = list(records.notes)
    health = health or {}
    keep: list[int] = []
    seen: set[str] = set()
    for pos, g in enumerate(records.gpus):
        if not g.uuid or g.uuid in seen or bus_key(g.pci_bus_id) is None:
            notes.append(
                f"GPU {g.index}: unusable identity (uuid {g.uuid!r}, bus id {g.pci_bus_id!r}); left out"
            )
            continue
        if g.mig_enabled and not published_profiles(g, config):
            # HAMi's device plugin skips such a card: nothing could be placed on it.
            notes.append(f"GPU {g.index}: MIG mode but no MIG profile to publish; left out")
            continue
        scaling = 1.0 if g.mig_enabled else config.memory_scaling  # HAMi does not scale MIG cards
        if int(g.memory_total_mib * scaling) <= 0:
            # The extender rejects a registration with a zero-capacity card (a whole node lost).
            notes.append(f"GPU {g.index}: NVML reports no memory; left out")
            continue
        seen.add(g.uuid)
        keep.append(pos)
    gpus = tuple(records.gpus[p] for p in keep)
    links = tuple(records.nvlinks[p] if p < len(records.nvlinks) else () for p in keep)
    devs = tuple(_device(g, config, health.get(g.index, True)) for g in gpus)
    for g in gpus:
        if g.numa_node is None:
            notes.append(f"GPU {g.index}: NUMA node unknown; registered as 0")
    if not gpus:
        return Discovery(notes=tuple(notes))
    nvl = nvlink_matrix(gpus, links)
    pairs = {(p.a, p.b): p for p in records.pairs}
    n = len(gpus)
    pcie: list[list[topology.PcieLevel]] = []
    p2p: list[list[bool]] = []
    for i in range(n):
        prow: list[topology.PcieLevel] = []
        qrow: list[bool] = []
        for j in range(n):
            if i == j:
                prow.append(topology.PcieLevel.INTERNAL)
                qrow.append(False)
                continue
            fwd = pairs.get((gpus[i].index, gpus[j].index))
            back = pairs.get((gpus[j].index, gpus[i].index))
            levels = [
                lv for lv in (_level(r.common_ancestor) if r else None for r in (fwd, back)) if lv is not None
            ]
            if not levels:
                if i < j:
                    notes.append(
                        f"GPUs {gpus[i].index},{gpus[j].index}: PCIe relation unknown; assuming SYSTEM"
                    )
                levels = [topology.PcieLevel.SYSTEM]
            prow.append(max(levels))
            qrow.append(
                fwd is not None
                and fwd.p2p_read == backend.P2P_STATUS_OK
                and fwd.p2p_write == backend.P2P_STATUS_OK
            )
        pcie.append(prow)
        p2p.append(qrow)
    asym = [
        Asymmetry(a=gpus[i].index, b=gpus[j].index, forward=nvl[i][j], backward=nvl[j][i])
        for i in range(n)
        for j in range(i + 1, n)
        if nvl[i][j] != nvl[j][i]
    ]
    for a in asym:
        notes.append(f"GPUs {a.a},{a.b}: asymmetric NVLink count ({a.forward} vs {a.backward}); pair score 0")
    if not any(bandwidth.card_pcie(g) for g in gpus):
        notes.append("PCIe link generation and width unknown; PCIe pair bandwidth published as 0")
    topo = topology.Topology(
        uuids=tuple(g.uuid for g in gpus),
        nvlinks=tuple(tuple(row) for row in nvl),
        pcie=tuple(tuple(row) for row in pcie),
        p2p=tuple(tuple(row) for row in p2p),
        bandwidth=bandwidth.matrix(gpus, links, nvl),
    )
    scores = tuple(
        tuple(0 if i == j or nvl[i][j] != nvl[j][i] else topo.pair_score(i, j) for j in range(n))
        for i in range(n)
    )
    return Discovery(
        devices=devs,
        topology=topo,
        scores=scores,
        numa=tuple(g.numa_node for g in gpus),
        asymmetric=tuple(asym),
        notes=tuple(notes),
    )


profile_cores = migcatalog.cores
"""A profile's cores, HAMi's rule (``model.migcatalog.cores``)."""


def mig_profiles(records: tuple[backend.MigProfileRecord, ...]) -> tuple[mig.Profile, ...]:
    """NVML's profile records as registered profiles, cores relative to the largest profile."""
    full = max((r.multiprocessors for r in records), default=0)
    return tuple(
        mig.Profile(
            name=r.name,
            memory_mib=r.memory_mib,
            cores=profile_cores(r.multiprocessors, full),
            slice_count=r.slice_count,
            placements=tuple(mig.Placement(start, size) for start, size in r.placements),
        )
        for r in records
    )


def published_profiles(g: backend.GpuRecord, config: RegistrationConfig) -> tuple[mig.Profile, ...]:
    """The profiles a card in MIG mode registers.

    Without an allowlist, every profile NVML offers. With one, as HAMi: the first entry naming
    the card's model decides; each allowed name is the card's profile of that name or, failing
    that, the plain profile with as many compute slices (``1g.10gb`` -> the ``1g`` profile),
    registered under the allowed name; a model no entry names publishes nothing.
    """
    offered = mig_profiles(g.mig_profiles)
    if not config.mig_allowlist:
        return offered
    model = hami_type(g.name)
    entry = next((e for e in config.mig_allowlist if any(m in model for m in e.models)), None)
    if entry is None:
        return ()
    plain = {
        r.slice_count: p for r, p in zip(g.mig_profiles, offered, strict=True) if r.profile in _PLAIN_PROFILES
    }
    out: list[mig.Profile] = []
    for name in entry.profiles:
        found = mig.find(offered, name)
        if found is None:
            base = plain.get(int(name.partition("g")[0]))
            found = None if base is None else msgspec.structs.replace(base, name=name)
        if found is not None and mig.find(out, name) is None:
            out.append(found)
    return tuple(out)


_PLAIN_PROFILES = frozenset({0, 1, 2, 3, 4, 5, 6})
"""``NVML_GPU_INSTANCE_PROFILE_{1,2,3,4,7,8,6}_SLICE``: what HAMi's slice key (``1g``) names."""


def _device(g: backend.GpuRecord, config: RegistrationConfig, healthy: bool) -> devices.GpuDevice:
    if g.mig_enabled:
        # HAMi's register.go: no memory or core scaling; count = the most instances of any profile.
        profiles = published_profiles(g, config)
        counts = {r.name: r.instance_count for r in g.mig_profiles}
        return devices.GpuDevice(
            uuid=g.uuid,
            index=g.index,
            type=hami_type(g.name),
            memory_mib=g.memory_total_mib,
            cores=devices.FULL_CORES,
            split_count=max((_instances(p, counts) for p in profiles), default=0),
            numa=max(g.numa_node or 0, 0),
            mode=devices.MODE_MIG,
            health=healthy,
            mig_profiles=profiles,
        )
    return devices.GpuDevice(
        uuid=g.uuid,
        index=g.index,
        type=hami_type(g.name),
        memory_mib=int(g.memory_total_mib * config.memory_scaling),
        cores=int(devices.FULL_CORES * config.core_scaling),
        split_count=config.split_count,
        numa=max(g.numa_node or 0, 0),
        mode=devices.MODE_HAMI_CORE,
        health=healthy,
    )


def _instances(p: mig.Profile, counts: Mapping[str, int]) -> int:
    """Instances of a published profile: NVML's count, or its placements for a renamed one."""
    return counts.get(p.name, len(p.placements))


def card_telemetry(
    gpus: tuple[backend.GpuRecord, ...], readings: tuple[backend.TelemetryRecord, ...]
) -> tuple[nodes.CardTelemetry, ...]:
    """Readings keyed by UUID, in card order; cards without readings are left out."""
    by_index = {r.index: r for r in readings}
    out: list[nodes.CardTelemetry] = []
    for g in gpus:
        r = by_index.get(g.index)
        if r is None or not g.uuid:
            continue
        out.append(
            nodes.CardTelemetry(
                uuid=g.uuid,
                temperature_c=r.temperature_c,
                power_draw_w=r.power_draw_w,
                power_limit_w=r.power_limit_w,
                utilization_pct=r.utilization_pct,
                memory_used_mib=r.memory_used_mib,
            )
        )
    return tuple(out)
