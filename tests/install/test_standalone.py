"""Standalone mode (``scheduler.enabled=false``: gpuslice alone behind a Service, holding its own
Lease) on real nodes: a ``helm upgrade --wait`` finishes and a node drain goes through.

Both used to hang: only the leader was Ready, so the rolling update's surge pod (a follower) never
became Ready and the PodDisruptionBudget never allowed an eviction. Now every synced replica is
Ready and the Service reaches the leader alone through the label the leader puts on its own pod.
The drain is done as ``kubectl drain`` does it: cordon, then the Eviction API for each pod that is
not a DaemonSet's, retried while a disruption budget refuses (429).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.install.conftest import CHART, NAMESPACE, ChartCluster, helm_release_gone

pytestmark = [pytest.mark.install, pytest.mark.timeout(600)]

RELEASE = "gsa"
STANDALONE_FULLNAME = f"{RELEASE}-gpuslice"
LEADER_LABEL = "gpuslice.io/leader"


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def scheduler_pods(cluster: ChartCluster) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=scheduler"
    return [
        p
        for p in cluster.items(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={selector}")
        if not p["metadata"].get("deletionTimestamp")
    ]


def service_endpoints(cluster: ChartCluster, service: str) -> set[str]:
    slices = cluster.items(
        f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices?labelSelector=kubernetes.io/service-name={service}"
    )
    return {
        address
        for s in slices
        for e in s.get("endpoints") or []
        if e.get("conditions", {}).get("ready")
        for address in e["addresses"]
    }


def leader(cluster: ChartCluster) -> dict[str, Any] | None:
    holder = cluster.lease_holder(STANDALONE_FULLNAME)
    for pod in scheduler_pods(cluster):
        if holder and holder.startswith(pod["metadata"]["name"]):
            return pod
    return None


def check_routed_to_leader(cluster: ChartCluster) -> dict[str, Any]:
    """Every replica Ready; the extender Service's endpoints are the leader's pod alone."""

    def routed() -> dict[str, Any] | None:
        pods = scheduler_pods(cluster)
        current = leader(cluster)
        if current is None or len(pods) != 2 or not all(ready(p) for p in pods):
            return None
        labelled = [
            p["metadata"]["name"] for p in pods if p["metadata"].get("labels", {}).get(LEADER_LABEL) == "true"
        ]
        if labelled != [current["metadata"]["name"]]:
            return None
        if service_endpoints(cluster, STANDALONE_FULLNAME) != {current["status"]["podIP"]}:
            return None
        return current

    found: dict[str, Any] = cluster.wait(
        routed, 120, "the standalone Service does not reach the leader alone"
    )
    return found


def evict_all(cluster: ChartCluster, node: str, timeout: float = 180.0) -> list[str]:
    """Drain ``node`` as kubectl does; the names evicted. Fails if a pod cannot be evicted in time."""
    status, body = cluster.cp.api_request("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}})
    assert status == 200, body
    evicted: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        pods = [
            p
            for p in cluster.items(f"/api/v1/pods?fieldSelector=spec.nodeName={node}")
            if not any(o.get("kind") == "DaemonSet" for o in p["metadata"].get("ownerReferences") or [])
            and not p["metadata"].get("deletionTimestamp")
        ]
        if not pods:
            return evicted
        for pod in pods:
            meta = pod["metadata"]
            eviction = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            }
            status, body = cluster.cp.api_request(
                "POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/eviction", eviction
            )
            if status in (200, 201):
                evicted.append(meta["name"])
            elif status != 429 and status != 404:
                raise AssertionError(f"eviction of {meta['name']}: {status} {body}")
        assert time.monotonic() < deadline, (
            f"drain of {node} blocked: {[p['metadata']['name'] for p in pods]}"
        )
        time.sleep(2)


@pytest.fixture(scope="module")
def standalone(chart_cluster: ChartCluster) -> Iterator[ChartCluster]:
    cluster = chart_cluster
    started = time.monotonic()
    cluster.helm(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
        "--set", "scheduler.enabled=false", "--set", "webhook.enabled=false", "--set", "agent.enabled=false",
        "--wait", "--timeout", "6m",
    )  # fmt: skip
    print(f"standalone helm install --wait: {time.monotonic() - started:.1f} s")
    yield cluster
    for node in cluster.nodes:
        cluster.cp.api_request("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": False}})
    if not helm_release_gone(cluster, RELEASE):
        cluster.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", check=False)


def test_standalone_upgrade_finishes_and_the_service_follows_the_leader(standalone: ChartCluster) -> None:
    cluster = standalone
    first = check_routed_to_leader(cluster)
    before = {p["metadata"]["name"] for p in scheduler_pods(cluster)}
    started = time.monotonic()
    cluster.helm(
        "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values",
        "--set", "extender.verbosity=3", "--wait", "--timeout", "5m",
    )  # fmt: skip
    print(f"standalone helm upgrade --wait: {time.monotonic() - started:.1f} s")
    assert before.isdisjoint(p["metadata"]["name"] for p in scheduler_pods(cluster)), "the pods did not roll"
    second = check_routed_to_leader(cluster)
    assert second["metadata"]["name"] != first["metadata"]["name"]


def test_standalone_node_drain_goes_through(standalone: ChartCluster) -> None:
    cluster = standalone
    current = check_routed_to_leader(cluster)
    node = current["spec"]["nodeName"]
    started = time.monotonic()
    evicted = evict_all(cluster, node)
    print(f"drain of {node}: evicted {evicted} in {time.monotonic() - started:.1f} s")
    assert current["metadata"]["name"] in evicted
    cluster.cp.api_request("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": False}})
    # The replacements run elsewhere, and the Service follows the new leader.
    check_routed_to_leader(cluster)
