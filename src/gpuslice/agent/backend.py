"""What the node agent asks of NVML: plain records and a small ``Backend`` protocol.

Two backends implement the protocol: ``agent.nvml`` (the real driver through nvidia-ml-py, the only
module that imports ``pynvml``) and ``agent.fake`` (recorded machine shapes). Everything above the
protocol (discovery, health, publishing) is the same code for both.

Records carry raw NVML values (PCIe level numbers, P2P status codes, bus ids as NVML writes them);
a field is ``None`` when the card does not support the call. Interpreting them is
``agent.discover``'s job.
"""

from __future__ import annotations

import enum
import math
from typing import Protocol

import msgspec

P2P_STATUS_OK = 0
"""``NVML_P2P_STATUS_OK``; every other status means the capability is missing."""

P2P_CAP_READ = 0
P2P_CAP_WRITE = 1
P2P_CAP_NVLINK = 2

REMOTE_GPU = 0
"""``NVML_NVLINK_DEVICE_TYPE_GPU``: the link ends on another GPU (direct link or bridge)."""
REMOTE_IBMNPU = 1
REMOTE_SWITCH = 2
"""``NVML_NVLINK_DEVICE_TYPE_SWITCH``: the link ends on an NVSwitch."""


class GpuRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One card as NVML enumerates it.

    Attributes:
        index: NVML device number.
        uuid: NVML UUID (``GPU-...``).
        name: NVML product name, e.g. ``NVIDIA H100 80GB HBM3`` or ``Tesla T4``.
        memory_total_mib: total framebuffer memory in MiB.
        pci_bus_id: bus id as NVML returns it, e.g. ``00000000:18:00.0``.
        numa_node: NUMA node of the card; None when unknown (unsupported or no NUMA).
        mig_enabled: current MIG mode; None when the card has no MIG.
        pcie_generation: current PCIe link generation (``nvmlDeviceGetCurrPcieLinkGeneration``).
        pcie_width: current PCIe link width in lanes (``nvmlDeviceGetCurrPcieLinkWidth``).
        pcie_max_generation: highest generation of the card in this system
            (``nvmlDeviceGetMaxPcieLinkGeneration``).
        pcie_max_width: widest link of the card in this system (``nvmlDeviceGetMaxPcieLinkWidth``).
        architecture: ``nvmlDeviceArchitecture_t`` (e.g. 7 Ampere, 9 Hopper).
        mig_profiles: for a card in MIG mode, the GPU-instance profiles NVML offers on it
            (empty otherwise, and for profiles the card does not support).

    The PCIe and architecture fields are None where NVML does not answer.
    """

    index: int
    uuid: str
    name: str
    memory_total_mib: int
    pci_bus_id: str
    numa_node: int | None = None
    mig_enabled: bool | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None
    pcie_max_generation: int | None = None
    pcie_max_width: int | None = None
    architecture: int | None = None
    mig_profiles: tuple[MigProfileRecord, ...] = ()


class MigProfileRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU-instance profile as NVML describes it (``nvmlGpuInstanceProfileInfo_v2_t``).

    Attributes:
        profile: the ``NVML_GPU_INSTANCE_PROFILE_*`` index it was asked for.
        name: NVIDIA's profile name without the ``MIG`` prefix, e.g. ``1g.10gb``.
        slice_count: compute slices (``sliceCount``).
        instance_count: how many instances of it fit on an empty card (``instanceCount``).
        multiprocessors: streaming multiprocessors of one instance (``multiprocessorCount``).
        memory_mib: memory of one instance (``memorySizeMB``).
        placements: ``(start, size)`` in memory slices, as
            ``nvmlDeviceGetGpuInstancePossiblePlacements`` lists them.
    """

    profile: int
    name: str
    slice_count: int
    instance_count: int
    multiprocessors: int
    memory_mib: int
    placements: tuple[tuple[int, int], ...] = ()


MIG_PROFILE_IDS: tuple[int, ...] = (0, 9, 1, 2, 3, 6, 4, 5)
"""The GPU-instance profiles the agent reads, smallest first: ``NVML_GPU_INSTANCE_PROFILE_1_SLICE``
(0), ``1_SLICE_REV2`` (9, the 1g profile with two memory slices: ``1g.20gb`` on an 80 GB card),
then 2 (1), 3 (2), 4 (3), 6 (6), 7 (4) and 8 (5) slices. Media-extension variants (``+me``: ``1_SLICE_REV1``,
``2_SLICE_REV1``, ``*_ALL_ME``, ``*_NO_ME``) and graphics variants (``*_GFX``) occupy the same
slices as their plain profile and are not published."""


def mig_profile_name(slice_count: int, memory_mib: int, card_memory_mib: int) -> str:
    """NVIDIA's name for a profile, ``<slices>g.<GB>gb``, from its size (NVIDIA go-nvlib's rule).

    The instance's share of the card's memory is rounded up to an eighth, times the card's
    memory in whole GiB (rounded up), rounded: 4864 MiB of a 40960 MiB A100 is ``1g.5gb``.
    """
    if card_memory_mib <= 0:
        return f"{slice_count}g.{math.floor(memory_mib / 1024 + 0.5)}gb"
    share = math.ceil(memory_mib / card_memory_mib * 8) / 8
    card_gib = -(-card_memory_mib // 1024)
    return f"{slice_count}g.{math.floor(share * card_gib + 0.5)}gb"  # Go's math.Round: half away


class NvLinkRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One active NVLink of a card.

    Attributes:
        link: link number (0..35).
        remote_bus_id: PCI bus id of the far end (a GPU, or an NVSwitch).
        remote_type: ``REMOTE_GPU``, ``REMOTE_IBMNPU`` or ``REMOTE_SWITCH``.
        version: ``nvmlNvlinkVersion_t`` of the link (``nvmlDeviceGetNvLinkVersion``; 1 = 1.0 ...
            6 = 4.0, 7 = 5.0); None when NVML does not say.
    """

    link: int
    remote_bus_id: str
    remote_type: int = REMOTE_GPU
    version: int | None = None


class PairRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What NVML says about an ordered pair of cards.

    Attributes:
        a: index of the first card.
        b: index of the second card.
        common_ancestor: ``nvmlGpuTopologyLevel_t`` value (0..50); None when unsupported.
        p2p_read: ``nvmlGpuP2PStatus_t`` for read; None when unsupported.
        p2p_write: ``nvmlGpuP2PStatus_t`` for write; None when unsupported.
    """

    a: int
    b: int
    common_ancestor: int | None = None
    p2p_read: int | None = None
    p2p_write: int | None = None


class TelemetryRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Slow-moving readings of one card; None where the card does not report them."""

    index: int
    temperature_c: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    utilization_pct: float | None = None
    memory_used_mib: int | None = None


class EventKind(enum.Enum):
    """The NVML event types the health watcher registers for."""

    XID = "xid"
    """``nvmlEventTypeXidCriticalError``; the XID is in ``DeviceEvent.xid``."""
    DOUBLE_BIT_ECC = "double-bit-ecc"
    SINGLE_BIT_ECC = "single-bit-ecc"
    GPU_UNAVAILABLE = "gpu-unavailable"
    FATAL_POISON = "fatal-poison"
    OTHER = "other"


class DeviceEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One event from the NVML event set.

    Attributes:
        index: the card it concerns; None when NVML did not say (applies to every card).
        kind: what happened.
        xid: the XID for ``EventKind.XID`` (``eventData``), else 0.
    """

    index: int | None
    kind: EventKind
    xid: int = 0


class BackendError(Exception):
    """NVML could not answer (library missing, driver not loaded, GPU lost, ...).

    Attributes:
        reason: a short machine-readable cause, one of the ``REASON_*`` constants.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


REASON_LIBRARY_MISSING = "LibraryMissing"
REASON_DRIVER_NOT_LOADED = "DriverNotLoaded"
REASON_NO_PERMISSION = "NoPermission"
REASON_GPU_LOST = "GpuLost"
REASON_NOT_SUPPORTED = "NotSupported"
REASON_FAILED = "Failed"


class Backend(Protocol):
    """The agent's view of NVML. Methods raise ``BackendError`` when NVML cannot answer at all."""

    def describe(self) -> str:
        """A one-line description (backend, driver version) for logs."""
        ...

    def gpus(self) -> tuple[GpuRecord, ...]:
        """Every card, by NVML index (empty on a node without GPUs)."""
        ...

    def nvlinks(self, index: int) -> tuple[NvLinkRecord, ...]:
        """The active NVLinks of a card (empty without NVLink)."""
        ...

    def pair(self, a: int, b: int) -> PairRecord:
        """PCIe relation and P2P capability of an ordered pair."""
        ...

    def telemetry(self, index: int) -> TelemetryRecord:
        """Current readings of a card."""
        ...

    def start_events(self) -> tuple[int, ...]:
        """Register for health events; returns the indices registered (cards may refuse)."""
        ...

    def wait_event(self, timeout_s: float) -> DeviceEvent | None:
        """Block up to ``timeout_s`` for the next event; None on timeout."""
        ...

    def close(self) -> None:
        """Release NVML (idempotent)."""
        ...
