"""HAMi parity through a real kube-scheduler: policy chains and mutex, scoring weights, quota per card."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.codec import keys
from tests.e2e.conftest import SCHEDULER, Cluster, card_uuid
from tests.e2e.test_scheduling import grants

pytestmark = pytest.mark.e2e

V100_MEM = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}


def test_policy_chains_schedule_as_in_hami(e2e_cluster: Cluster) -> None:
    ns = e2e_cluster.namespace("chain")
    chains = ["binpack,numa", "numa,spread", "mutex,spread", "mutex, topology-aware", "numa"]
    for k, value in enumerate(chains):
        e2e_cluster.create_pod(ns, f"c{k}", V100_MEM, {keys.GPU_SCHEDULER_POLICY: value})
    for k in range(len(chains)):
        assert grants(e2e_cluster.wait_bound(ns, f"c{k}"))
    for k in range(len(chains)):
        e2e_cluster.delete_pod(ns, f"c{k}")


def test_mutex_takes_the_idle_card_then_reports_the_conflict(e2e_cluster: Cluster) -> None:
    ns = e2e_cluster.namespace("mutex")
    on_v100 = {keys.USE_GPU_TYPE: "V100"}
    pinned = {**on_v100, keys.USE_GPU_UUID: card_uuid("e2e-v100-0", 0)}
    e2e_cluster.create_pod(ns, "sharer", V100_MEM, pinned)
    e2e_cluster.wait_bound(ns, "sharer")
    e2e_cluster.create_pod(ns, "m1", V100_MEM, {**on_v100, keys.GPU_SCHEDULER_POLICY: "mutex"})
    m1 = e2e_cluster.wait_bound(ns, "m1")
    assert [u for u, _, _ in grants(m1)] == [card_uuid("e2e-v100-0", 1)]
    # both V100 cards are in use now: a second mutex pod has nowhere to go
    e2e_cluster.create_pod(ns, "m2", V100_MEM, {**on_v100, keys.GPU_SCHEDULER_POLICY: "mutex"})
    event = e2e_cluster.wait_event(ns, "m2", "FailedScheduling")
    assert "ExclusiveConflict" in event["message"], event["message"]
    e2e_cluster.delete_pod(ns, "m1")
    m2 = e2e_cluster.wait_bound(ns, "m2", timeout=60)
    assert [u for u, _, _ in grants(m2)] == [card_uuid("e2e-v100-0", 1)]
    for name in ("sharer", "m2"):
        e2e_cluster.delete_pod(ns, name)


def test_invalid_scoring_weights_are_an_invalid_request_naming_the_annotation(e2e_cluster: Cluster) -> None:
    ns = e2e_cluster.namespace("weights")
    e2e_cluster.create_pod(ns, "bad", V100_MEM, {keys.DEVICE_SCORING_WEIGHTS: "slot=1,core=1"})
    e2e_cluster.create_pod(ns, "good", V100_MEM, {keys.DEVICE_SCORING_WEIGHTS: "slot=1,core=0,memory=3"})
    event = e2e_cluster.wait_event(ns, "bad", "FailedScheduling")
    assert "InvalidRequest" in event["message"], event["message"]
    warning = e2e_cluster.wait_event(ns, "bad", "FilteringFailed")
    assert keys.DEVICE_SCORING_WEIGHTS in warning["message"], warning["message"]
    e2e_cluster.wait_bound(ns, "good")
    for name in ("bad", "good"):
        e2e_cluster.delete_pod(ns, name)


def _pod_with_init(ns: str, name: str, init_mib: int, app_mib: int, cards: list[str]) -> dict[str, Any]:
    def container(cname: str, mib: int) -> dict[str, Any]:
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mib)}
        return {"name": cname, "image": "pause", "resources": {"limits": limits}}

    annotations = {keys.USE_GPU_UUID: ",".join(cards), keys.GPU_SCHEDULER_POLICY: "binpack"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {
            "schedulerName": SCHEDULER,
            "initContainers": [container("init", init_mib)],
            "containers": [container("app", app_mib)],
        },
    }


def test_quota_counts_what_the_pod_is_charged_card_by_card(e2e_cluster: Cluster) -> None:
    full, empty = card_uuid("e2e-a100-1", 2), card_uuid("e2e-a100-1", 3)
    other = e2e_cluster.namespace("filler")
    # leave 2920 MiB on one card: the 5000 MiB init container cannot use it, the app container can
    e2e_cluster.create_pod(
        other, "filler", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "79000"}, {keys.USE_GPU_UUID: full}
    )
    e2e_cluster.wait_bound(other, "filler")
    ns = e2e_cluster.namespace("quota-card")
    quota = {"metadata": {"name": "gpu"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "6000"}}}
    status, body = e2e_cluster.cp.api_request("POST", f"/api/v1/namespaces/{ns}/resourcequotas", quota)
    assert status == 201, body
    pod = _pod_with_init(ns, "p", 5000, 1500, [full, empty])
    status, body = e2e_cluster.cp.api_request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    assert status == 201, body
    init, app = grants(e2e_cluster.wait_bound(ns, "p"))
    # binpack alone puts the app container on the fuller card: 5000 + 1500 = 6500 of 6000; on the
    # init container's card the namespace is charged 5000
    assert init[0] == app[0] == empty
    e2e_cluster.delete_pod(ns, "p")
    e2e_cluster.delete_pod(other, "filler")


def test_a_native_sidecar_holds_its_card_beside_the_app_container(e2e_cluster: Cluster) -> None:
    ns = e2e_cluster.namespace("sidecar")
    card = card_uuid("e2e-v100-0", 0)  # 32768 MiB

    def pod(name: str, restart: str | None) -> dict[str, Any]:
        body = _pod_with_init(ns, name, 20000, 20000, [card])
        if restart:
            body["spec"]["initContainers"][0]["restartPolicy"] = restart
        return body

    # a sidecar keeps running beside the app: 40000 MiB never fits the one card allowed
    status, body = e2e_cluster.cp.api_request("POST", f"/api/v1/namespaces/{ns}/pods", pod("side", "Always"))
    assert status == 201, body
    event = e2e_cluster.wait_event(ns, "side", "FailedScheduling")
    assert "InsufficientGPUMemory" in event["message"], event["message"]
    e2e_cluster.delete_pod(ns, "side")
    # an init container finishes before the app starts: 20000 and 20000 share the card
    status, body = e2e_cluster.cp.api_request("POST", f"/api/v1/namespaces/{ns}/pods", pod("init", None))
    assert status == 201, body
    init, app = grants(e2e_cluster.wait_bound(ns, "init"))
    assert init[0] == app[0] == card
    e2e_cluster.delete_pod(ns, "init")
