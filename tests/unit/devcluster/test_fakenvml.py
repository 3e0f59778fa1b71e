"""The fake NVML library's Python side (shape files, the build cache) and the C parser's refusals.

The C library is loaded with ctypes in a child process (one per test): a crash there fails the
test instead of the test run, and each process reads ``$GPUSLICE_FAKE_NVML_SHAPE`` afresh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from gpuslice.agent import backend, fake
from gpuslice_dev import fakenvml

pytestmark = pytest.mark.unit

SUCCESS, NOT_SUPPORTED, INVALID_ARGUMENT, DRIVER_NOT_LOADED, TIMEOUT, UNKNOWN = 0, 3, 2, 9, 10, 999


def two_cards(**telemetry: float | int | None) -> fake.Shape:
    """Card 0: an A40 with two NVLinks to card 1; card 1 answers nothing optional."""
    gpus = (
        backend.GpuRecord(
            index=0,
            uuid="GPU-aaaa",
            name="NVIDIA A40",
            memory_total_mib=46068,
            pci_bus_id="00000000:41:00.0",
            numa_node=1,
            mig_enabled=False,
            pcie_generation=4,
            pcie_width=16,
            pcie_max_generation=4,
            pcie_max_width=16,
            architecture=7,
        ),
        backend.GpuRecord(
            index=1, uuid="GPU-bbbb", name="NVIDIA A40", memory_total_mib=46068, pci_bus_id="0000:61:00.0"
        ),
    )
    links = (
        tuple(backend.NvLinkRecord(link=k, remote_bus_id="00000000:61:00.0", version=4) for k in (0, 2)),
        (),
    )
    readings = backend.TelemetryRecord(
        index=0,
        temperature_c=41.0,
        power_draw_w=71.5,
        power_limit_w=300.0,
        utilization_pct=12.0,
        memory_used_mib=2048,
    )
    return fake.Shape(
        name="two",
        gpus=gpus,
        nvlinks=links,
        levels=((None, 40), (None, None)),
        p2p=((None, 0), (1, None)),
        telemetry=(
            msgspec.structs.replace(readings, **telemetry),
            backend.TelemetryRecord(index=1, memory_used_mib=0),
        ),
    )


def test_shape_text_of_two_cards() -> None:
    text = fakenvml.shape_text(two_cards(), [fakenvml.xid(1, 79, after_s=1.5)])
    # temperatures in degrees C, power in mW, memory in MiB; '-' where NVML answers NOT_SUPPORTED;
    # pairs give level, P2P read and P2P write (the fake backend has one status for both)
    assert text.splitlines()[1:] == [
        "gpuslice-fake-nvml 1",
        "driver fake-two",
        "nvml fake-two",
        "device 0",
        "uuid GPU-aaaa",
        "name NVIDIA A40",
        "bus 00000000:41:00.0",
        "memory 46068 2048",
        "numa 1",
        "mig 0",
        "pcie 4 16 4 16",
        "arch 7",
        "temperature 41",
        "power 71500",
        "power-limit 300000",
        "utilization 12 0",
        "nvlink 0 00000000:61:00.0 gpu 4",
        "nvlink 2 00000000:61:00.0 gpu 4",
        "device 1",
        "uuid GPU-bbbb",
        "name NVIDIA A40",
        "bus 0000:61:00.0",
        "memory 46068 0",
        "numa -",
        "mig -",
        "pcie - - - -",
        "arch -",
        "temperature -",
        "power -",
        "power-limit -",
        "utilization -",
        "pair 0 1 40 0 0",
        "pair 1 0 - 1 1",
        "event 1 xid 79 1500",
    ]
    assert text.startswith("#")


@pytest.mark.parametrize(
    ("telemetry", "message"),
    [
        ({"temperature_c": 41.5}, "temperature"),
        ({"power_draw_w": 71.0005}, "milliwatts"),
        ({"utilization_pct": 12.5}, "utilisation"),
        ({"utilization_pct": 101.0}, "utilisation"),
        ({"memory_used_mib": None}, "memory in use"),
        ({"memory_used_mib": 46069}, "in use of"),
    ],
    ids=["half-degree", "sub-milliwatt", "fractional-util", "util-over-100", "no-memory-used", "used>total"],
)
def test_shape_text_refuses_readings_nvml_cannot_report(
    telemetry: dict[str, float | int | None], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        fakenvml.shape_text(two_cards(**telemetry))


def test_shape_text_refuses_malformed_identity_and_events() -> None:
    shape = two_cards()
    bad_bus = fake.Shape(
        name="two",
        gpus=(
            shape.gpus[0],
            backend.GpuRecord(index=1, uuid="G", name="x", memory_total_mib=1, pci_bus_id="61:00.0"),
        ),
        nvlinks=shape.nvlinks,
        levels=shape.levels,
        p2p=shape.p2p,
        telemetry=shape.telemetry,
    )
    with pytest.raises(ValueError, match="bus id"):
        fakenvml.shape_text(bad_bus)
    with pytest.raises(ValueError, match="event kind"):
        fakenvml.shape_text(shape, [fakenvml.ScheduledEvent(after_s=0, index=0, kind="boom")])
    with pytest.raises(ValueError, match="GPU 2"):
        fakenvml.shape_text(shape, [fakenvml.xid(2, 79)])


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fakenvml.build_library(tmp_path_factory.mktemp("fake-nvml"))


CALL_INIT = """
import ctypes, json, os, sys
lib = ctypes.CDLL(sys.argv[1])
codes = []
for path in json.loads(sys.argv[2]):
    if path is None:
        os.environ.pop("GPUSLICE_FAKE_NVML_SHAPE", None)
    else:
        os.environ["GPUSLICE_FAKE_NVML_SHAPE"] = path
    rc = lib.nvmlInit_v2()
    count = ctypes.c_uint(0)
    if rc == 0:
        assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0
        assert lib.nvmlShutdown() == 0
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 1  # NVML_ERROR_UNINITIALIZED
    codes.append([rc, count.value])
print(json.dumps(codes))
"""


def init_codes(library: Path, paths: list[str | None]) -> list[list[int]]:
    """``[nvmlInit_v2's code, device count]`` for each shape file (None: variable unset)."""
    proc = subprocess.run(
        [sys.executable, "-c", CALL_INIT, str(library), json.dumps(paths)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    codes: list[list[int]] = json.loads(proc.stdout)
    return codes


VALID = """gpuslice-fake-nvml 1
# comment
device 0
uuid GPU-0
name Tesla T4
bus 0000:04:00.0
memory 15360 0
device 1
uuid GPU-1
name   Tesla T4 (second)
bus 0000:05:00.0
memory 15360 0
nvlink 0 0000:04:00.0 gpu 4
pair 0 1 30 0 0
event 1 xid 79 0
"""


def card_1_memory(line: str) -> bytes:
    return VALID.replace("memory 15360 0\nnvlink", f"{line}\nnvlink").encode()


MALFORMED: dict[str, bytes] = {
    "empty-file": b"",
    "comments-only": b"# nothing\n\n",
    "no-header": VALID.replace("gpuslice-fake-nvml 1\n", "").encode(),
    "other-version": VALID.replace("gpuslice-fake-nvml 1", "gpuslice-fake-nvml 2").encode(),
    "unknown-keyword": (VALID + "colour blue\n").encode(),
    "device-out-of-order": VALID.replace("device 1", "device 2").encode(),
    "attribute-before-device": VALID.replace("# comment", "uuid GPU-x").encode(),
    "duplicate-attribute": (VALID + "uuid GPU-again\n").encode(),
    "missing-bus": VALID.replace("bus 0000:05:00.0\n", "").encode(),
    "missing-name": VALID.replace("name Tesla T4\n", "").encode(),
    "empty-name": VALID.replace("name Tesla T4\n", "name   \n").encode(),
    "name-too-long": VALID.replace("name Tesla T4", "name " + "x" * 96).encode(),
    "bus-without-function": VALID.replace("bus 0000:05:00.0", "bus 0000:05:00").encode(),
    "bus-device-over-1f": VALID.replace("bus 0000:05:00.0", "bus 0000:05:20.0").encode(),
    "bus-not-hex": VALID.replace("bus 0000:05:00.0", "bus 0000:0g:00.0").encode(),
    "memory-not-a-number": card_1_memory("memory lots 0"),
    "memory-negative": card_1_memory("memory -1 0"),
    "memory-overflow": card_1_memory("memory 99999999999999999999999 0"),
    "used-over-total": card_1_memory("memory 15360 15361"),
    "missing-argument": card_1_memory("memory 15360"),
    "extra-argument": (VALID + "numa 0 1\n").encode(),
    "hex-without-digits": (VALID + "arch 0x\n").encode(),
    "too-many-words": (VALID + "pcie 1 2 3 4 5 6 7 8 9\n").encode(),
    "link-36": VALID.replace("nvlink 0", "nvlink 36").encode(),
    "link-type": VALID.replace(" gpu 4", " nvswitch 4").encode(),
    "pair-unknown-card": (VALID + "pair 0 7 30 0 0\n").encode(),
    "pair-self": (VALID + "pair 1 1 30 0 0\n").encode(),
    "pair-twice": (VALID + "pair 0 1 30 0 0\n").encode(),
    "pair-level-35": VALID.replace("pair 0 1 30", "pair 0 1 35").encode(),
    "event-unknown-card": (VALID + "event 3 xid 79 0\n").encode(),
    "event-unknown-kind": (VALID + "event 1 boom 79 0\n").encode(),
    "device-64": VALID.replace("device 1", "device 64").encode(),
    "line-of-2000": (VALID + "# " + "x" * 2000 + "\n").encode(),
    "nul-byte": VALID.replace("name Tesla T4\n", "name Tesla\0T4\n").encode(),
    "control-character": VALID.replace("name Tesla T4\n", "name Tesla\x01T4\n").encode(),
    "non-ascii": VALID.replace("name Tesla T4\n", "name Tesla T4 \u00e9\n").encode(),
    "binary": bytes(range(256)) * 8,
}


def test_library_rejects_malformed_shapes(library: Path, tmp_path: Path) -> None:
    paths: list[str | None] = []
    for case, data in MALFORMED.items():
        path = tmp_path / f"{case}.shape"
        path.write_bytes(data)
        paths.append(str(path))
    valid = tmp_path / "valid.shape"
    valid.write_text(VALID)
    codes = init_codes(library, [str(valid), *paths, str(valid)])
    assert codes[0] == codes[-1] == [SUCCESS, 2]  # the edits, not the base, are what is refused
    refused = dict(zip(MALFORMED, codes[1:-1], strict=True))
    assert refused == {case: [UNKNOWN, 0] for case in MALFORMED}


def test_library_without_a_machine_is_a_missing_driver(library: Path, tmp_path: Path) -> None:
    failing = tmp_path / "failing.shape"
    failing.write_text(VALID + "init-error 9\n")
    codes = init_codes(library, [None, str(tmp_path / "absent.shape"), str(failing)])
    assert codes == [[DRIVER_NOT_LOADED, 0]] * 3


def test_every_fake_shape_loads(library: Path, tmp_path: Path) -> None:
    paths: list[str | None] = [
        str(fakenvml.write_shape(fake.shape(name), tmp_path / f"{name}.shape"))
        for name in sorted(fake.SHAPES)
    ]
    counts = [len(fake.shape(name).gpus) for name in sorted(fake.SHAPES)]
    assert init_codes(library, paths) == [[SUCCESS, n] for n in counts]


EVENTS = """
import ctypes, json, sys, time
lib = ctypes.CDLL(sys.argv[1])

class EventData(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong),
                ("eventData", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]

assert lib.nvmlInit_v2() == 0
handles = [ctypes.c_void_p() for _ in range(2)]
for i, h in enumerate(handles):
    assert lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0
out = {}
event_set = ctypes.c_void_p()
start = time.monotonic()
assert lib.nvmlEventSetCreate(ctypes.byref(event_set)) == 0
out["register_unsupported"] = lib.nvmlDeviceRegisterEvents(handles[0], ctypes.c_ulonglong(0x4), event_set)
assert lib.nvmlDeviceRegisterEvents(handles[1], ctypes.c_ulonglong(0x8), event_set) == 0
data = EventData()
out["early"] = lib.nvmlEventSetWait_v2(event_set, ctypes.byref(data), 100)
out["due"] = lib.nvmlEventSetWait_v2(event_set, ctypes.byref(data), 2000)
out["waited_s"] = time.monotonic() - start
out["event"] = [data.device == handles[1].value, data.eventType, data.eventData]
out["drained"] = lib.nvmlEventSetWait_v2(event_set, ctypes.byref(data), 50)
node = (ctypes.c_ulong * 2)()
out["affinity"] = [lib.nvmlDeviceGetMemoryAffinity(handles[0], 2, node, 0), list(node)]
out["affinity_unknown"] = lib.nvmlDeviceGetMemoryAffinity(handles[1], 2, node, 0)
level = ctypes.c_uint(99)
ancestor = lib.nvmlDeviceGetTopologyCommonAncestor
out["level_self"] = [ancestor(handles[0], handles[0], ctypes.byref(level)), level.value]
out["bogus_handle"] = ancestor(ctypes.c_void_p(8), handles[0], ctypes.byref(level))
state = ctypes.c_uint(7)
out["link_states"] = [lib.nvmlDeviceGetNvLinkState(handles[0], k, ctypes.byref(state)) * 10 + state.value
                      for k in range(4)]
out["no_nvlink"] = lib.nvmlDeviceGetNvLinkState(handles[1], 0, ctypes.byref(state))
name = ctypes.create_string_buffer(96)
assert lib.nvmlDeviceGetName(handles[1], name, 96) == 0
out["name"] = name.value.decode()
small = ctypes.create_string_buffer(4)
out["small_buffer"] = lib.nvmlDeviceGetUUID(handles[0], small, 4)
assert lib.nvmlEventSetFree(event_set) == 0
assert lib.nvmlShutdown() == 0
out["after_shutdown"] = lib.nvmlShutdown()
print(json.dumps(out))
"""


def test_library_serves_events_numa_and_links(library: Path, tmp_path: Path) -> None:
    shape = tmp_path / "events.shape"
    shape.write_text(
        "gpuslice-fake-nvml 1\n"
        "device 0\nuuid GPU-0\nname A\nbus 0000:04:00.0\nmemory 1 0\nnuma 65\nevents 0x8\n"
        "nvlink 2 0000:05:00.0 gpu -\n"
        "device 1\nuuid GPU-1\nname   Tesla  T4 (b) \t\nbus 0000:05:00.0\nmemory 1 0\n"
        "event 0 xid 13 0\n"  # card 0 registers nothing: never delivered
        "event 1 xid 79 400\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", EVENTS, str(library)],
        env={**os.environ, fakenvml.SHAPE_ENV: str(shape)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["register_unsupported"] == NOT_SUPPORTED  # card 0 supports XID events only
    assert out["early"] == TIMEOUT
    assert out["due"] == SUCCESS and out["waited_s"] >= 0.39  # 400 ms, on a millisecond clock
    assert out["event"] == [True, 0x8, 79]
    assert out["drained"] == TIMEOUT
    assert out["affinity"] == [SUCCESS, [0, 2]]  # node 65: word 1, bit 1
    assert out["affinity_unknown"] == NOT_SUPPORTED
    assert out["level_self"] == [SUCCESS, 0]  # NVML_TOPOLOGY_INTERNAL
    assert out["bogus_handle"] == INVALID_ARGUMENT
    # links 0 and 1 exist but are inactive, link 2 is active, link 3 is past the card's links
    assert out["link_states"] == [0, 0, 1, INVALID_ARGUMENT * 10 + 1]
    assert out["no_nvlink"] == NOT_SUPPORTED
    assert out["name"] == "Tesla  T4 (b)"  # the rest of the line, inner spaces kept
    assert out["small_buffer"] == 7  # NVML_ERROR_INSUFFICIENT_SIZE
    assert out["after_shutdown"] == 1  # NVML_ERROR_UNINITIALIZED


def test_build_is_cached_by_source(library: Path, tmp_path: Path) -> None:
    root = library.parent.parent
    assert fakenvml.build_library(root) == library  # built already: no second compile
    assert library.stat().st_mtime_ns == fakenvml.build_library(root).stat().st_mtime_ns
    changed = tmp_path / "fakenvml.c"
    changed.write_text(fakenvml.SOURCE.read_text() + "\n/* changed */\n")
    other = fakenvml.build_library(root, source=changed)
    assert other.name == "libnvidia-ml.so.1" and other.parent != library.parent
    assert sorted(p.name for p in other.parent.iterdir()) == ["libnvidia-ml.so.1"]  # no temporary left


def test_build_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(fakenvml.FakeNvmlError, match="no-such-cc not found"):
        fakenvml.build_library(tmp_path, compiler="no-such-cc")
    broken = tmp_path / "broken.c"
    broken.write_text("int f(void) { return }\n")
    with pytest.raises(fakenvml.FakeNvmlError, match="gcc failed") as e:
        fakenvml.build_library(tmp_path, source=broken)
    assert "broken.c" in str(e.value)
    assert [p.name for p in tmp_path.rglob("*.tmp")] == []


def test_agent_env_puts_the_library_first(tmp_path: Path) -> None:
    lib = tmp_path / "x" / "libnvidia-ml.so.1"
    env = fakenvml.agent_env(lib, tmp_path / "s.shape", {"LD_LIBRARY_PATH": "/usr/lib:", "HOME": "/h"})
    assert env == {
        "LD_LIBRARY_PATH": f"{tmp_path / 'x'}:/usr/lib",
        fakenvml.SHAPE_ENV: str(tmp_path / "s.shape"),
        "HOME": "/h",
    }
