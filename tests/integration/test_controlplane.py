"""Smoke test of the local control plane: real etcd + kube-apiserver (+ kube-scheduler)."""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping

import pytest
import yaml

from gpuslice_dev.controlplane import USER_NAME, ControlPlane, pinned_versions

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
    admin = yaml.safe_load(cp.kubeconfig.read_text())
    user = yaml.safe_load(cp.user_kubeconfig.read_text())
    for config, name, token in ((admin, "admin", cp.admin_token), (user, USER_NAME, cp.user_token)):
        assert config["clusters"][0]["cluster"]["server"] == cp.server
        assert config["users"] == [{"name": name, "user": {"token": token}}]
        assert config["contexts"][0]["context"]["user"] == name
    assert cp.server.startswith("https://127.0.0.1:")


def test_client_certificates_are_confined_by_the_node_authorizer(cp: ControlPlane) -> None:
    """A kubelet's certificate (system:node:<name>) reaches its own Node, not another's Secrets."""
    path = cp.client_kubeconfig("system:node:cert-node-0", ["system:nodes"])
    config = yaml.safe_load(path.read_text())
    user = config["users"][0]["user"]
    context = ssl.create_default_context(cafile=None)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.load_cert_chain(user["client-certificate"], user["client-key"])

    def call(method: str, path: str, body: Mapping[str, object] | None = None) -> int:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(cp.server + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=context, timeout=10) as resp:  # noqa: S310 - loopback
                return int(resp.status)
        except urllib.error.HTTPError as err:
            return int(err.code)

    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cert-node-0"}}
    assert call("POST", "/api/v1/nodes", node) == 201  # a kubelet registers its own node
    assert call("GET", "/api/v1/nodes/cert-node-0") == 200
    assert call("GET", "/api/v1/namespaces/default/secrets") == 403
    cp.api_request("DELETE", "/api/v1/nodes/cert-node-0")


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
