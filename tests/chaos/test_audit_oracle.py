"""The audit itself must be able to fail: each finding is produced from a hand-made API read.

Pure (no cluster): nodes and pods are the JSON shapes ``GET /api/v1/nodes`` and ``/pods`` return.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.codec import keys, pod_devices, registrations
from gpuslice.model import allocations
from gpuslice_dev import nodesim
from tests.chaos import audit

pytestmark = pytest.mark.chaos

NODE = "n0"
CARDS = nodesim.cards(NODE, count=2, memory_mib=1000, split_count=2)
A, B = CARDS[0].uuid, CARDS[1].uuid


def node(lock: str | None = None, register: str | None = None) -> dict[str, Any]:
    ann = {keys.NODE_REGISTER: register if register is not None else registrations.encode_json(CARDS)}
    if lock:
        ann[keys.NODE_LOCK] = lock
    return {"metadata": {"name": NODE, "annotations": ann}}


def pod(
    name: str,
    grants: list[tuple[str, int, int]] | None,
    *,
    bound: str | None = NODE,
    claim: str | None = NODE,
    phase: str = "Running",
    gpus: int = 1,
) -> dict[str, Any]:
    ann: dict[str, str] = {}
    if grants is not None:
        alloc = (tuple(allocations.DeviceGrant(uuid=u, memory_mib=m, cores=c) for u, m, c in grants),)
        ann.update(pod_devices.device_annotations(alloc))
        if claim is not None:
            ann[keys.VGPU_NODE] = claim
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]
    }
    if bound:
        spec["nodeName"] = bound
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": ann},
        "spec": spec,
        "status": {"phase": phase},
    }


def test_clean_read_has_no_problems() -> None:
    report = audit.api_usage(
        [node()], [pod("a", [(A, 600, 50)]), pod("b", [(A, 400, 50)]), pod("w", None, bound=None)]
    )
    assert report.problems() == []
    assert report.cards[A].usage == (1000 * audit.MiB, 100, 2)
    assert report.pending == ["ns/w"] and set(report.bound) == {"ns/a", "ns/b"}


@pytest.mark.parametrize(
    ("pods", "expect"),
    [
        ([pod("a", [(A, 600, 10)]), pod("b", [(A, 500, 10)])], "memory 1100 > 1000 MiB"),
        ([pod("a", [(A, 100, 60)]), pod("b", [(A, 100, 60)])], "cores 120 > 100"),
        ([pod(n, [(A, 10, 0)]) for n in "abc"], "slots 3 > 2"),
        ([pod("a", [(A, 100, 100)]), pod("b", [(A, 100, 0)])], "exclusive grant of ns/a shared"),
    ],
    ids=["memory", "cores", "slots", "exclusive"],
)
def test_overcommit_is_found(pods: list[dict[str, Any]], expect: str) -> None:
    report = audit.api_usage([node()], pods)
    assert any(expect in p for p in report.overcommitted), report.overcommitted


def test_terminated_pods_do_not_count() -> None:
    pods = [pod("a", [(A, 600, 10)]), pod("b", [(A, 600, 10)], phase="Failed")]
    assert audit.api_usage([node()], pods).problems() == []


def test_other_findings() -> None:
    pods = [
        pod("nodev", None),
        pod("moved", [(B, 10, 0)], claim="elsewhere"),
        pod("phantom", [(B, 10, 0)], bound=None),
        pod("foreign", [("GPU-unknown", 10, 0)]),
    ]
    report = audit.api_usage([node(lock="2026-12-01T00:00:00Z,ns,x")], pods)
    assert report.bound_without_devices == [f"ns/nodev on {NODE}"]
    assert report.node_mismatch == [f"ns/moved: vgpu-node elsewhere, nodeName {NODE}"]
    assert [p.split(" ")[0] for p in report.phantom] == ["ns/phantom"]
    assert len(report.foreign_grants) == 2  # "moved" claims another node; "foreign" an unknown card
    assert report.locks_held == {NODE: "2026-12-01T00:00:00Z,ns,x"}
    assert len(report.problems()) == 6


def test_garbage_registration_needs_the_real_cards() -> None:
    nodes, pods = [node(register="garbage")], [pod("a", [(A, 600, 10)])]
    assert NODE in audit.api_usage(nodes, pods).invalid_nodes
    report = audit.api_usage(nodes, pods, {NODE: CARDS})
    assert report.problems() == [] and report.cards[A].memory_mib == 600


def test_extender_usage_is_compared_card_by_card() -> None:
    report = audit.api_usage([node()], [pod("a", [(A, 600, 10)])])
    labels = f'node="{NODE}",device_uuid="{A}",device_index="0",device_type="x",zone="vGPU"'
    other = f'node="{NODE}",device_uuid="{B}",device_index="1",device_type="x",zone="vGPU"'
    text = (
        "# TYPE hami_gpu_memory_allocated_bytes gauge\n"
        f"hami_gpu_memory_allocated_bytes{{{labels}}} {600 * audit.MiB}.0\n"
        f"hami_gpu_memory_allocated_bytes{{{other}}} 0.0\n"
        "# TYPE hami_gpu_core_allocated_ratio gauge\n"
        f"hami_gpu_core_allocated_ratio{{{labels}}} 10.0\n"
        f"hami_gpu_core_allocated_ratio{{{other}}} 0.0\n"
        "# TYPE hami_gpu_shared_count gauge\n"
        f"hami_gpu_shared_count{{{labels}}} 1.0\n"
        f"hami_gpu_shared_count{{{other}}} 0.0\n"
    )
    assert audit.compare_usage(report, audit.parse_metrics(text)) == []
    drifted = audit.parse_metrics(
        text.replace(f"hami_gpu_shared_count{{{labels}}} 1.0", f"hami_gpu_shared_count{{{labels}}} 2.0")
    )
    (mismatch,) = audit.compare_usage(report, drifted)
    assert A in mismatch and "extender" in mismatch
    missing = audit.parse_metrics("\n".join(line for line in text.splitlines() if B not in line) + "\n")
    assert any("missing" in m for m in audit.compare_usage(report, missing))
