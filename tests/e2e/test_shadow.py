"""Shadow mode through the real kube-scheduler: ``binpack`` live, ``fgd-lookahead`` in shadow.

This module runs its own control plane, fake nodes, ``gpuslice serve --shadow-policy`` and
kube-scheduler (the session cluster's extender runs without shadow mode, and two extenders on one
apiserver would contend for the leader Lease). A handful of GPU pods is scheduled one after the
other; then ``gpuslice shadow report`` (the real command, from the extender's URL and from its
record file) must show, in its live column, the node and cards the API says each pod was bound to
(``spec.nodeName`` and HAMi's ``hami.io/vgpu-devices-allocated``), and in the fgd-lookahead
column a placement that fits the nodes.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuslice.codec import keys, pod_devices
from gpuslice_dev import devcluster, nodesim
from gpuslice_dev.controlplane import ControlPlane

pytestmark = pytest.mark.e2e

SCHEDULER = "gpuslice-shadow"
A100 = "NVIDIA A100-SXM4-80GB"
NODES: dict[str, dict[str, Any]] = {
    "shadow-a100-0": {"model": A100, "count": 4, "memory_mib": 81920, "numa": [0, 0, 1, 1]},
    "shadow-a100-1": {"model": A100, "count": 4, "memory_mib": 81920, "numa": [0, 0, 1, 1]},
    "shadow-a100-2": {"model": A100, "count": 2, "memory_mib": 81920, "numa": [0, 0]},
}
# (name, cards, MiB per card, cores per card), created and bound one after the other.
PODS = [
    ("s1", 1, 20000, 30),
    ("s2", 1, 40000, 50),
    ("s3", 2, 10000, 20),
    ("s4", 1, 81920, 100),
    ("s5", 1, 30000, 40),
    ("s6", 1, 20000, 30),
]


class Shadowed:
    def __init__(self, cp: ControlPlane, ext: devcluster.Extender, record: Path) -> None:
        self.cp = cp
        self.ext = ext
        self.record = record

    def create(self, ns: str, name: str, cards: int, mem: int, cores: int) -> None:
        limits = {
            "nvidia.com/gpu": str(cards),
            "nvidia.com/gpumem": str(mem),
            "nvidia.com/gpucores": str(cores),
        }
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "schedulerName": SCHEDULER,
                "containers": [{"name": "c", "image": "pause", "resources": {"limits": limits}}],
            },
        }
        status, obj = self.cp.api_request("POST", f"/api/v1/namespaces/{ns}/pods", body)
        assert status == 201, obj

    def wait_bound(self, ns: str, name: str, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, obj = self.cp.api_request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
            assert status == 200, obj
            if obj["spec"].get("nodeName") and keys.DEVICES_ALLOCATED in obj["metadata"].get(
                "annotations", {}
            ):
                return dict(obj)
            time.sleep(0.2)
        raise AssertionError(f"pod {ns}/{name} not bound\n--- gpuslice log ---\n{self.ext.tail(60)}")


@pytest.fixture(scope="module")
def shadowed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shadowed]:
    work: Path = tmp_path_factory.mktemp("shadow")
    record = work / "shadow.jsonl"
    cp = ControlPlane(workdir=work / "cp")
    cp.start()
    sim: devcluster.NodeSimThread | None = None
    ext: devcluster.Extender | None = None
    try:
        sim = devcluster.NodeSimThread(cp.kubeconfig, NODES).start()
        args = [
            "--node-policy",
            "binpack",
            "--shadow-policy",
            "fgd-lookahead",
            "--shadow-record",
            str(record),
        ]
        args += ["--workload-min-count", "1", "--workload-period-s", "0", "--scheduler-name", SCHEDULER]
        ext = devcluster.Extender(cp.kubeconfig, work / "gpuslice.log", extra_args=args).start()
        cp.start_scheduler(devcluster.render_scheduler_config(ext.url, cp.kubeconfig, SCHEDULER))
        yield Shadowed(cp, ext, record)
    finally:
        if ext is not None:
            ext.stop()
        if sim is not None:
            sim.stop()
        cp.stop()


def _report(source: str) -> dict[str, Any]:
    out = subprocess.run(  # noqa: S603 - our own CLI
        devcluster.gpuslice_command("shadow", "report", "--from", source, "--json"),
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    got: dict[str, Any] = json.loads(out.stdout)
    return got


def test_report_live_column_matches_the_bindings(shadowed: Shadowed) -> None:
    ns = "shadow"
    status, body = shadowed.cp.api_request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    assert status == 201, body
    bound: dict[str, tuple[str, list[list[str]]]] = {}
    for name, cards, mem, cores in PODS:
        shadowed.create(ns, name, cards, mem, cores)
        obj = shadowed.wait_bound(ns, name)
        alloc = pod_devices.allocation_from_annotations(obj["metadata"]["annotations"], container_count=1)
        assert alloc is not None and alloc.node == obj["spec"]["nodeName"]
        bound[f"{ns}/{name}"] = (
            obj["spec"]["nodeName"],
            [sorted(g.uuid for g in c) for c in alloc.containers],
        )

    summary = json.loads(_get(shadowed.ext.url + "/shadow"))
    assert summary["enabled"] and summary["decisions"] == len(PODS)
    assert summary["policies"]["fgd-lookahead"]["decisions"] == len(PODS)

    for source in (shadowed.ext.url, str(shadowed.record)):
        report = _report(source)
        assert report["live_policy"] == "binpack" and report["decisions"] == len(PODS)
        rows = {(r["policy"], r["live"]): r for r in report["policies"]}
        assert rows["binpack", True]["placed"] == len(PODS)
        assert rows["binpack", True]["node_agreement"] == 1.0
        live = {
            p["key"]: (p["placements"]["live"]["node"], p["placements"]["live"]["cards"])
            for p in report["pods"]
        }
        assert live == bound
        shadow = {p["key"]: p["placements"]["fgd-lookahead"] for p in report["pods"]}
        _assert_valid(shadow)
        fgd = rows["fgd-lookahead", False]
        assert fgd["placed"] + fgd["unplaced"] == len(PODS)
        assert fgd["placed"] == sum(1 for p in shadow.values() if p["node"])
        # The first pod: the replay starts from the state the extender judged it on, so the
        # replayed choice is the one the extender made online.
        first = next(
            json.loads(line) for line in shadowed.record.read_text().splitlines() if '"decision"' in line
        )
        (online,) = first["shadows"]
        assert shadow[first["key"]] == {"node": online["node"], "cards": online["cards"]}


def _assert_valid(placements: dict[str, dict[str, Any]]) -> None:
    """Each placed pod on cards of its node, as many as it asked; no card past its memory or cores."""
    asks = {f"shadow/{name}": (cards, mem, cores) for name, cards, mem, cores in PODS}
    mem_used: dict[str, int] = {}
    cores_used: dict[str, int] = {}
    for key, placed in placements.items():
        if not placed["node"]:
            continue
        cards, mem, cores = asks[key]
        (got,) = placed["cards"]
        node_cards = set(nodesim.card_uuids(placed["node"], NODES[placed["node"]]["count"]))
        assert len(set(got)) == len(got) == cards and set(got) <= node_cards, (key, placed)
        for uuid in got:
            mem_used[uuid] = mem_used.get(uuid, 0) + mem
            cores_used[uuid] = cores_used.get(uuid, 0) + cores
    assert all(m <= 81920 for m in mem_used.values()), mem_used
    assert all(c <= 100 for c in cores_used.values()), cores_used


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - a local http URL
        text: str = answer.read().decode()
    return text
