"""Pods scheduled by a real kube-scheduler through gpuslice (see conftest.py)."""

from __future__ import annotations

import collections
import pathlib
from typing import Any

import pytest
import yaml

from gpuslice.codec import keys, pod_devices
from tests.e2e.conftest import NODES, SCHEDULER, Cluster, card_uuid, inventory

pytestmark = pytest.mark.e2e

REPO = pathlib.Path(__file__).resolve().parents[2]


def grants(pod: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(uuid, MiB, cores) of every card the pod's annotations give it."""
    ann = pod["metadata"]["annotations"]
    return [
        (g.uuid, g.memory_mib, g.cores) for c in pod_devices.decode(ann[keys.DEVICES_ALLOCATED]) for g in c
    ]


def assert_contract(pod: dict[str, Any]) -> None:
    ann = pod["metadata"]["annotations"]
    node = pod["spec"]["nodeName"]
    assert ann[keys.VGPU_NODE] == node
    assert pod["metadata"]["labels"][keys.VGPU_NODE] == node
    assert ann[keys.BIND_PHASE] in (keys.BIND_PHASE_ALLOCATING, keys.BIND_PHASE_SUCCESS)
    assert ann[keys.BIND_TIME].isdigit() and ann[keys.VGPU_TIME].isdigit()
    node_cards = {d.uuid for d in inventory(node)}
    assert {u for u, _, _ in grants(pod)} <= node_cards


def test_whole_gpu(e2e_cluster: Cluster) -> None:
    ns = e2e_cluster.namespace()
    e2e_cluster.create_pod(ns, "whole", {"nvidia.com/gpu": "1"})
    pod = e2e_cluster.wait_labelled(ns, "whole")
    assert_contract(pod)
    ((uuid, mem, cores),) = grants(pod)
    # A bare nvidia.com/gpu is a whole, exclusive card: all its memory, 100 cores.
    card = next(d for d in inventory(pod["spec"]["nodeName"]) if d.uuid == uuid)
    assert (mem, cores) == (card.memory_mib, 100)
    # gpuslice's own event (events.k8s.io, read back through the core view).
    event = e2e_cluster.wait_event(ns, "whole", "GPUAllocated")
    assert f"Device: {uuid} ({card.memory_mib}MB/100cores)" in event["message"]
    assert "nodes feasible" in event["message"] and pod["spec"]["nodeName"] in event["message"]
    e2e_cluster.delete_pod(ns, "whole")


@pytest.mark.parametrize(
    ("limits", "expect_mem", "expect_cores"),
    [
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "30"}, 10000, 30),
        # 25 % of an 80 GiB A100 = 81920 * 25 // 100 = 20480 MiB (V100 excluded by type below).
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}, 20480, 0),
    ],
    ids=["gpumem-gpucores", "gpumem-percentage"],
)
def test_fractions(e2e_cluster: Cluster, limits: dict[str, str], expect_mem: int, expect_cores: int) -> None:
    ns = e2e_cluster.namespace()
    e2e_cluster.create_pod(ns, "frac", limits, annotations={keys.USE_GPU_TYPE: "A100"})
    pod = e2e_cluster.wait_labelled(ns, "frac")
    assert_contract(pod)
    assert [(m, c) for _, m, c in grants(pod)] == [(expect_mem, expect_cores)]
    e2e_cluster.delete_pod(ns, "frac")


def test_several_gpus_are_distinct_cards(e2e_cluster: Cluster) -> None:
    ns = e2e_cluster.namespace()
    e2e_cluster.create_pod(ns, "multi", {"nvidia.com/gpu": "3", "nvidia.com/gpumem": "1000"})
    pod = e2e_cluster.wait_labelled(ns, "multi")
    assert_contract(pod)
    uuids = [u for u, _, _ in grants(pod)]
    assert len(uuids) == 3 == len(set(uuids))
    assert pod["spec"]["nodeName"].startswith("e2e-a100")  # the V100 node has only 2 cards
    e2e_cluster.delete_pod(ns, "multi")


def test_type_uuid_and_numa_constraints(e2e_cluster: Cluster) -> None:
    ns = e2e_cluster.namespace()
    e2e_cluster.create_pod(
        ns, "typed", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}, {keys.USE_GPU_TYPE: "V100"}
    )
    target = card_uuid("e2e-a100-1", 3)
    e2e_cluster.create_pod(
        ns, "pinned", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}, {keys.USE_GPU_UUID: target}
    )
    e2e_cluster.create_pod(
        ns,
        "numa",
        {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1000"},
        {keys.NUMA_BIND: "true", keys.USE_GPU_TYPE: "A100"},
    )
    typed = e2e_cluster.wait_bound(ns, "typed")
    assert typed["spec"]["nodeName"] == "e2e-v100-0"
    pinned = e2e_cluster.wait_bound(ns, "pinned")
    assert pinned["spec"]["nodeName"] == "e2e-a100-1"
    assert [u for u, _, _ in grants(pinned)] == [target]
    numa = e2e_cluster.wait_bound(ns, "numa")
    cards = {d.uuid: d.numa for d in inventory(numa["spec"]["nodeName"])}
    assert len({cards[u] for u, _, _ in grants(numa)}) == 1
    for name in ("typed", "pinned", "numa"):
        e2e_cluster.delete_pod(ns, name)


def test_impossible_pod_gets_failed_scheduling_with_our_reasons(e2e_cluster: Cluster) -> None:
    ns = e2e_cluster.namespace()
    e2e_cluster.create_pod(ns, "huge", {"nvidia.com/gpu": "5"})
    event = e2e_cluster.wait_event(ns, "huge", "FailedScheduling")
    # 3 nodes, none with 5 cards: kube-scheduler's histogram of our reason codes.
    assert "0/3 nodes are available" in event["message"]
    assert "3 InsufficientGPUCount" in event["message"]
    assert not e2e_cluster.pod(ns, "huge")["spec"].get("nodeName")
    e2e_cluster.delete_pod(ns, "huge")


def test_node_with_malformed_registration_is_excluded_with_its_reason(e2e_cluster: Cluster) -> None:
    # A node whose HAMi registration cannot be decoded: gpuslice must name it NodeRegistrationInvalid
    # in its filter answer (kube-scheduler turns that into the FailedScheduling histogram) and keep
    # serving every other node.
    bad = "gpu-bad-registration"
    e2e_cluster.cp.create_node(
        bad,
        {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": "10"},
        labels={"kubernetes.io/hostname": bad},
        annotations={keys.NODE_REGISTER: "GPU-x,notanint,7680,100,NVIDIA-T4,0,true:"},
    )
    ns = e2e_cluster.namespace()
    try:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "pinned-bad", "namespace": ns},
            "spec": {
                "schedulerName": SCHEDULER,
                "nodeSelector": {"kubernetes.io/hostname": bad},
                "containers": [
                    {"name": "c", "image": "pause", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ],
            },
        }
        status, obj = e2e_cluster.cp.api_request("POST", f"/api/v1/namespaces/{ns}/pods", body)
        assert status == 201, obj

        def rejected_for_registration() -> bool:
            return any(
                "1 NodeRegistrationInvalid" in e.get("message", "")
                for e in e2e_cluster.events(ns, "pinned-bad")
            )

        e2e_cluster.wait(rejected_for_registration, 30, "no FailedScheduling naming NodeRegistrationInvalid")
        assert not e2e_cluster.pod(ns, "pinned-bad")["spec"].get("nodeName")
        # Every other node keeps serving.
        e2e_cluster.create_pod(ns, "elsewhere", {"nvidia.com/gpu": "1"})
        assert e2e_cluster.wait_bound(ns, "elsewhere")["spec"]["nodeName"] in NODES
        e2e_cluster.delete_pod(ns, "elsewhere")
        e2e_cluster.delete_pod(ns, "pinned-bad")
    finally:
        e2e_cluster.cp.api_request("DELETE", f"/api/v1/nodes/{bad}")


def test_quota_limits_gpu_memory(e2e_cluster: Cluster) -> None:
    ns = e2e_cluster.namespace("quota")
    quota = {"metadata": {"name": "gpu"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "10000"}}}
    status, body = e2e_cluster.cp.api_request("POST", f"/api/v1/namespaces/{ns}/resourcequotas", quota)
    assert status == 201, body
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6000"}
    e2e_cluster.create_pod(ns, "q1", limits)
    e2e_cluster.wait_bound(ns, "q1")
    # 6000 + 6000 = 12000 > 10000.
    e2e_cluster.create_pod(ns, "q2", limits)
    event = e2e_cluster.wait_event(ns, "q2", "FailedScheduling")
    assert "QuotaExceeded" in event["message"]
    # Deleting q1 frees the quota; q2 is retried and placed.
    e2e_cluster.delete_pod(ns, "q1")
    e2e_cluster.wait_bound(ns, "q2", timeout=60)
    e2e_cluster.delete_pod(ns, "q2")


def test_deleting_pods_frees_capacity(e2e_cluster: Cluster) -> None:
    ns = e2e_cluster.namespace()
    v100 = {keys.USE_GPU_TYPE: "V100"}
    for name in ("w0", "w1"):
        e2e_cluster.create_pod(ns, name, {"nvidia.com/gpu": "1"}, v100)
    for name in ("w0", "w1"):
        e2e_cluster.wait_bound(ns, name)
    e2e_cluster.create_pod(ns, "w2", {"nvidia.com/gpu": "1"}, v100)
    event = e2e_cluster.wait_event(ns, "w2", "FailedScheduling")
    assert "ExclusiveConflict" in event["message"] or "InsufficientGPU" in event["message"]
    e2e_cluster.delete_pod(ns, "w0")
    pod = e2e_cluster.wait_bound(ns, "w2", timeout=60)
    assert pod["spec"]["nodeName"] == "e2e-v100-0"
    for name in ("w1", "w2"):
        e2e_cluster.delete_pod(ns, name)


def _card_usage(e2e_cluster: Cluster) -> dict[str, tuple[int, int]]:
    used: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for pod in e2e_cluster.all_pods():
        if pod["spec"].get("nodeName") and keys.DEVICES_ALLOCATED in (
            pod["metadata"].get("annotations") or {}
        ):
            for uuid, mem, cores in grants(pod):
                used[uuid][0] += mem
                used[uuid][1] += cores
    return {u: (m, c) for u, (m, c) in used.items()}


def test_concurrent_pods_never_overcommit_a_card(e2e_cluster: Cluster) -> None:
    ns = e2e_cluster.namespace()
    # 16 pods of 30000 MiB / 40 cores on 8 A100 cards (2 per card fit: 60000 MiB, 80 cores).
    names = [f"burst-{i}" for i in range(16)]
    for name in names:
        e2e_cluster.create_pod(
            ns, name, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000", "nvidia.com/gpucores": "40"}
        )
    for name in names:
        e2e_cluster.wait_bound(ns, name, timeout=90)
    capacity = {d.uuid: (d.memory_mib, d.cores) for n in NODES for d in inventory(n)}
    for uuid, (mem, cores) in _card_usage(e2e_cluster).items():
        assert mem <= capacity[uuid][0] and cores <= capacity[uuid][1], uuid
    for name in names:
        e2e_cluster.delete_pod(ns, name)


def test_restart_rebuilds_usage_from_annotations(e2e_cluster: Cluster) -> None:
    ns = e2e_cluster.namespace()
    e2e_cluster.create_pod(
        ns, "keep", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "12345", "nvidia.com/gpucores": "20"}
    )
    pod = e2e_cluster.wait_bound(ns, "keep")
    ((uuid, _, _),) = grants(pod)

    def allocated() -> dict[str, float]:
        text = _metrics(e2e_cluster)
        out = {}
        for line in text.splitlines():
            if line.startswith("hami_gpu_memory_allocated_bytes{"):
                labels, value = line.rsplit(" ", 1)
                out[labels] = float(value)
        return out

    before = e2e_cluster.wait(
        lambda: (a := allocated()) and any(v > 0 for v in a.values()) and a, message="metrics"
    )
    assert any(uuid in k and v >= 12345 * (1 << 20) for k, v in before.items())
    e2e_cluster.ext.stop()
    # Restart as the non-admin user "gpuslice", granted only deploy/rbac.yaml's ClusterRole: the
    # whole flow (watch, lock, annotate, bind, events, nudges) must work with those rules.
    grant_deploy_rbac(e2e_cluster)
    e2e_cluster.ext.kubeconfig = e2e_cluster.cp.user_kubeconfig
    e2e_cluster.ext.start()
    after = e2e_cluster.wait(allocated, message="metrics after restart")
    assert after == before
    # And the restarted extender keeps scheduling.
    e2e_cluster.create_pod(ns, "after", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"})
    assert_contract(e2e_cluster.wait_labelled(ns, "after", timeout=60))
    for name in ("keep", "after"):
        e2e_cluster.delete_pod(ns, name)


def grant_deploy_rbac(e2e_cluster: Cluster) -> None:
    """Create deploy/rbac.yaml's ClusterRole and bind it to the test user ``gpuslice``."""
    docs = list(yaml.safe_load_all((REPO / "deploy" / "rbac.yaml").read_text()))
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    status, body = e2e_cluster.cp.api_request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
    assert status in (201, 409), body
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "gpuslice-extender-e2e-user"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": role["metadata"]["name"],
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "gpuslice"}],
    }
    status, body = e2e_cluster.cp.api_request(
        "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding
    )
    assert status in (201, 409), body
    # The Lease rules (leader election) are a Role in kube-system.
    (lease_role,) = [d for d in docs if d["kind"] == "Role"]
    namespace = lease_role["metadata"]["namespace"]
    base = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    status, body = e2e_cluster.cp.api_request("POST", f"{base}/roles", lease_role)
    assert status in (201, 409), body
    role_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "gpuslice-extender-leases-e2e-user", "namespace": namespace},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": lease_role["metadata"]["name"],
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "gpuslice"}],
    }
    status, body = e2e_cluster.cp.api_request("POST", f"{base}/rolebindings", role_binding)
    assert status in (201, 409), body


def _metrics(e2e_cluster: Cluster) -> str:
    import urllib.request

    with urllib.request.urlopen(e2e_cluster.ext.url + "/metrics", timeout=5) as resp:  # noqa: S310
        text: str = resp.read().decode()
    return text


def test_serve_over_tls(e2e_cluster: Cluster, tmp_path: pathlib.Path) -> None:
    import json
    import ssl
    import subprocess
    import urllib.request

    from gpuslice_dev import devcluster

    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    ext = devcluster.Extender(e2e_cluster.cp.kubeconfig, tmp_path / "tls.log", tls=(cert, key)).start()
    try:
        assert ext.url.startswith("https://")
        body = {
            "Pod": {
                "metadata": {"name": "t", "uid": "u"},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            },
            "Nodes": None,
            "NodeNames": list(NODES),
        }
        req = urllib.request.Request(
            ext.url + "/filter", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        ctx = ssl.create_default_context(cafile=str(cert))
        ctx.check_hostname = False
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:  # noqa: S310
            answer = json.load(resp)
        # the default node choice (extender) answers the one node it chose
        assert len(answer["NodeNames"]) == 1
        assert set(answer["NodeNames"]) | set(answer["FailedNodes"]) <= set(NODES)
    finally:
        ext.stop()
