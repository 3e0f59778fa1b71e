"""The NVML adapter over a stand-in ``pynvml`` module: call mapping, unsupported calls, errors, events."""

from __future__ import annotations

import ctypes
import pathlib
import types
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest

from gpuslice.agent import backend, collect, discover, fake, nvml

pytestmark = pytest.mark.unit

NOT_SUPPORTED, INVALID_ARGUMENT, TIMEOUT, LIBRARY_NOT_FOUND = 3, 2, 10, 12


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def fail(code: int) -> Any:
    def call(*_args: Any) -> Any:
        raise NVMLError(code)

    return call


class Handle:
    def __init__(self, i: int) -> None:
        self.i = i

    def __bool__(self) -> bool:
        return True


def stub_pynvml() -> types.SimpleNamespace:
    """Two A40s joined by 2 NVLinks; card 1 has no NUMA answer; one XID 79 event queued on card 1."""
    handles = [Handle(0), Handle(1)]
    buses = [b"00000000:41:00.0", b"00000000:61:00.0"]
    events = [types.SimpleNamespace(eventType=0x0008, eventData=79, device=handles[1])]

    def p2p(a: Handle, b: Handle, index: int) -> int:
        assert isinstance(index, int)  # pynvml's own READ constant is a tuple; the adapter must not use it
        return 0

    def link_state(h: Handle, link: int) -> int:
        if link >= 4:
            raise NVMLError(INVALID_ARGUMENT)
        return 1 if link < 2 else 0

    def affinity(h: Handle, words: int, scope: int) -> list[int]:
        assert scope == 0  # NVML_AFFINITY_SCOPE_NODE
        if h.i == 1:
            raise NVMLError(NOT_SUPPORTED)
        return [0b1] + [0] * (words - 1)  # node 0

    def wait(_s: Any, _ms: int) -> Any:
        if events:
            return events.pop()
        raise NVMLError(TIMEOUT)

    return types.SimpleNamespace(
        NVMLError=NVMLError,
        NVML_FEATURE_ENABLED=1,
        NVML_DEVICE_MIG_ENABLE=1,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "580.95.05",
        nvmlSystemGetNVMLVersion=lambda: "13.580.95.05",
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: handles[i],
        nvmlDeviceGetIndex=lambda h: h.i,
        nvmlDeviceGetUUID=lambda h: f"GPU-{h.i}",
        nvmlDeviceGetName=lambda h: b"NVIDIA A40",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=46068 * 2**20, used=512 * 2**20),
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=buses[h.i]),
        nvmlDeviceGetMigMode=fail(NOT_SUPPORTED),
        nvmlDeviceGetNumaNodeId=lambda h: 9,  # the card's own node (coherent platforms): not the one near it
        nvmlDeviceGetMemoryAffinity=affinity,
        nvmlDeviceGetNvLinkState=link_state,
        nvmlDeviceGetNvLinkRemotePciInfo=lambda h, link: types.SimpleNamespace(busId=buses[1 - h.i]),
        nvmlDeviceGetNvLinkRemoteDeviceType=lambda h, link: 0,
        nvmlDeviceGetNvLinkVersion=lambda h, link: 4,  # NVML_NVLINK_VERSION_3_0
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: 1,  # idle: the link trained down
        nvmlDeviceGetCurrPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 4,
        nvmlDeviceGetMaxPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetArchitecture=fail(NOT_SUPPORTED),
        nvmlDeviceGetTopologyCommonAncestor=lambda a, b: 40,
        nvmlDeviceGetP2PStatus=p2p,
        nvmlDeviceGetTemperature=lambda h, s: 45,
        nvmlDeviceGetPowerUsage=lambda h: 71500,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 300000,
        nvmlDeviceGetUtilizationRates=fail(NOT_SUPPORTED),
        nvmlEventSetCreate=lambda: object(),
        nvmlDeviceGetSupportedEventTypes=lambda h: 0x0008 | 0x0002 | 0x0001,
        nvmlDeviceRegisterEvents=lambda h, mask, s: None,
        nvmlEventSetWait_v2=wait,
        nvmlEventSetFree=lambda s: None,
    )


@pytest.fixture
def adapter(tmp_path: pathlib.Path) -> Iterator[nvml.NvmlBackend]:
    (tmp_path / "0000:61:00.0").mkdir()
    (tmp_path / "0000:61:00.0" / "numa_node").write_text("1\n")
    with mock.patch.object(nvml, "pynvml", stub_pynvml()), mock.patch.object(nvml, "SYSFS_PCI", tmp_path):
        b = nvml.NvmlBackend()
        yield b
        b.close()


def test_records(adapter: nvml.NvmlBackend) -> None:
    gpus = adapter.gpus()
    assert gpus[0] == backend.GpuRecord(
        index=0,
        uuid="GPU-0",
        name="NVIDIA A40",
        memory_total_mib=46068,
        pci_bus_id="00000000:41:00.0",
        numa_node=0,
        pcie_generation=1,
        pcie_width=16,
        pcie_max_generation=4,
        pcie_max_width=16,
    )
    assert gpus[1].numa_node == 1  # NVML does not answer: read from sysfs
    assert gpus[1].mig_enabled is None
    assert [link.link for link in adapter.nvlinks(0)] == [0, 1]
    assert [link.version for link in adapter.nvlinks(0)] == [4, 4]
    assert adapter.pair(0, 1) == backend.PairRecord(a=0, b=1, common_ancestor=40, p2p_read=0, p2p_write=0)
    t = adapter.telemetry(1)
    assert (t.temperature_c, t.power_draw_w, t.power_limit_w, t.utilization_pct, t.memory_used_mib) == (
        45.0,
        71.5,
        300.0,
        None,
        512,
    )
    assert "580.95.05" in adapter.describe()


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ([0, 0b10, 0, 0], 65),  # word 1, bit 1
        ([0b110, 0, 0, 0], None),  # two nodes: NVML does not name one, and sysfs has no entry
        ([0, 0, 0, 0], None),
    ],
    ids=["node-65", "two-nodes", "no-node"],
)
def test_numa_from_memory_affinity(tmp_path: pathlib.Path, words: list[int], expected: int | None) -> None:
    stub = stub_pynvml()
    stub.nvmlDeviceGetMemoryAffinity = lambda h, size, scope: words[:size]
    with mock.patch.object(nvml, "pynvml", stub), mock.patch.object(nvml, "SYSFS_PCI", tmp_path):
        b = nvml.NvmlBackend()
        try:
            assert b.gpus()[0].numa_node == expected
        finally:
            b.close()


def test_same_discovery_path(adapter: nvml.NvmlBackend) -> None:
    d = discover.discover(collect.inventory(adapter), discover.RegistrationConfig())
    assert d.topology is not None
    assert d.topology.nvlinks == ((0, 2), (2, 0))
    assert d.scores[0][1] == 20 + 200  # NODE + 2 links
    assert d.topology.bandwidth == ((0.0, 50.0), (50.0, 0.0))  # 2 links of NVLink 3.0, 25 GB/s each


def test_old_pynvml_without_the_newer_calls(tmp_path: pathlib.Path) -> None:
    stub = stub_pynvml()
    for name in (
        "nvmlDeviceGetNvLinkVersion",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetArchitecture",
    ):
        delattr(stub, name)
    with mock.patch.object(nvml, "pynvml", stub), mock.patch.object(nvml, "SYSFS_PCI", tmp_path):
        b = nvml.NvmlBackend()
        try:
            d = discover.discover(collect.inventory(b), discover.RegistrationConfig())
            assert b.gpus()[0].pcie_generation is None
        finally:
            b.close()
    assert d.topology is not None and d.topology.bandwidth == ((0.0, 40.0), (40.0, 0.0))  # 2 x 20 GB/s


def test_events(adapter: nvml.NvmlBackend) -> None:
    assert adapter.start_events() == (0, 1)
    assert adapter.wait_event(0.01) == backend.DeviceEvent(index=1, kind=backend.EventKind.XID, xid=79)
    assert adapter.wait_event(0.01) is None  # NVML's timeout is not an error


def test_missing_library_is_a_clear_error() -> None:
    stub = stub_pynvml()
    stub.nvmlInit = fail(LIBRARY_NOT_FOUND)
    with mock.patch.object(nvml, "pynvml", stub), pytest.raises(backend.BackendError) as e:
        nvml.NvmlBackend()
    assert e.value.reason == backend.REASON_LIBRARY_MISSING
    assert "libnvidia-ml.so.1" in str(e.value)


def test_lost_gpu_while_enumerating() -> None:
    stub = stub_pynvml()
    stub.nvmlDeviceGetUUID = fail(15)
    with mock.patch.object(nvml, "pynvml", stub):
        b = nvml.NvmlBackend()
        with pytest.raises(backend.BackendError) as e:
            b.gpus()
    assert e.value.reason == backend.REASON_GPU_LOST


class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


def mig_stub(*, name: bool = True) -> types.SimpleNamespace:
    """Card 0 in MIG mode offering the A100 40GB table (1g.10gb unsupported, 6g/8g invalid); card 1 not."""
    stub = stub_pynvml()
    table = {r.profile: r for r in fake.MIG_RECORDS["A100-SXM4-40GB"]}
    stub.nvmlDeviceGetName = lambda h: b"NVIDIA A100-SXM4-40GB"
    stub.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=40960 * 2**20, used=0)
    stub.nvmlDeviceGetMigMode = lambda h: [1, 1] if h.i == 0 else [0, 0]
    stub.c_nvmlGpuInstancePlacement_t = Placement
    asked: list[int] = []

    def info(h: Handle, profile: int, version: int = 2) -> Any:
        asked.append(profile)
        assert h.i == 0  # never asked of a card outside MIG mode
        if profile == 9:
            raise NVMLError(NOT_SUPPORTED)
        if profile not in table:
            raise NVMLError(INVALID_ARGUMENT)
        r = table[profile]
        return types.SimpleNamespace(
            id=100 + profile,  # NVML's profile id, not the enum index
            sliceCount=r.slice_count,
            instanceCount=r.instance_count,
            multiprocessorCount=r.multiprocessors,
            memorySizeMB=r.memory_mib,
            **({"name": f"MIG {r.name}".encode()} if name else {}),
        )

    def placements(h: Handle, profile_id: int, array: Any, count: Any) -> int:
        r = table[profile_id - 100]
        assert count._obj.value >= len(r.placements)
        for k, (start, size) in enumerate(r.placements):
            array[k].start, array[k].size = start, size
        count._obj.value = len(r.placements)
        return 0

    stub.nvmlDeviceGetGpuInstanceProfileInfo = info
    stub.nvmlDeviceGetGpuInstancePossiblePlacements = placements
    stub.asked = asked
    return stub


@pytest.mark.parametrize("named", [True, False], ids=["v2-name", "derived-name"])
def test_mig_profiles_from_nvml(tmp_path: pathlib.Path, named: bool) -> None:
    stub = mig_stub(name=named)
    with mock.patch.object(nvml, "pynvml", stub), mock.patch.object(nvml, "SYSFS_PCI", tmp_path):
        b = nvml.NvmlBackend()
        try:
            gpus = b.gpus()
            d = discover.discover(collect.inventory(b), discover.RegistrationConfig())
        finally:
            b.close()
    assert gpus[0].mig_enabled is True and gpus[1].mig_enabled is False
    expected = tuple(r for r in fake.MIG_RECORDS["A100-SXM4-40GB"] if r.profile != 9)
    assert gpus[0].mig_profiles == expected
    assert gpus[1].mig_profiles == ()
    assert sorted(set(stub.asked)) == sorted(backend.MIG_PROFILE_IDS)
    card = d.devices[0]
    assert card.is_mig and card.split_count == 7 and card.cores == 100
    assert [p.name for p in card.mig_profiles] == ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
    assert [p.cores for p in card.mig_profiles] == [15, 29, 43, 58, 100]


def test_mig_profile_query_failing_otherwise_is_an_error(tmp_path: pathlib.Path) -> None:
    stub = mig_stub()
    stub.nvmlDeviceGetGpuInstanceProfileInfo = fail(15)  # GPU lost: not a missing profile
    with mock.patch.object(nvml, "pynvml", stub), mock.patch.object(nvml, "SYSFS_PCI", tmp_path):
        b = nvml.NvmlBackend()
        try:
            with pytest.raises(backend.BackendError) as e:
                b.gpus()
        finally:
            b.close()
    assert e.value.reason == backend.REASON_GPU_LOST
