"""A fake NVML backend: recorded shapes of real GPU machines, with injectable health events.

Each shape holds what NVML reports on such a machine: names and memory as the driver prints them,
PCI bus ids by board position, NUMA nodes, the PCIe common ancestor of every pair, active NVLinks
(to a peer GPU or to an NVSwitch) and P2P status codes. UUIDs are deterministic stand-ins.

Shapes (``fake:<name>`` on the command line):

* ``h100-8``: HGX/DGX H100 SXM5 80GB. 18 NVLinks per GPU into four NVSwitches (5+4+4+5 links);
  each GPU behind its own PCIe switch, GPUs 0-3 on NUMA 0 and 4-7 on NUMA 1, so PCIe pairs are
  NODE within a socket and SYSTEM across.
* ``a100-8-2numa``: eight A100 PCIe 40GB, four per socket, two per PCIe switch: pairs under one
  switch are SINGLE, other pairs on one socket NODE, across sockets SYSTEM; no NVLink; P2P only
  under a switch.
* ``t4-4``: a cloud VM with four T4s: one virtual host bridge (HOSTBRIDGE for every pair), no NUMA
  information (sysfs says -1), no P2P, no MIG.
* ``a40-2``: two A40s joined by an NVLink bridge (4 links, remote type GPU) on one socket.
* ``l40s-2``: two L40S, one per socket. The L40S has no NVLink connector, so the pair is PCIe
  SYSTEM only; the bridged two-card shape is ``a40-2``.
* ``h100-8-mig``: ``h100-8`` with every card in MIG mode.
* ``a100-80g-4-mixed``: four A100-SXM4-80GB behind NVSwitches (12 NVLink 3.0 links each), two per
  socket; cards 0 and 1 in MIG mode, 2 and 3 shared (a "mixed" MIG node).
* ``none``: a node where NVML works but sees no GPU.

MIG profiles (``MIG_RECORDS`` as NVML describes them, ``MIG_PROFILES`` as they are registered)
come from ``model.migcatalog`` (NVIDIA's Multi-Instance GPU User Guide, with its sources).

Links and PCIe as NVML reports them on such machines: NVLink 4.0 (``nvmlNvlinkVersion_t`` 6) on
H100, 3.0 (4) on the A40 bridge; PCIe Gen5 x16 on H100 SXM5, Gen4 x16 on A100 PCIe, A40 and L40S,
Gen3 x16 on T4. The agent derives 450 GB/s for an H100 pair, 100 GB/s for the A40 pair and
31.5 / 15.8 GB/s for PCIe Gen4 / Gen3 pairs (``agent.bandwidth``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import queue
import threading

import msgspec

from gpuslice.agent import backend, discover
from gpuslice.model import mig, migcatalog

_CHIPSET_NOT_SUPPORTED = 1
_IOH_TOPOLOGY_NOT_SUPPORTED = 3
_NODE, _SINGLE, _HOSTBRIDGE, _SYSTEM = 40, 10, 30, 50
_NVLINK_3_0, _NVLINK_4_0 = 4, 6  # nvmlNvlinkVersion_t
_ARCH_TURING, _ARCH_AMPERE, _ARCH_ADA, _ARCH_HOPPER = 6, 7, 8, 9  # nvmlDeviceArchitecture_t


@dataclasses.dataclass(frozen=True)
class Shape:
    """A recorded machine.

    Attributes:
        name: the shape's name.
        gpus: the cards by index.
        nvlinks: active links of each card.
        levels: ``levels[a][b]`` NVML common-ancestor level (None = unsupported; diagonal unused).
        p2p: ``p2p[a][b]`` P2P read/write status (None = unsupported; diagonal unused).
        telemetry: initial readings per card.
    """

    name: str
    gpus: tuple[backend.GpuRecord, ...]
    nvlinks: tuple[tuple[backend.NvLinkRecord, ...], ...]
    levels: tuple[tuple[int | None, ...], ...]
    p2p: tuple[tuple[int | None, ...], ...]
    telemetry: tuple[backend.TelemetryRecord, ...]


def fake_uuid(shape: str, index: int) -> str:
    """A stable UUID in NVML's format for card ``index`` of a shape."""
    h = hashlib.sha256(f"{shape}/{index}".encode()).hexdigest()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _bus(b: int) -> str:
    return f"00000000:{b:02X}:00.0"


def _build(
    name: str,
    model: str,
    memory_mib: int,
    buses: list[int],
    numa: list[int | None],
    level: list[list[int | None]],
    p2p_ok: list[list[bool]],
    links: list[list[backend.NvLinkRecord]],
    power_limit_w: float,
    mig: bool | None,
    pcie: tuple[int, int] = (4, 16),
    architecture: int | None = None,
) -> Shape:
    n = len(buses)
    gpus = tuple(
        backend.GpuRecord(
            index=i,
            uuid=fake_uuid(name, i),
            name=model,
            memory_total_mib=memory_mib,
            pci_bus_id=_bus(buses[i]),
            numa_node=numa[i],
            mig_enabled=mig,
            pcie_generation=pcie[0],
            pcie_width=pcie[1],
            pcie_max_generation=pcie[0],
            pcie_max_width=pcie[1],
            architecture=architecture,
        )
        for i in range(n)
    )
    telemetry = tuple(
        backend.TelemetryRecord(
            index=i,
            temperature_c=31.0 + i,
            power_draw_w=round(power_limit_w * 0.1 + i, 1),
            power_limit_w=power_limit_w,
            utilization_pct=0.0,
            memory_used_mib=0,
        )
        for i in range(n)
    )
    p2p = tuple(
        tuple(
            None if a == b else (backend.P2P_STATUS_OK if p2p_ok[a][b] else _CHIPSET_NOT_SUPPORTED)
            for b in range(n)
        )
        for a in range(n)
    )
    return Shape(
        name=name,
        gpus=gpus,
        nvlinks=tuple(tuple(ls) for ls in links),
        levels=tuple(tuple(row) for row in level),
        p2p=p2p,
        telemetry=telemetry,
    )


def _h100_8() -> Shape:
    buses = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]
    numa: list[int | None] = [0, 0, 0, 0, 1, 1, 1, 1]
    switches = [_bus(0xC1), _bus(0xC2), _bus(0xC3), _bus(0xC4)]
    per_switch = [5, 4, 4, 5]  # 18 links per GPU
    links: list[list[backend.NvLinkRecord]] = []
    for _ in buses:
        mine: list[backend.NvLinkRecord] = []
        for sw, count in zip(switches, per_switch, strict=True):
            for _k in range(count):
                mine.append(
                    backend.NvLinkRecord(
                        link=len(mine),
                        remote_bus_id=sw,
                        remote_type=backend.REMOTE_SWITCH,
                        version=_NVLINK_4_0,
                    )
                )
        links.append(mine)
    level: list[list[int | None]] = [
        [_NODE if numa[a] == numa[b] else _SYSTEM for b in range(8)] for a in range(8)
    ]
    return _build(
        "h100-8",
        "NVIDIA H100 80GB HBM3",
        81559,
        buses,
        numa,
        level,
        [[True] * 8 for _ in range(8)],
        links,
        700.0,
        False,
        pcie=(5, 16),
        architecture=_ARCH_HOPPER,
    )


def _a100_8_2numa() -> Shape:
    buses = [0x1B, 0x1C, 0x3D, 0x3E, 0x88, 0x89, 0xB1, 0xB2]
    numa: list[int | None] = [0, 0, 0, 0, 1, 1, 1, 1]
    switch = [0, 0, 1, 1, 2, 2, 3, 3]

    def rel(a: int, b: int) -> int:
        if switch[a] == switch[b]:
            return _SINGLE
        return _NODE if numa[a] == numa[b] else _SYSTEM

    level: list[list[int | None]] = [[rel(a, b) for b in range(8)] for a in range(8)]
    p2p = [[switch[a] == switch[b] for b in range(8)] for a in range(8)]
    return _build(
        "a100-8-2numa",
        "NVIDIA A100-PCIE-40GB",
        40960,
        buses,
        numa,
        level,
        p2p,
        [[] for _ in range(8)],
        250.0,
        False,
        pcie=(4, 16),
        architecture=_ARCH_AMPERE,
    )


def _t4_4() -> Shape:
    level: list[list[int | None]] = [[_HOSTBRIDGE] * 4 for _ in range(4)]
    return _build(
        "t4-4",
        "Tesla T4",
        15360,
        [0x04, 0x05, 0x06, 0x07],
        [None] * 4,
        level,
        [[False] * 4 for _ in range(4)],
        [[] for _ in range(4)],
        70.0,
        None,
        pcie=(3, 16),
        architecture=_ARCH_TURING,
    )


def _a40_2() -> Shape:
    buses = [0x41, 0x61]
    links = [
        [
            backend.NvLinkRecord(link=k, remote_bus_id=_bus(buses[1 - i]), version=_NVLINK_3_0)
            for k in range(4)
        ]
        for i in range(2)
    ]
    return _build(
        "a40-2",
        "NVIDIA A40",
        46068,
        buses,
        [0, 0],
        [[_NODE, _NODE], [_NODE, _NODE]],
        [[True, True], [True, True]],
        links,
        300.0,
        None,
        pcie=(4, 16),
        architecture=_ARCH_AMPERE,
    )


def _l40s_2() -> Shape:
    return _build(
        "l40s-2",
        "NVIDIA L40S",
        46068,
        [0x4A, 0xCA],
        [0, 1],
        [[_SYSTEM, _SYSTEM], [_SYSTEM, _SYSTEM]],
        [[False, False], [False, False]],
        [[], []],
        350.0,
        None,
        pcie=(4, 16),
        architecture=_ARCH_ADA,
    )


MIG_RECORDS: dict[str, tuple[backend.MigProfileRecord, ...]] = {
    product: tuple(
        backend.MigProfileRecord(
            profile=r.profile,
            name=r.name,
            slice_count=r.slice_count,
            instance_count=len(r.starts),
            multiprocessors=r.multiprocessors,
            memory_mib=r.memory_mib,
            placements=tuple((start, r.size) for start in r.starts),
        )
        for r in rows
    )
    for product, rows in migcatalog.ROWS.items()
}
"""GPU-instance profiles per product (``model.migcatalog``), as NVML records them."""

MIG_PROFILES: dict[str, tuple[mig.Profile, ...]] = {
    model: discover.mig_profiles(records) for model, records in MIG_RECORDS.items()
}
"""The same profiles as the agent registers them (``migProfiles``): cores are HAMi's
``ceil(SMs x 100 / the largest profile's SMs)``."""

NVML_NAMES = migcatalog.NVML_NAMES
MEMORY_MIB = migcatalog.MEMORY_MIB


def _with_mig(machine: Shape, name: str, model: str, cards: range) -> Shape:
    """The shape with ``cards`` switched to MIG mode, offering ``model``'s profiles."""
    gpus = tuple(
        msgspec.structs.replace(
            g, uuid=fake_uuid(name, g.index), mig_enabled=True, mig_profiles=MIG_RECORDS[model]
        )
        if g.index in cards
        else msgspec.structs.replace(g, uuid=fake_uuid(name, g.index))
        for g in machine.gpus
    )
    return dataclasses.replace(machine, name=name, gpus=gpus)


def _h100_8_mig() -> Shape:
    return _with_mig(_h100_8(), "h100-8-mig", "H100-SXM5-80GB", range(8))


def _a100_80g_4_mixed() -> Shape:
    buses = [0x07, 0x0F, 0x87, 0x90]
    numa: list[int | None] = [0, 0, 1, 1]
    switches = [_bus(0xC1 + k) for k in range(6)]  # HGX A100: six NVSwitches, two links to each
    links = [
        [
            backend.NvLinkRecord(
                link=k, remote_bus_id=switches[k // 2], remote_type=backend.REMOTE_SWITCH, version=_NVLINK_3_0
            )
            for k in range(12)
        ]
        for _ in buses
    ]
    level: list[list[int | None]] = [
        [_NODE if numa[a] == numa[b] else _SYSTEM for b in range(4)] for a in range(4)
    ]
    plain = _build(
        "a100-80g-4-mixed",
        NVML_NAMES["A100-SXM4-80GB"],
        MEMORY_MIB["A100-SXM4-80GB"],
        buses,
        numa,
        level,
        [[True] * 4 for _ in range(4)],
        links,
        400.0,
        False,
        pcie=(4, 16),
        architecture=_ARCH_AMPERE,
    )
    return _with_mig(plain, "a100-80g-4-mixed", "A100-SXM4-80GB", range(2))


def _none() -> Shape:
    return Shape(name="none", gpus=(), nvlinks=(), levels=(), p2p=(), telemetry=())


SHAPES = {
    "h100-8": _h100_8,
    "a100-8-2numa": _a100_8_2numa,
    "t4-4": _t4_4,
    "a40-2": _a40_2,
    "l40s-2": _l40s_2,
    "h100-8-mig": _h100_8_mig,
    "a100-80g-4-mixed": _a100_80g_4_mixed,
    "none": _none,
}
"""Shape builders by name."""


def shape(name: str) -> Shape:
    """The recorded shape called ``name``; raises ``KeyError`` listing the known names."""
    try:
        return SHAPES[name]()
    except KeyError:
        raise KeyError(f"unknown fake shape {name!r}; known: {', '.join(sorted(SHAPES))}") from None


class FakeBackend:
    """A ``backend.Backend`` over a recorded shape.

    Args:
        machine: the shape to serve.
        fail: when set, every call raises it (stands in for a missing library or driver).
    """

    def __init__(self, machine: Shape, *, fail: backend.BackendError | None = None) -> None:
        self.machine = machine
        self._fail = fail
        self._events: queue.Queue[backend.DeviceEvent] = queue.Queue()
        self._lock = threading.Lock()
        self._telemetry = list(machine.telemetry)
        self.closed = False

    def _check(self) -> None:
        if self._fail is not None:
            raise self._fail

    def describe(self) -> str:
        """Name the shape."""
        return f"fake NVML ({self.machine.name}, {len(self.machine.gpus)} GPUs)"

    def gpus(self) -> tuple[backend.GpuRecord, ...]:
        """The recorded cards."""
        self._check()
        return self.machine.gpus

    def nvlinks(self, index: int) -> tuple[backend.NvLinkRecord, ...]:
        """The recorded links of a card."""
        self._check()
        return self.machine.nvlinks[index]

    def pair(self, a: int, b: int) -> backend.PairRecord:
        """The recorded relation of a pair."""
        self._check()
        status = self.machine.p2p[a][b]
        return backend.PairRecord(
            a=a, b=b, common_ancestor=self.machine.levels[a][b], p2p_read=status, p2p_write=status
        )

    def telemetry(self, index: int) -> backend.TelemetryRecord:
        """Current readings (as last set)."""
        self._check()
        with self._lock:
            return self._telemetry[index]

    def set_telemetry(self, index: int, **changes: float | int | None) -> None:
        """Change the readings of a card (tests)."""
        with self._lock:
            self._telemetry[index] = msgspec.structs.replace(self._telemetry[index], **changes)

    def start_events(self) -> tuple[int, ...]:
        """Every card accepts event registration."""
        self._check()
        return tuple(g.index for g in self.machine.gpus)

    def wait_event(self, timeout_s: float) -> backend.DeviceEvent | None:
        """The next injected event, or None after ``timeout_s``."""
        try:
            return self._events.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def inject(self, event: backend.DeviceEvent) -> None:
        """Queue an event for ``wait_event``."""
        self._events.put(event)

    def inject_xid(self, index: int | None, xid: int) -> None:
        """Queue a critical-XID event on a card (None: no card named)."""
        self.inject(backend.DeviceEvent(index=index, kind=backend.EventKind.XID, xid=xid))

    def close(self) -> None:
        """Mark closed."""
        self.closed = True
