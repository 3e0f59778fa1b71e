"""Smoke test of the local control plane: real etcd + kube-apiserver (+ kube-scheduler)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from gpuslice.devcluster.controlplane import USER_NAME, ControlPlane, pinned_versions

pytestmark = pytest.mark.integration

NODE_ALLOCATABLE = {"cpu": "96", "memory": "384Gi", "pods": "110", "nvidia.com/gpu": "8"}


@pytest.fixture(scope="module")
def cp() -> Iterator[ControlPlane]:
    with ControlPlane() as plane:
        yield plane


def test_version_is_pinned(cp: ControlPlane) -> None:
    status, version = cp.api_request("GET", "/version")
    assert status == 200
    assert version["gitVersion"] == pinned_versions()["K8S_VERSION"]


def test_kubeconfigs_name_server_and_tokens(cp: ControlPlane) -> None:
    admin = cp.kubeconfig.read_text()
    user = cp.user_kubeconfig.read_text()
    assert cp.server in admin and cp.admin_token in admin
    assert cp.server in user and cp.user_token in user and f"name: {USER_NAME}" in user
    assert cp.server.startswith("https://127.0.0.1:")


def test_node_capacity_set_through_status(cp: ControlPlane) -> None:
    cp.create_node("smoke-gpu-0", NODE_ALLOCATABLE, labels={"gpuslice.io/test": "smoke"})
    status, node = cp.api_request("GET", "/api/v1/nodes/smoke-gpu-0")
    assert status == 200
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert node["status"]["allocatable"]["pods"] == "110"
    # TaintNodesByCondition is disabled, so no not-ready taint blocks scheduling.
    assert not node["spec"].get("taints")


def test_non_admin_token_is_subject_to_rbac(cp: ControlPlane) -> None:
    status, body = cp.api_request("GET", "/api/v1/nodes", token=cp.user_token)
    assert status == 403, body
    assert f'"{USER_NAME}"' in body["message"]
    status, _ = cp.api_request("GET", "/api/v1/nodes", token="not-a-token")
    assert status == 401


def test_scheduler_binds_pod(cp: ControlPlane) -> None:
    cp.create_node("smoke-cpu-0", {"cpu": "4", "memory": "8Gi", "pods": "10"})
    config = (
        "apiVersion: kubescheduler.config.k8s.io/v1\n"
        "kind: KubeSchedulerConfiguration\n"
        f"clientConnection: {{kubeconfig: {cp.kubeconfig}}}\n"
        "leaderElection: {leaderElect: false}\n"
        "profiles: [{schedulerName: smoke-scheduler}]\n"
    )
    proc = cp.start_scheduler(config)
    assert proc.poll() is None
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "smoke-pod", "namespace": "default"},
        "spec": {
            "schedulerName": "smoke-scheduler",
            "nodeSelector": {"kubernetes.io/hostname": "smoke-cpu-0"},
            "containers": [{"name": "c", "image": "none", "resources": {"requests": {"cpu": "1"}}}],
        },
    }
    # Node objects created through the API have no hostname label unless we set it.
    status, _ = cp.api_request(
        "PATCH",
        "/api/v1/nodes/smoke-cpu-0",
        {"metadata": {"labels": {"kubernetes.io/hostname": "smoke-cpu-0"}}},
    )
    assert status == 200
    status, body = cp.api_request("POST", "/api/v1/namespaces/default/pods", pod)
    assert status == 201, body
    deadline = time.monotonic() + 30
    node_name = None
    while time.monotonic() < deadline and not node_name:
        _, body = cp.api_request("GET", "/api/v1/namespaces/default/pods/smoke-pod")
        node_name = body.get("spec", {}).get("nodeName")
        time.sleep(0.2)
    assert node_name == "smoke-cpu-0", cp.log_tail("kube-scheduler")
    cp.stop_scheduler()
    assert proc.returncode is not None
    status, _ = cp.api_request("DELETE", "/api/v1/namespaces/default/pods/smoke-pod?gracePeriodSeconds=0")
    assert status == 200


def test_stop_kills_processes_and_removes_workdir() -> None:
    plane = ControlPlane().start()
    pids = [p.popen.pid for p in plane._processes]
    workdir = plane.workdir
    plane.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    if os.environ.get("GPUSLICE_KEEP_CONTROL_PLANE") != "1":
        assert not workdir.exists()
    plane.stop()  # idempotent
