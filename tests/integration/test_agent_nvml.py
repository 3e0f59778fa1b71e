"""The agent's NVML backend on a fake ``libnvidia-ml.so.1`` publishes what its fake backend publishes.

Each recorded shape of ``agent.fake`` is written as a shape file for ``hack/fake-nvml/fakenvml.c``.
``gpuslice agent --backend nvml`` (``agent/nvml.py`` -> nvidia-ml-py -> ctypes -> the compiled
library) and ``gpuslice agent --backend fake:<shape>`` then annotate one Node each of a real
kube-apiserver, and the annotations must be equal. Also: the raw records of both backends are equal
field by field (those that no annotation shows included); an XID 79 delivered by the library marks
the card unhealthy, with the same registration and Node event as an XID injected into the fake
backend; NUMA is the node near the card, not the card's own memory node; an NVML init failure is
reported, not fatal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuslice.agent import collect, fake, metrics, nvml, service
from gpuslice.codec import keys, registrations, telemetry
from gpuslice.kube import nodes as kube_nodes
from gpuslice_dev import fakenvml
from gpuslice_dev.controlplane import ControlPlane
from tests.integration import kubehelpers as h

pytestmark = pytest.mark.integration

SHAPES = sorted(fake.SHAPES)
AGENT_KEYS = {keys.NODE_REGISTER, keys.NODE_PAIR_SCORE, keys.GPU_TOPOLOGY, keys.GPU_TELEMETRY}


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fakenvml.build_library(tmp_path_factory.mktemp("fake-nvml"))


def base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != fakenvml.SHAPE_ENV}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def skip_if_host_sysfs_answers(machine: fake.Shape) -> None:
    """Where a shape gives a card no NUMA node, the NVML backend reads ``numa_node`` from this host's
    sysfs by the card's bus id; a host with a real PCI device there answers for the fake card."""
    for g in machine.gpus:
        domain, _, rest = g.pci_bus_id.lower().partition(":")
        if g.numa_node is None and (nvml.SYSFS_PCI / f"{domain[-4:]}:{rest}" / "numa_node").exists():
            pytest.skip(f"this host has a PCI device at {g.pci_bus_id}, where {machine.name} has a GPU")


def agent_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuslice", "agent", "--log-level", "WARNING", *args]


def node_annotations(cp: ControlPlane, node: str) -> dict[str, Any]:
    """The Node's annotations, with the telemetry decoded and its timestamp dropped."""
    status, body = cp.api_request("GET", f"/api/v1/nodes/{node}")
    assert status == 200, body
    out: dict[str, Any] = dict(body["metadata"].get("annotations") or {})
    if keys.GPU_TELEMETRY in out:
        out[keys.GPU_TELEMETRY] = telemetry.decode(out[keys.GPU_TELEMETRY]).cards
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_nvml_and_fake_backends_publish_the_same(
    control_plane: ControlPlane, library: Path, tmp_path: Path, shape: str
) -> None:
    machine = fake.shape(shape)
    skip_if_host_sysfs_answers(machine)
    shape_file = fakenvml.write_shape(machine, tmp_path / f"{shape}.shape")
    nodes = {"nvml": unique(f"nvml-{shape}"), f"fake:{shape}": unique(f"fake-{shape}")}
    envs = {"nvml": fakenvml.agent_env(library, shape_file, base_env()), f"fake:{shape}": base_env()}
    try:
        for node in nodes.values():
            h.create_node(control_plane, node)
        procs = {
            spec: subprocess.Popen(  # both at once: each spends a second or two importing
                agent_argv(
                    "--once", "--register", "--kubeconfig", str(control_plane.kubeconfig), "--node-name", node
                )
                + ["--backend", spec],
                env=envs[spec],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for spec, node in nodes.items()
        }
        reports = {}
        for spec, proc in procs.items():
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, f"{spec}: {err}"
            reports[spec] = json.loads(out)
        assert f"fake-{shape}" in reports["nvml"]["backend"]  # the fake library answered, not a real one
        assert reports["nvml"]["notes"] == reports[f"fake:{shape}"]["notes"]
        published = {spec: node_annotations(control_plane, node) for spec, node in nodes.items()}
    finally:
        for node in nodes.values():
            control_plane.api_request("DELETE", f"/api/v1/nodes/{node}")
    # what a shape must produce, from the shape alone: a registration always, the rest with cards
    expected_keys = AGENT_KEYS if machine.gpus else {keys.NODE_REGISTER}
    assert set(published["nvml"]) >= expected_keys
    assert [d.uuid for d in registrations.decode(published["nvml"][keys.NODE_REGISTER])] == [
        g.uuid for g in machine.gpus
    ]
    assert published["nvml"] == published[f"fake:{shape}"]


DUMP = """
import msgspec
from gpuslice.agent import collect, nvml
b = nvml.NvmlBackend()
try:
    records = collect.inventory(b)
    readings = collect.telemetry(b, records.gpus)
    print(msgspec.json.encode({"describe": b.describe(), "records": records, "telemetry": readings}).decode())
finally:
    b.close()
"""


def nvml_records(library: Path, shape_file: Path) -> dict[str, Any]:
    """What ``agent.nvml.NvmlBackend`` reads through the fake library, as JSON."""
    proc = subprocess.run(
        [sys.executable, "-c", DUMP],
        env=fakenvml.agent_env(library, shape_file, base_env()),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_nvml_backend_reads_the_recorded_records(library: Path, tmp_path: Path, shape: str) -> None:
    machine = fake.shape(shape)
    skip_if_host_sysfs_answers(machine)
    got = nvml_records(library, fakenvml.write_shape(machine, tmp_path / f"{shape}.shape"))
    fb = fake.FakeBackend(machine)
    records = collect.inventory(fb)
    want = msgspec.json.decode(
        msgspec.json.encode({"records": records, "telemetry": collect.telemetry(fb, records.gpus)})
    )
    assert got["describe"] == f"NVML fake-{shape} (driver fake-{shape})"
    assert got["records"]["gpus"] == want["records"]["gpus"]
    assert got["records"]["nvlinks"] == want["records"]["nvlinks"]
    assert got["records"]["pairs"] == want["records"]["pairs"]
    assert got["records"] == want["records"]
    assert got["telemetry"] == want["telemetry"]


def test_numa_is_the_node_near_the_card(library: Path, tmp_path: Path) -> None:
    # a Grace Hopper-like card: its memory is NUMA node 1, the CPUs near it are node 0
    shape_file = tmp_path / "gh200.shape"
    shape_file.write_text(
        "gpuslice-fake-nvml 1\n"
        "device 0\nuuid GPU-gh\nname NVIDIA GH200 480GB\nbus 0009:01:00.0\nmemory 97871 0\n"
        "numa 0\ngpu-numa 1\n"
        "device 1\nuuid GPU-x86\nname NVIDIA H100 80GB HBM3\nbus 0000:18:00.0\nmemory 81559 0\nnuma 3\n"
    )
    gpus = nvml_records(library, shape_file)["records"]["gpus"]
    assert [g["numa_node"] for g in gpus] == [0, 3]


def test_init_failure_is_reported_not_fatal(library: Path, tmp_path: Path) -> None:
    shape_file = tmp_path / "no-driver.shape"
    shape_file.write_text("gpuslice-fake-nvml 1\ninit-error 9\n")  # NVML_ERROR_DRIVER_NOT_LOADED
    proc = subprocess.run(
        agent_argv("--once", "--dry-run", "--node-name", "n", "--backend", "nvml"),
        env=fakenvml.agent_env(library, shape_file, base_env()),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert "DriverNotLoaded" in report["error"] and report["annotations"] == {}


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def card_health(cp: ControlPlane, node: str) -> list[bool]:
    value = node_annotations(cp, node).get(keys.NODE_REGISTER)
    return [] if value is None else [bool(d.health) for d in registrations.decode(value)]


def node_events(cp: ControlPlane, node: str) -> list[tuple[str, str, str]]:
    status, body = cp.api_request(
        "GET", f"/apis/events.k8s.io/v1/namespaces/default/events?fieldSelector=regarding.name%3D{node}"
    )
    assert status == 200, body
    items = sorted(body["items"], key=lambda e: e["eventTime"])
    return [(e["type"], e["reason"], e["note"]) for e in items]


@pytest.fixture
def nodes(control_plane: ControlPlane) -> Iterator[dict[str, str]]:
    names = {"nvml": unique("nvml-xid"), "fake": unique("fake-xid")}
    for node in names.values():
        h.create_node(control_plane, node)
    yield names
    for node in names.values():
        control_plane.api_request("DELETE", f"/api/v1/nodes/{node}")


def test_xid_from_the_library_marks_the_card_like_the_fake_backend(
    control_plane: ControlPlane, library: Path, tmp_path: Path, nodes: dict[str, str]
) -> None:
    healthy = [True] * 8
    xid_on_5 = [True] * 5 + [False] + [True] * 2
    # the library delivers both a second after the agent registers for events; 13 is an
    # application error (ignored), 79 "fallen off the bus"
    events = [fakenvml.xid(5, 13, after_s=1.0), fakenvml.xid(5, 79, after_s=1.0)]
    shape_file = fakenvml.write_shape(fake.shape("h100-8"), tmp_path / "h100-8.shape", events)
    argv = agent_argv(
        "--register",
        "--kubeconfig",
        str(control_plane.kubeconfig),
        "--node-name",
        nodes["nvml"],
        "--backend",
        "nvml",
        "--listen",
        "",
        "--health-quiet-period",
        "600",
    )
    proc = subprocess.Popen(
        argv,
        env=fakenvml.agent_env(library, shape_file, base_env()),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for("the XID on the nvml node", lambda: card_health(control_plane, nodes["nvml"]) == xid_on_5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err  # event set freed and NVML shut down on the way out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    fake_nvml = fake.FakeBackend(fake.shape("h100-8"))
    api = kube_nodes.NodeClient.from_kubeconfig(str(control_plane.kubeconfig), nodes["fake"], time.time)
    settings = service.Settings(
        node_name=nodes["fake"], register=True, quiet_period_s=600.0, health_poll_s=0.05
    )
    agent = service.Agent(settings, lambda: fake_nvml, api, metrics.AgentMetrics())
    stop = threading.Event()
    loop = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    loop.start()
    try:
        wait_for("the fake node's cards", lambda: card_health(control_plane, nodes["fake"]) == healthy)
        fake_nvml.inject_xid(5, 13)
        fake_nvml.inject_xid(5, 79)
        wait_for("the XID on the fake node", lambda: card_health(control_plane, nodes["fake"]) == xid_on_5)
    finally:
        stop.set()
        agent.wake()
        loop.join(10)
        agent.close()

    published = {name: node_annotations(control_plane, node) for name, node in nodes.items()}
    assert published["nvml"] == published["fake"]
    reported = {name: node_events(control_plane, node) for name, node in nodes.items()}
    assert [(t, r) for t, r, _ in reported["nvml"]] == [("Warning", "GPUUnhealthy")]
    assert "XID 79" in reported["nvml"][0][2]
    assert reported["nvml"] == reported["fake"]
