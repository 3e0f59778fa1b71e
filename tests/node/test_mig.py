"""MIG on a real node: kube-scheduler -> gpuslice -> Binding -> kubelet -> the device plugin's
``Allocate`` realises the instances -> the container runs and sees its MIG devices.

The node joins the session's cluster for this module only: ``real-mig``, the fake NVML library
serving the agent's ``a100-80g-4-mixed`` machine (cards 0 and 1 in MIG mode with the A100-80GB
GPU-instance profiles and placements, cards 2 and 3 shared by HAMi-core). Its device plugin
reads those profiles through NVML and registers them (``migProfiles``) as HAMi's plugin does.

The MIG node always runs gpuslice's own device plugin, even when ``GPUSLICE_NODE_PLUGIN`` names
another: creating GPU and compute instances needs NVML calls the fake library does not serve
(``nvmlDeviceCreateGpuInstanceWithPlacement``), so HAMi's plugin could not ``Allocate`` here. Ours
plays that part as HAMi's ``annotateMigRuntimeInfo`` does: it writes each instance's MIG UUID and
GPU/compute-instance ids into ``hami.io/vgpu-mig-allocations`` and hands the container
``NVIDIA_VISIBLE_DEVICES`` naming those MIG UUIDs, without HAMi-core.

Every test ends with the card-by-card audit from the API (``cluster`` and ``ns`` fixtures), which
checks MIG placements too: legal for their profile, never overlapping on a card.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuslice.codec import keys, mig_allocations, pod_devices
from gpuslice_dev import nodeplugins, realnode
from tests.node.conftest import NodeCluster, gpu_pod, registered_cards

pytestmark = pytest.mark.node

NODE = "real-mig"
MACHINE = "a100-80g-4-mixed"
GPU = "nvidia.com/gpu"
MEM = "nvidia.com/gpumem"
MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
SHOW = "env; echo --env-end--; ls /dev | grep nvidia; echo --dev-end--"
RUN = SHOW + "; trap 'exit 0' TERM; while true; do sleep 1; done"


@pytest.fixture(scope="module")
def mig_node(node_cluster: NodeCluster) -> Iterator[realnode.RealNode]:
    """``real-mig`` started beside the session's nodes; stopped and its Node deleted afterwards."""
    root = Path("/tmp") / f"gsn-mig-{uuid.uuid4().hex[:6]}"
    node = realnode.RealNode(
        node_cluster.cp,
        NODE,
        62,
        root / NODE,
        plugin=nodeplugins.gpuslice_plugin("nvml"),
        machine=MACHINE,
        labels={"gpu": "on"},
    )
    realnode.start_all([node])
    node_cluster.nodes[NODE] = node
    try:
        yield node
    finally:
        node_cluster.nodes.pop(NODE, None)
        node.stop()
        node_cluster.cp.api_request("DELETE", f"/api/v1/nodes/{NODE}")
        if root.exists() and not any(root.iterdir()):
            root.rmdir()


def cards(cluster: NodeCluster) -> dict[str, dict[str, Any]]:
    return {card["id"]: card for card in registered_cards(cluster, NODE)}


def profile_memory(card: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: int(p["memoryMB"]) for p in card.get("migProfiles") or []}


def mig_pod(name: str, limits: dict[str, str], mode: str) -> dict[str, Any]:
    return gpu_pod(
        name,
        [{"name": "main", "limits": limits, "command": RUN}],
        node=NODE,
        annotations={keys.VGPU_MODE: mode},
    )


def realised(pod: dict[str, Any]) -> list[mig_allocations.Record]:
    return mig_allocations.decode(pod["metadata"]["annotations"].get(keys.MIG_ALLOCATIONS, ""))


def device_nodes(cluster: NodeCluster, ns: str, name: str) -> set[str]:
    log = cluster.log(ns, name, "main")
    return set(log.split("--env-end--", 1)[-1].split("--dev-end--", 1)[0].split())


def check_instances(
    cluster: NodeCluster, ns: str, pod: dict[str, Any], count: int, at_least_mib: int
) -> None:
    """The pod's instances: realised by the plugin, legal, and what its container sees."""
    name = pod["metadata"]["name"]
    registered = cards(cluster)
    records = realised(pod)
    grants = pod_devices.decode(pod["metadata"]["annotations"][keys.DEVICES_ALLOCATED])[0]
    assert len(records) == len(grants) == count, (records, grants)
    assert [(r.container, r.device) for r in records] == [(0, d) for d in range(count)]
    for record, grant in zip(records, grants, strict=True):
        card = registered[record.gpu_uuid]
        assert card.get("mode") == "mig" and grant.uuid == record.gpu_uuid, (card, grant)
        memory = profile_memory(card)[record.profile]
        assert memory >= at_least_mib and grant.memory_mib == memory, (record, grant)
        placements = next(p["placements"] for p in card["migProfiles"] if p["name"] == record.profile)
        assert {"start": record.placement.start, "size": record.placement.size} in placements, record
        assert MIG_UUID.match(record.mig_uuid), record
        assert record.gpu_instance is not None and record.compute_instance is not None, record
    env = cluster.env(ns, name, "main")
    assert env.get("NVIDIA_VISIBLE_DEVICES") == ",".join(r.mig_uuid for r in records), env
    assert not any(key.startswith("CUDA_DEVICE_MEMORY_LIMIT") for key in env), env  # no HAMi-core
    present = device_nodes(cluster, ns, name)
    assert "nvidiactl" in present, present
    for record in records:
        assert f"nvidia{registered[record.gpu_uuid].get('index', 0)}" in present, (record, present)


def test_node_registers_mig_and_shared_cards(cluster: NodeCluster, mig_node: realnode.RealNode) -> None:
    modes = sorted(str(card.get("mode")) for card in cards(cluster).values())
    assert modes == ["hami-core", "hami-core", "mig", "mig"], modes
    for card in cards(cluster).values():
        if card.get("mode") == "mig":
            assert {"1g.10gb", "3g.40gb", "7g.80gb"} <= set(profile_memory(card)), card


def test_instances_and_shares_run_side_by_side(
    cluster: NodeCluster, mig_node: realnode.RealNode, ns: str
) -> None:
    cluster.create(ns, mig_pod("one", {GPU: "1", MEM: "15000"}, "mig"))
    cluster.create(ns, mig_pod("pair", {GPU: "2", MEM: "9000"}, "mig"))
    cluster.create(ns, mig_pod("shared", {GPU: "1", MEM: "3000"}, "hami-core"))
    one = cluster.wait_running(ns, "one")
    pair = cluster.wait_running(ns, "pair")
    shared = cluster.wait_running(ns, "shared")
    check_instances(cluster, ns, one, 1, 15000)
    check_instances(cluster, ns, pair, 2, 9000)
    # The hami-core pod shares a plain card through HAMi-core, with no instance.
    [grant] = pod_devices.decode(shared["metadata"]["annotations"][keys.DEVICES_ALLOCATED])[0]
    assert cards(cluster)[grant.uuid].get("mode") == "hami-core", grant
    assert realised(shared) == []
    env = cluster.env(ns, "shared", "main")
    assert env.get("NVIDIA_VISIBLE_DEVICES") == grant.uuid, env
    assert env.get("CUDA_DEVICE_MEMORY_LIMIT_0") == "3000m", env


def test_a_freed_card_takes_the_waiting_whole_instance(
    cluster: NodeCluster, mig_node: realnode.RealNode, ns: str
) -> None:
    whole = {GPU: "1", MEM: "80000"}  # only 7g.80gb holds it
    cluster.create(ns, mig_pod("big-a", whole, "mig"))
    cluster.create(ns, mig_pod("big-b", whole, "mig"))
    a = cluster.wait_running(ns, "big-a")
    b = cluster.wait_running(ns, "big-b")
    check_instances(cluster, ns, a, 1, 80000)
    check_instances(cluster, ns, b, 1, 80000)
    assert realised(a)[0].gpu_uuid != realised(b)[0].gpu_uuid
    # Both MIG cards are whole-held: a third waits, though the node's shared cards have room.
    cluster.create(ns, mig_pod("big-c", whole, "mig"))

    def refused() -> str:
        status, body = cluster.cp.api_request(
            "GET", f"/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name=big-c"
        )
        assert status == 200, body
        return next(
            (e["message"] for e in body.get("items", []) if e.get("reason") == "FailedScheduling"), ""
        )

    message = cluster.wait(refused, 60, "big-c was never refused")
    # The MIG cards have no memory left (HAMi checks memory before placements); the shared cards
    # are not what a ``mig`` pod may take.
    assert "InsufficientGPUMemory" in message and "DeviceTypeMismatch" in message, message
    assert not (cluster.pod(ns, "big-c") or {}).get("spec", {}).get("nodeName")
    # Once big-a is gone, big-c gets its card and the same whole placement.
    cluster.delete(ns, "big-a", grace=None)
    cluster.wait_gone(ns, "big-a")
    c = cluster.wait_running(ns, "big-c", timeout=120)
    check_instances(cluster, ns, c, 1, 80000)
    assert realised(c)[0].gpu_uuid == realised(a)[0].gpu_uuid
    assert realised(c)[0].placement == realised(a)[0].placement
