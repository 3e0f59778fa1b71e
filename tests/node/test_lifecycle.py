"""Real-node lifecycle: the node lock released by the device plugin's ``Allocate``, preemption with
real graceful termination, and restarts of kubelet, the device plugin, containerd and gpuslice
(SIGKILL between the node lock and the Binding) with pods running.

Every test ends with the card-by-card audit from the API (the ``cluster`` fixture): no card
over-committed, no lock held, no phantom reservation.
"""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.codec import keys
from tests.chaos import audit
from tests.node.conftest import NodeCluster, gpu_pod, registered_cards

pytestmark = pytest.mark.node

GPU = "nvidia.com/gpu"
MEM = "nvidia.com/gpumem"
SMALL = {GPU: "1", MEM: "1000"}
LOCK_RELEASES = {
    "expired_lock_released",
    "dangling_lock_released",
    "lock_of_pod_bound_elsewhere_released",
    "allocate_timeout_lock_released",
    "answered_lock_released",
}


def recovery_lock_releases(cluster: NodeCluster) -> float:
    text = audit.scrape(cluster.ext.probe_url)
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == "gpuslice_recovery_actions":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("action") in LOCK_RELEASES:
                    total += sample.value
    return total


def node_lock(cluster: NodeCluster, node: str) -> str | None:
    obj = cluster.nodes[node].node_object() or {}
    annotations: dict[str, str] = obj.get("metadata", {}).get("annotations", {})  # type: ignore[attr-defined]
    return annotations.get(keys.NODE_LOCK)


def start_pods(cluster: NodeCluster, ns: str, names: list[str], node: str, limits: dict[str, str]) -> None:
    for name in names:
        cluster.create(ns, gpu_pod(name, [{"name": "main", "limits": limits}], node=node))
    for name in names:
        cluster.wait_running(ns, name)


def test_lock_released_by_allocate_not_by_recovery(cluster: NodeCluster, ns: str) -> None:
    before = recovery_lock_releases(cluster)
    names = [f"burst-{i}" for i in range(6)]
    start_pods(cluster, ns, names, "real-0", SMALL)
    for name in names:
        pod = cluster.pod(ns, name)
        assert pod is not None
        assert pod["metadata"]["annotations"][keys.BIND_PHASE] == keys.BIND_PHASE_SUCCESS
        # The plugin consumed every entry it was handed.
        assert "NVIDIA" not in pod["metadata"]["annotations"].get(keys.DEVICES_TO_ALLOCATE, "")
    assert node_lock(cluster, "real-0") is None
    assert recovery_lock_releases(cluster) == before, "gpuslice's recovery released a node lock"


def test_preemption_waits_for_graceful_termination(cluster: NodeCluster, ns: str) -> None:
    cluster.cp.priority_class("node-low", 10)
    cluster.cp.priority_class("node-high", 1000)
    target = "real-1"
    cards = len(registered_cards(cluster, target))
    # Victims take SIGTERM, log it, then take 4 s more to exit (grace 20 s).
    linger = (
        "env; echo --env-end--; trap 'echo got-term; sleep 4; echo bye; exit 0' TERM; "
        "while true; do sleep 1; done"
    )
    victims = [f"low-{i}" for i in range(cards)]
    for name in victims:
        cluster.create(
            ns,
            gpu_pod(
                name,
                [{"name": "main", "limits": {GPU: "1"}, "command": linger}],
                node=target,
                grace=20,
                priority_class="node-low",
            ),
        )
    for name in victims:
        cluster.wait_running(ns, name)
    cluster.create(
        ns, gpu_pod("high", [{"name": "main", "limits": {GPU: "1"}}], node=target, priority_class="node-high")
    )
    t0 = time.monotonic()

    def terminating() -> list[str]:
        out = []
        for name in victims:
            pod = cluster.pod(ns, name)
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                out.append(name)
        return out

    chosen = cluster.wait(terminating, 60, "no victim preempted")

    def stopped() -> bool:
        # A deleted pod holds its cards until its containers have stopped: kubelet then reports
        # a terminal phase, and deletes the object right after.
        return all(cluster.phase(ns, name) in ("", "Succeeded", "Failed") for name in chosen)

    # While a victim is terminating (its 4 s TERM handler runs), the preemptor must not bind.
    gone_at: float | None = None
    bound_at: float | None = None
    while time.monotonic() - t0 < 90 and bound_at is None:
        if gone_at is None and stopped():
            gone_at = time.monotonic()
        high = cluster.pod(ns, "high")
        if high is not None and high["spec"].get("nodeName"):
            bound_at = time.monotonic()
            if gone_at is None and stopped():
                gone_at = bound_at
        time.sleep(0.1)
    assert bound_at is not None, f"the preemptor never bound\n{cluster.diagnostics()}"
    assert gone_at is not None and gone_at <= bound_at, "the preemptor bound before its victims were gone"
    assert bound_at - t0 >= 4.0, f"bound {bound_at - t0:.1f} s after creation: the victims' grace was cut"
    cluster.wait_running(ns, "high")


def test_kubelet_restart_with_pods_running(cluster: NodeCluster, ns: str) -> None:
    node = cluster.nodes["real-0"]
    start_pods(cluster, ns, ["before-0", "before-1"], "real-0", SMALL)
    ids = {}
    for name in ("before-0", "before-1"):
        pod = cluster.pod(ns, name)
        assert pod is not None
        ids[name] = pod["status"]["containerStatuses"][0]["containerID"]
    node.restart_kubelet()
    start_pods(cluster, ns, ["after"], "real-0", SMALL)
    for name, container_id in ids.items():
        pod = cluster.wait_running(ns, name)
        status = pod["status"]["containerStatuses"][0]
        assert status["containerID"] == container_id and status["restartCount"] == 0, status


def test_device_plugin_restart_reregisters(cluster: NodeCluster, ns: str) -> None:
    node = cluster.nodes["real-1"]
    start_pods(cluster, ns, ["before"], "real-1", SMALL)
    node.restart_plugin()
    start_pods(cluster, ns, ["after"], "real-1", SMALL)
    assert cluster.wait_running(ns, "before")["status"]["containerStatuses"][0]["restartCount"] == 0


def test_containerd_restart_with_pods_running(cluster: NodeCluster, ns: str) -> None:
    node = cluster.nodes["real-0"]
    start_pods(cluster, ns, ["before"], "real-0", SMALL)
    node.restart_containerd()
    start_pods(cluster, ns, ["after"], "real-0", SMALL)
    assert cluster.wait_running(ns, "before")["status"]["containerStatuses"][0]["restartCount"] == 0


def test_extender_killed_between_lock_and_binding(cluster: NodeCluster, ns: str) -> None:
    target = "real-1"
    ext = cluster.ext
    ext.stop()
    ext.env = {"GPUSLICE_FAILPOINTS": "bind-after-lock=exit"}
    try:
        ext.start()
        cluster.create(ns, gpu_pod("victim", [{"name": "main", "limits": SMALL}], node=target))
        code = ext.wait_exit(60)
        assert code == 137, f"the extender did not exit at the failpoint (status {code})"
        lock = node_lock(cluster, target)
        assert lock is not None and lock.endswith(f",{ns},victim"), lock
    finally:
        ext.env = {}
        if not ext.running():
            ext.start()
    # kube-scheduler retries the pod; gpuslice, restarted, binds it; the real plugin allocates it.
    pod = cluster.wait_running(ns, "victim", timeout=60)
    assert pod["spec"]["nodeName"] == target
    assert pod["metadata"]["annotations"][keys.BIND_PHASE] == keys.BIND_PHASE_SUCCESS
    assert node_lock(cluster, target) is None
