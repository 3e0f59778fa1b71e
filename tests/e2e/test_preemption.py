"""GPU-aware preemption through a real kube-scheduler (docs/preemption.md).

Each test gets a node of its own, tainted so no other test's pod lands there, served by its own
``nodesim`` (which, like the kubelet, finishes the deletion of evicted pods). Pods name a
PriorityClass the test creates; the apiserver's ``Priority`` admission plugin resolves their
``spec.priority`` from it, as in a real cluster.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest

from gpuslice.codec import keys, pod_devices
from gpuslice_dev import devcluster, nodesim
from tests.e2e.conftest import A100, SCHEDULER, Cluster

pytestmark = pytest.mark.e2e

LABEL = "gpuslice.io/e2e-preemption"
LOW, MID, HIGH = 5, 50, 1000


class OwnNode(NamedTuple):
    name: str
    tag: str

    def card(self, i: int) -> str:
        return nodesim.card_uuids(self.name, 2)[i]


@pytest.fixture
def own_node(e2e_cluster: Cluster) -> Iterator[OwnNode]:
    """A 2-card A100 node only this test's pods tolerate, with its own device plugin stand-in."""
    tag = uuid.uuid4().hex[:6]
    name = f"e2e-preempt-{tag}"
    spec = {
        "model": A100,
        "count": 2,
        "memory_mib": 81920,
        "labels": {LABEL: tag},
        "taints": [{"key": LABEL, "value": tag, "effect": "NoSchedule"}],
    }
    sim = devcluster.NodeSimThread(e2e_cluster.cp.kubeconfig, {name: spec}).start()
    classes = []
    for level, value in (("low", LOW), ("mid", MID), ("high", HIGH)):
        cls = f"e2e-{level}-{tag}"
        e2e_cluster.cp.priority_class(cls, value)
        classes.append(cls)
    try:
        yield OwnNode(name, tag)
    finally:
        sim.stop()
        for cls in classes:
            e2e_cluster.cp.api_request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{cls}")
        e2e_cluster.cp.api_request("DELETE", f"/api/v1/nodes/{name}")


def create(
    cluster: Cluster,
    node: OwnNode,
    ns: str,
    name: str,
    priority: int,
    limits: dict[str, str],
    card: int | None = None,
    labels: dict[str, str] | None = None,
) -> None:
    level = {LOW: "low", MID: "mid", HIGH: "high"}[priority]
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels or {}}
    if card is not None:  # pinned, so the test knows which card each pod holds
        meta["annotations"] = {keys.USE_GPU_UUID: node.card(card)}
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "schedulerName": SCHEDULER,
            "priorityClassName": f"e2e-{level}-{node.tag}",
            "nodeSelector": {LABEL: node.tag},
            "tolerations": [{"key": LABEL, "operator": "Equal", "value": node.tag, "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "pause", "resources": {"limits": limits}}],
        },
    }
    status, obj = cluster.cp.api_request("POST", f"/api/v1/namespaces/{ns}/pods", body)
    assert status == 201, obj
    assert obj["spec"]["priority"] == priority  # resolved by the Priority admission plugin


HALF = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40960", "nvidia.com/gpucores": "50"}
WHOLE = {"nvidia.com/gpu": "1"}
FULL_NODE = (("a0", 0, LOW), ("b0", 0, LOW), ("c1", 1, LOW), ("d1", 1, MID))
"""Card 0: two low-priority pods; card 1: a low and a mid one. Each card is full."""


def fill(cluster: Cluster, node: OwnNode, ns: str, labels: dict[str, str] | None = None) -> None:
    for name, card, prio in FULL_NODE:
        create(cluster, node, ns, name, prio, HALF, card, labels)
    # Running (nodesim's Allocate done): the Eviction API ignores budgets for Pending pods.
    for name, _, _ in FULL_NODE:
        cluster.wait(functools.partial(running, cluster, ns, name), 60, f"{name} not running")


def running(cluster: Cluster, ns: str, name: str) -> bool:
    return bool(cluster.pod(ns, name)["status"].get("phase") == "Running")


def cards_of(pod: dict[str, Any]) -> list[str]:
    ann = pod["metadata"]["annotations"]
    return [g.uuid for c in pod_devices.decode(ann[keys.DEVICES_ALLOCATED]) for g in c]


def exists(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    status, obj = cluster.cp.api_request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
    return obj if status == 200 else None


def cleanup(cluster: Cluster, ns: str) -> None:
    for name in [n for n, _, _ in FULL_NODE] + ["hp"]:
        cluster.delete_pod(ns, name)


def test_the_cheapest_victims_on_one_card_make_room(e2e_cluster: Cluster, own_node: OwnNode) -> None:
    ns = e2e_cluster.namespace("preempt")
    fill(e2e_cluster, own_node, ns)
    create(e2e_cluster, own_node, ns, "hp", HIGH, WHOLE)
    pod = e2e_cluster.wait_bound(ns, "hp", timeout=90)
    assert pod["spec"]["nodeName"] == own_node.name
    assert cards_of(pod) == [own_node.card(0)]  # the card whose pods had the lowest priority
    # Exactly card 0's pods were evicted (and their deletion finished); card 1's stay untouched.
    e2e_cluster.wait(
        lambda: not exists(e2e_cluster, ns, "a0") and not exists(e2e_cluster, ns, "b0"), 30, "victims"
    )
    for name in ("c1", "d1"):
        kept = exists(e2e_cluster, ns, name)
        assert kept is not None and not kept["metadata"].get("deletionTimestamp"), name
    preempting = e2e_cluster.wait_event(ns, "hp", "Preempting")
    note = preempting["message"]
    assert own_node.name in note and own_node.card(0) in note
    assert f"{ns}/a0" in note and f"{ns}/b0" in note and f"{ns}/c1" not in note and f"{ns}/d1" not in note
    for victim in ("a0", "b0"):
        event = e2e_cluster.wait_event(ns, victim, "Preempted")
        assert f"{ns}/hp" in event["message"] and own_node.card(0) in event["message"]
    cleanup(e2e_cluster, ns)


def test_a_disruption_budget_forbids_it(e2e_cluster: Cluster, own_node: OwnNode) -> None:
    ns = e2e_cluster.namespace("preempt")
    fill(e2e_cluster, own_node, ns, labels={"app": "batch"})
    status, body = e2e_cluster.cp.api_request(
        "POST",
        f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "batch"},
            "spec": {"minAvailable": 4, "selector": {"matchLabels": {"app": "batch"}}},
        },
    )
    assert status == 201, body
    create(e2e_cluster, own_node, ns, "hp", HIGH, WHOLE)
    blocked = e2e_cluster.wait_event(ns, "hp", "PreemptionBlocked", timeout=60)
    assert blocked["type"] == "Warning"
    assert f"{ns}/batch" in blocked["message"] and "nothing evicted" in blocked["message"]
    for name, _, _ in FULL_NODE:
        kept = exists(e2e_cluster, ns, name)
        assert kept is not None and not kept["metadata"].get("deletionTimestamp"), name
    assert not e2e_cluster.pod(ns, "hp")["spec"].get("nodeName")
    assert not [e for e in e2e_cluster.events(ns, "hp") if e.get("reason") == "Preempting"]
    cleanup(e2e_cluster, ns)
