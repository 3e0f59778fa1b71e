"""What a container on a real node gets: kube-scheduler -> gpuslice -> Binding -> kubelet -> the
device plugin's ``Allocate`` -> container Running, and inside it HAMi's environment equal to the
cards, memory and cores gpuslice decided (its ``hami.io/vgpu-devices-allocated`` annotation).

Each request kind is one pod; the container prints ``env`` and its ``/dev/nvidia*`` nodes, read
back through the apiserver (``pods/log``, served by the node's kubelet). Every test ends with the
card-by-card audit from the API (the ``cluster`` fixture).
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.codec import keys, pod_devices
from tests.node.conftest import NodeCluster, gpu_pod, registered_cards

pytestmark = pytest.mark.node

GPU = "nvidia.com/gpu"
MEM = "nvidia.com/gpumem"
PCT = "nvidia.com/gpumem-percentage"
CORES = "nvidia.com/gpucores"

SHOW = "env; echo --env-end--; ls /dev | grep nvidia; echo --dev-end--"
RUN = SHOW + "; trap 'exit 0' TERM; while true; do sleep 1; done"


def devices_section(log: str) -> set[str]:
    lines = log.split("--env-end--", 1)[-1].split("--dev-end--", 1)[0].split()
    return set(lines)


def check_container(
    cluster: NodeCluster, ns: str, pod: dict[str, Any], container: str, position: int
) -> list[tuple[str, int, int]]:
    """Assert the container's environment is what gpuslice decided; returns its grants."""
    name = pod["metadata"]["name"]
    node = pod["spec"]["nodeName"]
    decided = pod_devices.decode(pod["metadata"]["annotations"][keys.DEVICES_ALLOCATED])[position]
    assert decided, f"{name}/{container}: no cards decided at position {position}"
    env = cluster.env(ns, name, container)
    uuids = [grant.uuid for grant in decided]
    assert env.get("NVIDIA_VISIBLE_DEVICES") == ",".join(uuids), env
    for i, grant in enumerate(decided):
        assert env.get(f"CUDA_DEVICE_MEMORY_LIMIT_{i}") == f"{grant.memory_mib}m", (i, env)
    assert f"CUDA_DEVICE_MEMORY_LIMIT_{len(decided)}" not in env
    assert env.get("CUDA_DEVICE_SM_LIMIT") == str(decided[0].cores), env
    assert env.get("CUDA_DEVICE_MEMORY_SHARED_CACHE"), env
    # The cards are the node's, and their device nodes are in the container.
    cards = {card["id"]: card for card in registered_cards(cluster, node)}
    present = devices_section(cluster.log(ns, name, container))
    for grant in decided:
        assert grant.uuid in cards, f"{grant.uuid} is not a card of {node}"
        assert f"nvidia{cards[grant.uuid].get('index', 0)}" in present, (grant.uuid, present)
    assert "nvidiactl" in present, present
    return [(g.uuid, g.memory_mib, g.cores) for g in decided]


def card_memory(cluster: NodeCluster, node: str, uuid: str) -> int:
    return int(next(c for c in registered_cards(cluster, node) if c["id"] == uuid)["devmem"])


def run_one(cluster: NodeCluster, ns: str, name: str, limits: dict[str, str]) -> dict[str, Any]:
    cluster.create(ns, gpu_pod(name, [{"name": "main", "limits": limits, "command": RUN}]))
    pod = cluster.wait_running(ns, name)
    assert pod["metadata"]["annotations"].get(keys.BIND_PHASE) == keys.BIND_PHASE_SUCCESS
    return pod


def test_fraction_by_mib(cluster: NodeCluster, ns: str) -> None:
    pod = run_one(cluster, ns, "mib", {GPU: "1", MEM: "3000"})
    [(_, memory, cores)] = check_container(cluster, ns, pod, "main", 0)
    assert (memory, cores) == (3000, 0)


def test_fraction_by_percentage(cluster: NodeCluster, ns: str) -> None:
    pod = run_one(cluster, ns, "pct", {GPU: "1", PCT: "25"})
    [(uuid, memory, _)] = check_container(cluster, ns, pod, "main", 0)
    assert memory == card_memory(cluster, pod["spec"]["nodeName"], uuid) * 25 // 100


def test_cores(cluster: NodeCluster, ns: str) -> None:
    pod = run_one(cluster, ns, "cores", {GPU: "1", MEM: "2000", CORES: "30"})
    [(_, memory, cores)] = check_container(cluster, ns, pod, "main", 0)
    assert (memory, cores) == (2000, 30)


def test_whole_card(cluster: NodeCluster, ns: str) -> None:
    pod = run_one(cluster, ns, "whole", {GPU: "1"})
    [(uuid, memory, cores)] = check_container(cluster, ns, pod, "main", 0)
    assert memory == card_memory(cluster, pod["spec"]["nodeName"], uuid)
    assert cores == 100


def test_several_cards_per_container(cluster: NodeCluster, ns: str) -> None:
    pod = run_one(cluster, ns, "multi", {GPU: "2", MEM: "1000"})
    grants = check_container(cluster, ns, pod, "main", 0)
    assert len({uuid for uuid, _, _ in grants}) == 2
    assert all(memory == 1000 for _, memory, _ in grants)


def test_several_containers(cluster: NodeCluster, ns: str) -> None:
    spec = gpu_pod(
        "two",
        [
            {"name": "a", "limits": {GPU: "1", MEM: "1000"}, "command": RUN},
            {"name": "b", "limits": {GPU: "1", MEM: "2000", CORES: "20"}, "command": RUN},
            {"name": "plain", "command": RUN},
        ],
    )
    cluster.create(ns, spec)
    pod = cluster.wait_running(ns, "two")
    assert check_container(cluster, ns, pod, "a", 0)[0][1:] == (1000, 0)
    assert check_container(cluster, ns, pod, "b", 1)[0][1:] == (2000, 20)
    assert "NVIDIA_VISIBLE_DEVICES" not in cluster.env(ns, "two", "plain")


def test_init_container_runs_and_its_peak_is_released(cluster: NodeCluster, ns: str) -> None:
    spec = gpu_pod(
        "init",
        [{"name": "app", "limits": {GPU: "1", MEM: "1000"}, "command": RUN}],
        init=[{"name": "prep", "limits": {GPU: "1", MEM: "4000"}, "command": SHOW}],
    )
    cluster.create(ns, spec)
    pod = cluster.wait_running(ns, "init")
    init_status = pod["status"]["initContainerStatuses"][0]
    assert init_status["state"].get("terminated", {}).get("exitCode") == 0, init_status
    assert check_container(cluster, ns, pod, "prep", 0)[0][1] == 4000
    assert check_container(cluster, ns, pod, "app", 1)[0][1] == 1000
    # Once the init container has exited, the pod holds only its app container's 1000 MiB.
    report = cluster.audit()
    held = sum(use.memory_mib for use in report.cards.values() if any(ns in p for p in use.pods))
    assert held == 1000, {u: (c.memory_mib, c.pods) for u, c in report.cards.items() if c.pods}


def test_native_sidecar(cluster: NodeCluster, ns: str) -> None:
    spec = gpu_pod(
        "sidecar",
        [{"name": "app", "limits": {GPU: "1", MEM: "1000"}, "command": RUN}],
        init=[{"name": "side", "limits": {GPU: "1", MEM: "1500"}, "command": RUN, "restartPolicy": "Always"}],
    )
    cluster.create(ns, spec)
    pod = cluster.wait_running(ns, "sidecar")
    side = pod["status"]["initContainerStatuses"][0]
    assert "running" in side["state"], side
    assert check_container(cluster, ns, pod, "side", 0)[0][1] == 1500
    assert check_container(cluster, ns, pod, "app", 1)[0][1] == 1000
    # The sidecar runs for the pod's life: both stay charged.
    report = cluster.audit()
    held = sum(use.memory_mib for use in report.cards.values() if any(ns in p for p in use.pods))
    assert held == 2500, {u: (c.memory_mib, c.pods) for u, c in report.cards.items() if c.pods}
