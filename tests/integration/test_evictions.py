"""kube.evictions against a real kube-apiserver: the Eviction API, PodDisruptionBudgets, node pods.

No controller-manager runs here, so a new PodDisruptionBudget's status is never computed and the
Eviction API refuses (429) every pod it selects until a test writes the status itself, as the
disruption controller would.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.kube import client as kclient
from gpuslice.kube import evictions
from gpuslice.policy import victims
from gpuslice_dev.controlplane import ControlPlane
from tests.integration import kubehelpers

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def bound_pod(
    cp: ControlPlane, ns: str, name: str, node: str, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    body = kubehelpers.pod_body(name, node_name=node)
    if labels:
        body["metadata"]["labels"] = labels
    status, obj = cp.api_request("POST", f"/api/v1/namespaces/{ns}/pods", body)
    assert status == 201, obj
    # Running, as a kubelet would report it: the Eviction API ignores budgets for Pending pods.
    obj["status"] = {"phase": "Running"}
    status, obj = cp.api_request("PUT", f"/api/v1/namespaces/{ns}/pods/{name}/status", obj)
    assert status == 200, obj
    return obj


def pod_or_none(cp: ControlPlane, ns: str, name: str) -> dict[str, Any] | None:
    status, obj = cp.api_request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
    return obj if status == 200 else None


def create_pdb(cp: ControlPlane, ns: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    body = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
    }
    status, obj = cp.api_request("POST", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", body)
    assert status == 201, obj
    return obj


def set_allowed(cp: ControlPlane, ns: str, pdb: dict[str, Any], allowed: int) -> None:
    """Write the budget's status as the disruption controller would."""
    name = pdb["metadata"]["name"]
    status, obj = cp.api_request("GET", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}")
    assert status == 200, obj
    obj["status"] = {
        "observedGeneration": obj["metadata"]["generation"],
        "disruptionsAllowed": allowed,
        "currentHealthy": 1 + allowed,
        "desiredHealthy": 1,
        "expectedPods": 1 + allowed,
    }
    status, obj = cp.api_request(
        "PUT", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}/status", obj
    )
    assert status == 200, obj


async def test_an_evicted_pod_is_being_deleted(
    kube: kclient.KubeClient, control_plane: ControlPlane, namespace: str, node_name: str
) -> None:
    kubehelpers.create_node(control_plane, node_name)
    pod = bound_pod(control_plane, namespace, "victim", node_name)
    result = await evictions.evict(kube, namespace, "victim", pod["metadata"]["uid"])
    assert result == evictions.Result(evictions.Outcome.EVICTED) and result.ok
    after = pod_or_none(control_plane, namespace, "victim")
    # Bound, with no kubelet: it stays Terminating (nodesim finishes such deletions in the e2e tier).
    assert after is None or after["metadata"].get("deletionTimestamp")


async def test_a_gone_pod_counts_as_gone(
    kube: kclient.KubeClient, control_plane: ControlPlane, namespace: str, node_name: str
) -> None:
    kubehelpers.create_node(control_plane, node_name)
    missing = await evictions.evict(kube, namespace, "nobody", "uid-x")
    assert missing.outcome is evictions.Outcome.GONE and missing.ok
    # (A pod whose UID no longer matches is answered 409 too, but only after the apiserver has
    # retried the conflicting delete for about 20 s; ``evictions.EVICT_TIMEOUT_S`` allows for it.)


async def test_a_budget_refuses_with_429_until_it_allows_a_disruption(
    kube: kclient.KubeClient, control_plane: ControlPlane, namespace: str, node_name: str
) -> None:
    kubehelpers.create_node(control_plane, node_name)
    pod = bound_pod(control_plane, namespace, "db-0", node_name, {"app": "db"})
    pdb = create_pdb(control_plane, namespace, "db", {"app": "db"})
    refused = await evictions.evict(kube, namespace, "db-0", pod["metadata"]["uid"])
    assert refused.outcome is evictions.Outcome.BLOCKED and not refused.ok
    assert "429" in refused.message
    still = pod_or_none(control_plane, namespace, "db-0")
    assert still is not None and not still["metadata"].get("deletionTimestamp")

    budgets = [b for b in await evictions.list_budgets(kube) if b.namespace == namespace]
    assert budgets == [
        victims.Budget(namespace, "db", victims.Selector(match_labels=(("app", "db"),)), allowed=0)
    ]
    (listed,) = await evictions.pods_on_node(kube, node_name)
    resident = victims.Resident(key=listed.key, labels=tuple(sorted(listed.metadata.labels.items())))
    assert budgets[0].selects(resident) and evictions.start_time(listed) > 0

    set_allowed(control_plane, namespace, pdb, 1)
    allowed = await evictions.evict(kube, namespace, "db-0", pod["metadata"]["uid"])
    assert allowed.outcome is evictions.Outcome.EVICTED, allowed
