"""``gpuslice explain`` against a real kube-apiserver (no extender): the live-cluster path.

The nodes carry HAMi registrations (``nodesim.make_node``) like the e2e tier's A100 and V100 nodes,
and running pods carry the allocation annotations gpuslice writes at bind, so the one-shot
loader (``kube.liveview``) decodes the same state a running extender would. The nodes' models
share a token unique to the test, which the explained pods select (``nvidia.com/use-gputype``),
so nodes left by other tests on the session's apiserver cannot be the closest to fitting.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from gpuslice import explaincli
from gpuslice.codec import keys, pod_devices
from gpuslice.framework import explain
from gpuslice.kube import client as kclient
from gpuslice.model import allocations
from gpuslice_dev import nodesim
from gpuslice_dev.controlplane import ControlPlane
from tests.integration import kubehelpers as h
from tests.integration.conftest import unique

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def running_pod(cp: ControlPlane, ns: str, name: str, node: str, card: int, memory: int) -> None:
    """A pod bound to ``node`` holding ``memory`` MiB of one card, as gpuslice annotates it."""
    grant = allocations.DeviceGrant(uuid=nodesim.card_uuids(node, card + 1)[card], memory_mib=memory, cores=0)
    alloc = allocations.PodAllocation(node=node, containers=((grant,),))
    h.create_pod(
        cp, ns, name, gpus=1, node_name=node, annotations=pod_devices.bind_annotations(alloc, time.time())
    )


def pending_pod(cp: ControlPlane, ns: str, name: str, memory: int, token: str) -> None:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {keys.USE_GPU_TYPE: token}},
        "spec": {
            "schedulerName": "gpuslice-test-none",
            "containers": [
                {
                    "name": "c",
                    "image": "pause",
                    "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory)}},
                }
            ],
        },
    }
    status, obj = cp.api_request("POST", f"/api/v1/namespaces/{ns}/pods", body)
    assert status == 201, obj


async def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = await asyncio.to_thread(explaincli.run, argv)
    out, err = capsys.readouterr()
    return code, out, err


async def test_explain_reads_the_cluster_and_names_the_largest_free_card(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    token = f"T{uuid.uuid4().hex[:6]}"
    a100, v100 = unique("a100"), unique("v100")
    await nodesim.make_node(
        kube, a100, model=f"NVIDIA A100-{token}", count=4, memory_mib=81920, numa=[0, 0, 1, 1]
    )
    await nodesim.make_node(kube, v100, model=f"NVIDIA V100-{token}", count=2, memory_mib=32768, numa=[0, 0])
    try:
        for card, used in enumerate((60000, 60000, 50000, 60000)):
            running_pod(control_plane, namespace, f"run-{card}", a100, card, used)
        running_pod(control_plane, namespace, "run-v", v100, 0, 10000)
        pending_pod(control_plane, namespace, "big", 40000, token)

        argv = [f"{namespace}/big", "--kubeconfig", str(control_plane.kubeconfig)]
        code, out, err = await run_cli([*argv, "--json"], capsys)
        assert code == 0, err
        doc = explain.decode(out.encode())
        assert doc.feasible == ()
        assert doc.change == f"needs 40000 MiB per card, largest free is 31920 MiB on {a100} card 2"
        a = next(n for n in doc.nodes if n.name == a100)
        assert (a.code, a.reasons) == ("Unschedulable", ("InsufficientGPUMemory",))
        assert [(c.reason, c.memory_free_mib) for c in a.cards] == [
            ("InsufficientGPUMemory", 21920),
            ("InsufficientGPUMemory", 21920),
            ("InsufficientGPUMemory", 31920),
            ("InsufficientGPUMemory", 21920),
        ]
        v = next(n for n in doc.nodes if n.name == v100)
        assert v.code == "UnschedulableAndUnresolvable"  # 40000 MiB exceeds a 32768 MiB card
        assert [c.memory_free_mib for c in v.cards] == [22768, 32768]
        others = [n for n in doc.nodes if n.name not in (a100, v100) and n.cards]
        assert all(n.reasons == ("DeviceTypeMismatch",) for n in others)

        code, out, err = await run_cli([*argv, "--all"], capsys)
        assert code == 0, err
        assert f"{a100}: cards for container 0" in out
        assert f"largest free is 31920 MiB on {a100} card 2" in " ".join(out.split())
    finally:
        for name in (a100, v100):
            control_plane.api_request("DELETE", f"/api/v1/nodes/{name}")


async def test_explain_names_the_namespace_quota(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    token = f"T{uuid.uuid4().hex[:6]}"
    node = unique("a100")
    await nodesim.make_node(kube, node, model=f"NVIDIA A100-{token}", count=2, memory_mib=81920)
    try:
        status, body = control_plane.api_request(
            "POST",
            f"/api/v1/namespaces/{namespace}/resourcequotas",
            {"metadata": {"name": "gpu"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "16000"}}},
        )
        assert status == 201, body
        running_pod(control_plane, namespace, "holder", node, 0, 12000)
        pending_pod(control_plane, namespace, "more", 6000, token)
        code, out, err = await run_cli(
            [f"{namespace}/more", "--kubeconfig", str(control_plane.kubeconfig), "--json"], capsys
        )
        assert code == 0, err
        doc = explain.decode(out.encode())
        assert doc.change == "namespace quota: 12000 of 16000 MiB used, pod needs 6000"
        mine = next(n for n in doc.nodes if n.name == node)
        assert [c.reason for c in mine.cards] == ["QuotaExceeded", "QuotaExceeded"]
        assert doc.quota is not None and doc.quota.memory_limit_mib == 16000
    finally:
        control_plane.api_request("DELETE", f"/api/v1/nodes/{node}")


async def test_unknown_pod_and_unreachable_cluster_are_status_1(
    control_plane: ControlPlane, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = await run_cli(
        [f"{namespace}/ghost", "--kubeconfig", str(control_plane.kubeconfig)], capsys
    )
    assert code == 1 and f"pod {namespace}/ghost not found" in err
