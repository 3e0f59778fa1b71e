"""Renamed GPU resources scheduled end to end: a real kube-scheduler configured by ``gpuslice render
scheduler-config --resource-*-name`` calling a ``gpuslice serve`` started with the same names.

Its own control plane (the session cluster of conftest.py uses the default names), started once
for this module; nodes advertise nothing under the new names, so the pods fit only because every
renamed resource is ``ignoredByScheduler`` and gpuslice reads them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuslice.codec import keys, pod_devices
from gpuslice_dev import devcluster, nodesim
from gpuslice_dev.controlplane import ControlPlane
from tests.e2e.conftest import SCHEDULER, Cluster

pytestmark = pytest.mark.e2e

VGPU, VMEM, VPCT, VCORES, VPRIO = (
    "example.com/vgpu",
    "example.com/vmem",
    "example.com/vmem-percentage",
    "example.com/vcores",
    "example.com/vprio",
)
NAME_FLAGS = [
    f"--resource-count-name={VGPU}",
    f"--resource-memory-name={VMEM}",
    f"--resource-memory-percentage-name={VPCT}",
    f"--resource-core-name={VCORES}",
    f"--resource-priority-name={VPRIO}",
]
NODE = "renamed-a100-0"
SPEC: dict[str, Any] = {"model": "NVIDIA A100-SXM4-80GB", "count": 2, "memory_mib": 81920, "numa": [0, 0]}


@pytest.fixture(scope="module")
def renamed_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work: Path = tmp_path_factory.mktemp("renamed")
    cp = ControlPlane()
    cp.start()
    sim: devcluster.NodeSimThread | None = None
    ext: devcluster.Extender | None = None
    try:
        sim = devcluster.NodeSimThread(cp.kubeconfig, {NODE: SPEC}).start()
        ext = devcluster.Extender(cp.kubeconfig, work / "gpuslice.log", extra_args=["-v", "4", *NAME_FLAGS])
        ext.start()
        rendered = subprocess.run(  # noqa: S603 - our own CLI
            devcluster.gpuslice_command(
                "render",
                "scheduler-config",
                "--url",
                ext.url,
                "--kubeconfig",
                str(cp.kubeconfig),
                *NAME_FLAGS,
            ),
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        assert f"name: {VGPU}" in rendered and "nvidia.com/gpu" not in rendered
        cp.start_scheduler(rendered)
        yield Cluster(cp, ext)
    finally:
        if ext is not None:
            ext.stop()
        if sim is not None:
            sim.stop()
        cp.stop()


def grants(pod: dict[str, Any]) -> list[tuple[str, int, int]]:
    ann = pod["metadata"]["annotations"]
    return [
        (g.uuid, g.memory_mib, g.cores) for c in pod_devices.decode(ann[keys.DEVICES_ALLOCATED]) for g in c
    ]


def test_renamed_share_and_whole_card_are_scheduled(renamed_cluster: Cluster) -> None:
    c = renamed_cluster
    ns = c.namespace("renamed")
    cards = {d.uuid: d.memory_mib for d in nodesim.cards(NODE, **SPEC)}

    c.create_pod(ns, "share", {VGPU: "1", VMEM: "3000", VCORES: "30", VPRIO: "1"})
    pod = c.wait_bound(ns, "share")
    assert pod["spec"]["schedulerName"] == SCHEDULER and pod["spec"]["nodeName"] == NODE
    ((uuid, mem, cores),) = grants(pod)
    assert uuid in cards and (mem, cores) == (3000, 30)

    # A bare renamed card is an exclusive whole card: it avoids the shared one.
    c.create_pod(ns, "whole", {VGPU: "1"})
    pod = c.wait_bound(ns, "whole")
    ((other, mem, cores),) = grants(pod)
    assert other != uuid and (mem, cores) == (cards[other], 100)

    # A renamed percentage outside 0..100 (no webhook here): InvalidRequest, in a Warning event.
    c.create_pod(ns, "bad", {VGPU: "1", VPCT: "150"})
    event = c.wait_event(ns, "bad", "FilteringFailed")
    assert f"{VPCT} must be an integer in 0..100" in event["message"], event
    assert "spec.containers[0]" in event["message"], event
    assert not c.pod(ns, "bad")["spec"].get("nodeName")
