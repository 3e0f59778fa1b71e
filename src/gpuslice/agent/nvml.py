"""The real NVML backend: a thin adapter over nvidia-ml-py, the only module that imports ``pynvml``.

Every call that a card may not support returns None in the records instead of failing; calls
that fail for the whole node (library missing, driver not loaded) raise ``backend.BackendError``
with a clear reason. No interpretation happens here (see ``agent.discover``).
"""

from __future__ import annotations

import ctypes
import re
import threading
from pathlib import Path
from typing import Any

from gpuslice.agent import backend

try:  # the package is a dependency, but the agent must say so clearly if it is broken
    import pynvml
except ImportError:  # pragma: no cover - exercised only on broken installs
    pynvml = None

SYSFS_PCI = Path("/sys/bus/pci/devices")
"""Where the NUMA node of a card is read when NVML's memory affinity cannot say (``numa_node``, -1 = none)."""
_P2P_READ = 0  # NVML_P2P_CAPS_INDEX_READ; pynvml defines it as the tuple (0,) by a stray comma
_P2P_WRITE = 1
_MAX_LINKS = 36
_AFFINITY_SCOPE_NODE = 0  # NVML_AFFINITY_SCOPE_NODE
_NODE_SET_WORDS = 4  # nodeSetSize for nvmlDeviceGetMemoryAffinity: 64 NUMA nodes a word, 256 in all
_NO_ANSWER = (3, 2, 6, 13)  # NOT_SUPPORTED, INVALID_ARGUMENT, NOT_FOUND, FUNCTION_NOT_FOUND
_TIMEOUT = 10
_MAX_PLACEMENTS = 32  # room for every placement of one profile (8 memory slices at most today)
_MIG_PREFIX = "MIG "
_PROFILE_NAME = re.compile(r"^\d+g\.\d+gb(\+[a-z,]+)?$")  # 1g.10gb, 1g.10gb+me

_REASONS = {
    12: backend.REASON_LIBRARY_MISSING,
    9: backend.REASON_DRIVER_NOT_LOADED,
    18: backend.REASON_DRIVER_NOT_LOADED,  # LIB_RM_VERSION_MISMATCH
    4: backend.REASON_NO_PERMISSION,
    15: backend.REASON_GPU_LOST,
    3: backend.REASON_NOT_SUPPORTED,
}

_EVENT_KINDS: tuple[tuple[int, backend.EventKind], ...] = (
    (0x0008, backend.EventKind.XID),  # nvmlEventTypeXidCriticalError
    (0x0002, backend.EventKind.DOUBLE_BIT_ECC),
    (0x0001, backend.EventKind.SINGLE_BIT_ECC),
    (0x4000, backend.EventKind.GPU_UNAVAILABLE),
    (0x2000, backend.EventKind.FATAL_POISON),
)
_WANTED_EVENTS = 0x0008 | 0x0002 | 0x4000 | 0x2000


def _code(exc: BaseException) -> int:
    return int(getattr(exc, "value", -1))


def _error(exc: BaseException, what: str) -> backend.BackendError:
    reason = _REASONS.get(_code(exc), backend.REASON_FAILED)
    return backend.BackendError(reason, f"{what}: {exc}")


def _absent(*_args: Any) -> None:
    """Stands in for an NVML function an old nvidia-ml-py does not have."""
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """``backend.Backend`` over the NVIDIA driver.

    Raises:
        backend.BackendError: from the constructor when NVML cannot start (no library, no driver).
    """

    def __init__(self) -> None:
        if pynvml is None:
            raise backend.BackendError(
                backend.REASON_LIBRARY_MISSING, "nvidia-ml-py (module pynvml) is not installed"
            )
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise _error(
                e, "NVML init failed (is the NVIDIA driver installed and libnvidia-ml.so.1 visible?)"
            ) from e
        self._lock = threading.Lock()
        self._handles: list[Any] = []
        self._events: Any = None
        self._closed = False

    def _handle(self, index: int) -> Any:
        try:
            if not self._handles:
                self._handles = [
                    pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
                ]
        except pynvml.NVMLError as e:
            raise _error(e, "getting device handles") from e
        return self._handles[index]

    def _optional(self, fn: Any, *args: Any) -> Any:
        """Call an NVML function; None when the card does not answer it."""
        try:
            return fn(*args)
        except pynvml.NVMLError as e:
            if _code(e) in _NO_ANSWER:
                return None
            raise _error(e, getattr(fn, "__name__", "NVML call")) from e

    def describe(self) -> str:
        """NVML and driver versions."""
        try:
            driver = self._optional(pynvml.nvmlSystemGetDriverVersion)
            lib = self._optional(pynvml.nvmlSystemGetNVMLVersion)
        except backend.BackendError:
            return "NVML (version unknown)"
        return f"NVML {_text(lib)} (driver {_text(driver)})"

    def gpus(self) -> tuple[backend.GpuRecord, ...]:
        """Enumerate the cards."""
        try:
            count = pynvml.nvmlDeviceGetCount()
            return tuple(self._gpu(i) for i in range(count))
        except pynvml.NVMLError as e:
            raise _error(e, "enumerating GPUs") from e

    def _gpu(self, i: int) -> backend.GpuRecord:
        h = self._handle(i)
        pci = pynvml.nvmlDeviceGetPciInfo(h)
        bus_id = _text(pci.busId)
        mig = self._optional(pynvml.nvmlDeviceGetMigMode, h)
        pcie = [
            self._optional(getattr(pynvml, name, _absent), h)
            for name in (
                "nvmlDeviceGetCurrPcieLinkGeneration",
                "nvmlDeviceGetCurrPcieLinkWidth",
                "nvmlDeviceGetMaxPcieLinkGeneration",
                "nvmlDeviceGetMaxPcieLinkWidth",
                "nvmlDeviceGetArchitecture",
            )
        ]
        gen, width, max_gen, max_width, arch = (None if v is None else int(v) for v in pcie)
        mig_enabled = None if mig is None else bool(mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE)
        memory_mib = int(pynvml.nvmlDeviceGetMemoryInfo(h).total) // (1024 * 1024)
        return backend.GpuRecord(
            index=i,
            uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
            name=_text(pynvml.nvmlDeviceGetName(h)),
            memory_total_mib=memory_mib,
            pci_bus_id=bus_id,
            numa_node=self._numa(h, bus_id),
            mig_enabled=mig_enabled,
            pcie_generation=gen,
            pcie_width=width,
            pcie_max_generation=max_gen,
            pcie_max_width=max_width,
            architecture=arch,
            mig_profiles=self._mig_profiles(h, memory_mib) if mig_enabled else (),
        )

    def _mig_profiles(self, h: Any, memory_mib: int) -> tuple[backend.MigProfileRecord, ...]:
        """The GPU-instance profiles of a card in MIG mode; a profile the card refuses is skipped.

        ``nvmlDeviceGetGpuInstanceProfileInfo`` (the v2 struct, with the profile's name; v1 on
        older drivers, named by ``backend.mig_profile_name``) for each
        profile in ``backend.MIG_PROFILE_IDS``, then its placements by the profile's ``id``.
        NOT_SUPPORTED / INVALID_ARGUMENT (the card has no such profile) skip it, as HAMi's
        ``discoverMigProfiles`` skips a profile whose query fails.
        """
        out: list[backend.MigProfileRecord] = []
        for profile in backend.MIG_PROFILE_IDS:
            info = self._optional(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h, profile)
            if info is None:  # a driver without the v2 call (FUNCTION_NOT_FOUND): the v1 struct
                info = self._optional(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h, profile, 1)
            if info is None or int(info.instanceCount) == 0:
                continue
            placements = self._optional(self._placements, h, int(info.id))
            if not placements:
                continue
            name = _text(getattr(info, "name", b"")).strip().removeprefix(_MIG_PREFIX).strip()
            if not _PROFILE_NAME.match(name):  # v1 struct or an unexpected form: NVIDIA's naming rule
                name = backend.mig_profile_name(int(info.sliceCount), int(info.memorySizeMB), memory_mib)
            out.append(
                backend.MigProfileRecord(
                    profile=profile,
                    name=name,
                    slice_count=int(info.sliceCount),
                    instance_count=int(info.instanceCount),
                    multiprocessors=int(info.multiprocessorCount),
                    memory_mib=int(info.memorySizeMB),
                    placements=placements,
                )
            )
        return tuple(out)

    @staticmethod
    def _placements(h: Any, profile_id: int) -> tuple[tuple[int, int], ...]:
        """``nvmlDeviceGetGpuInstancePossiblePlacements``: ``(start, size)`` per legal placement."""
        array = (pynvml.c_nvmlGpuInstancePlacement_t * _MAX_PLACEMENTS)()
        count = ctypes.c_uint(_MAX_PLACEMENTS)
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, array, ctypes.byref(count))
        return tuple((int(array[k].start), int(array[k].size)) for k in range(count.value))

    def _numa(self, h: Any, bus_id: str) -> int | None:
        """The NUMA node of the CPUs and memory near the card (``nvidia-smi topo -m``'s "NUMA Affinity").

        NVML's memory affinity first (one node at node scope), else the kernel's ``numa_node``.
        Not ``nvmlDeviceGetNumaNodeId``: that is the card's *own* node on platforms where GPU
        memory is a NUMA node (Grace Hopper/Blackwell; "GPU NUMA ID"), unsupported elsewhere.
        """
        affinity = getattr(pynvml, "nvmlDeviceGetMemoryAffinity", _absent)
        words = self._optional(affinity, h, _NODE_SET_WORDS, _AFFINITY_SCOPE_NODE)
        if words is not None:
            nodes = [64 * w + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1]
            if len(nodes) == 1:
                return nodes[0]
        # sysfs uses a 4-digit domain, lower case: 0000:18:00.0
        domain, _, rest = bus_id.lower().partition(":")
        path = SYSFS_PCI / f"{domain[-4:]}:{rest}" / "numa_node"
        try:
            node = int(path.read_text().strip())
        except (OSError, ValueError):
            return None
        return None if node < 0 else node

    def nvlinks(self, index: int) -> tuple[backend.NvLinkRecord, ...]:
        """Active links with their far ends."""
        h = self._handle(index)
        out: list[backend.NvLinkRecord] = []
        for link in range(_MAX_LINKS):
            state = self._optional(pynvml.nvmlDeviceGetNvLinkState, h, link)
            if state != pynvml.NVML_FEATURE_ENABLED:
                continue
            remote = self._optional(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            kind = self._optional(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
            version = self._optional(getattr(pynvml, "nvmlDeviceGetNvLinkVersion", _absent), h, link)
            if remote is None:
                continue
            out.append(
                backend.NvLinkRecord(
                    link=link,
                    remote_bus_id=_text(remote.busId),
                    remote_type=backend.REMOTE_GPU if kind is None else int(kind),
                    version=None if version is None else int(version),
                )
            )
        return tuple(out)

    def pair(self, a: int, b: int) -> backend.PairRecord:
        """Common ancestor and P2P read/write status."""
        ha, hb = self._handle(a), self._handle(b)
        return backend.PairRecord(
            a=a,
            b=b,
            common_ancestor=self._optional(pynvml.nvmlDeviceGetTopologyCommonAncestor, ha, hb),
            p2p_read=self._optional(pynvml.nvmlDeviceGetP2PStatus, ha, hb, _P2P_READ),
            p2p_write=self._optional(pynvml.nvmlDeviceGetP2PStatus, ha, hb, _P2P_WRITE),
        )

    def telemetry(self, index: int) -> backend.TelemetryRecord:
        """Temperature, power (W), utilisation (%) and memory in use (MiB)."""
        h = self._handle(index)
        temp = self._optional(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
        power = self._optional(pynvml.nvmlDeviceGetPowerUsage, h)
        limit = self._optional(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
        util = self._optional(pynvml.nvmlDeviceGetUtilizationRates, h)
        mem = self._optional(pynvml.nvmlDeviceGetMemoryInfo, h)
        return backend.TelemetryRecord(
            index=index,
            temperature_c=None if temp is None else float(temp),
            power_draw_w=None if power is None else power / 1000.0,
            power_limit_w=None if limit is None else limit / 1000.0,
            utilization_pct=None if util is None else float(util.gpu),
            memory_used_mib=None if mem is None else int(mem.used) // (1024 * 1024),
        )

    def start_events(self) -> tuple[int, ...]:
        """Create the event set and register every card that supports the health events."""
        registered: list[int] = []
        with self._lock:
            try:
                self._events = pynvml.nvmlEventSetCreate()
                count = pynvml.nvmlDeviceGetCount()
            except pynvml.NVMLError as e:
                raise _error(e, "creating the NVML event set") from e
            for i in range(count):
                h = self._handle(i)
                supported = self._optional(pynvml.nvmlDeviceGetSupportedEventTypes, h) or 0
                mask = supported & _WANTED_EVENTS
                if not mask:
                    continue
                try:
                    pynvml.nvmlDeviceRegisterEvents(h, mask, self._events)
                except pynvml.NVMLError:
                    continue  # e.g. NOT_SUPPORTED on some vGPU guests: this card stays unwatched
                registered.append(i)
        return tuple(registered)

    def wait_event(self, timeout_s: float) -> backend.DeviceEvent | None:
        """Block for the next event (NVML's wait; the GIL is released by ctypes)."""
        if self._events is None:
            return None
        try:
            data = pynvml.nvmlEventSetWait_v2(self._events, max(1, int(timeout_s * 1000)))
        except pynvml.NVMLError as e:
            if _code(e) == _TIMEOUT:
                return None
            raise _error(e, "waiting for NVML events") from e
        kind = next((k for bit, k in _EVENT_KINDS if data.eventType & bit), backend.EventKind.OTHER)
        index = self._optional(pynvml.nvmlDeviceGetIndex, data.device) if data.device else None
        xid = int(data.eventData) if kind is backend.EventKind.XID else 0
        return backend.DeviceEvent(index=None if index is None else int(index), kind=kind, xid=xid)

    def close(self) -> None:
        """Free the event set and shut NVML down (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._events is not None:
                self._optional(pynvml.nvmlEventSetFree, self._events)
                self._events = None
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass
