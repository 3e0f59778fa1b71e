"""podrun on the real apiserver: a pod template's containers as local processes, in-cluster config.

The containers see their volumes at their real paths (in private mount namespaces) and reach the
apiserver with the minted service-account token; the host's /etc and /run are left untouched.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuslice_dev import controlplane
from gpuslice_dev.controlplane import ControlPlane
from gpuslice_dev.podrun import PodRunError, PodRunner, PodSpecError
from tests.integration.conftest import unique
from tests.integration.kubehelpers import NODE_ALLOCATABLE

pytestmark = pytest.mark.integration

HOST_DIR = Path("/etc/gpuslice-podrun-test")
SA_HOST_DIR = Path("/run/secrets/kubernetes.io")

# The container's program: prints one JSON object. No "$(" in it (that would be expanded).
PROBE = r"""
import asyncio, json, os, socket, sys
from gpuslice.kube import client as kclient, errors

out = {}
out["conf"] = open("/etc/gpuslice-podrun-test/conf/conf.yaml").read()
out["secret"] = open("/etc/gpuslice-podrun-test/secret/pw").read()
out["secret_mode"] = os.stat("/etc/gpuslice-podrun-test/secret/pw").st_mode & 0o777
out["from_init"] = open("/etc/gpuslice-podrun-test/data/hello").read()
try:
    open("/etc/gpuslice-podrun-test/conf/new", "w")
    out["conf_writable"] = True
except OSError:
    out["conf_writable"] = False
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
out["sa_files"] = sorted(os.listdir(sa))
out["sa_namespace"] = open(sa + "/namespace").read()
ns = out["sa_namespace"]

async def main():
    async with kclient.KubeClient.auto(qps=0) as kube:
        out["server"] = kube.config.cluster.server
        got = await kube.request("GET", "/api/v1/namespaces/" + ns + "/configmaps/visible")
        out["get_configmap"] = got.status
        try:
            await kube.request("GET", "/api/v1/namespaces/" + ns + "/secrets")
            out["list_secrets"] = 200
        except errors.ApiError as exc:
            out["list_secrets"] = exc.code
        review = await kube.request(
            "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        out["username"] = json.loads(review.content)["status"]["userInfo"]["username"]

asyncio.run(main())
out["env"] = dict(os.environ)
out["argv"] = sys.argv[1:]
out["cwd"] = os.getcwd()
out["hostname"] = socket.gethostname()
print(json.dumps(out))
"""


def _post(cp: ControlPlane, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, obj = cp.api_request("POST", path, body)
    assert status == 201, obj
    return obj


def _service_account(cp: ControlPlane, namespace: str, name: str) -> None:
    _post(cp, f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}})


@pytest.fixture
def runner_dir(tmp_path: Path) -> Iterator[Path]:
    assert not HOST_DIR.exists()
    sa_before = SA_HOST_DIR.exists()
    yield tmp_path
    # Nothing a container mounted or created reached the host.
    assert not HOST_DIR.exists()
    assert SA_HOST_DIR.exists() == sa_before


def _template(namespace: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "probe"}, "annotations": {"note": "x"}},
        "spec": {
            "serviceAccountName": "podrun",
            "volumes": [
                {"name": "conf", "configMap": {"name": "podrun-conf"}},
                {
                    "name": "secret",
                    "secret": {
                        "secretName": "podrun-secret",
                        "items": [{"key": "password", "path": "pw"}],
                        "defaultMode": 0o440,
                    },
                },
                {"name": "data", "emptyDir": {}},
            ],
            "initContainers": [
                {
                    "name": "prepare",
                    "command": ["python", "-c"],
                    "args": [
                        "import os; open('"
                        + str(HOST_DIR)
                        + "/data/hello', 'w').write(os.environ['POD_NAME'])"
                    ],
                    "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "volumeMounts": [{"name": "data", "mountPath": "/etc/gpuslice-podrun-test/data"}],
                }
            ],
            "containers": [
                {
                    "name": "probe",
                    "command": ["python", "-c", PROBE],
                    "args": ["--greeting=$(GREETING)", "$$(GREETING)"],
                    "workingDir": "/etc/gpuslice-podrun-test/work",
                    "env": [
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "GREETING", "value": "hello-$(POD_NAME)-$(LATER)"},
                        {"name": "LATER", "value": "later"},
                        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {
                            "name": "CPUS",
                            "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}},
                        },
                        {
                            "name": "PASSWORD",
                            "valueFrom": {"secretKeyRef": {"name": "podrun-secret", "key": "password"}},
                        },
                    ],
                    "envFrom": [{"configMapRef": {"name": "podrun-conf"}, "prefix": "CONF_"}],
                    "resources": {"limits": {"cpu": "1500m", "memory": "64Mi"}},
                    "volumeMounts": [
                        {"name": "conf", "mountPath": "/etc/gpuslice-podrun-test/conf"},
                        {"name": "secret", "mountPath": "/etc/gpuslice-podrun-test/secret"},
                        {"name": "data", "mountPath": "/etc/gpuslice-podrun-test/data", "readOnly": True},
                    ],
                }
            ],
        },
    }


def _manifests() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "podrun-conf"},
            "data": {"conf.yaml": "a: 1\n"},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "podrun-secret"},
            "data": {"password": base64.b64encode(b"s3cret").decode()},
        },
    ]


def test_pod_template_runs_with_real_mounts_env_and_in_cluster_config(
    control_plane: ControlPlane,
    namespace: str,
    node_name: str,
    runner_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cp = control_plane
    monkeypatch.setenv("GPUSLICE_PODRUN_LEAK_CHECK", "leaked")
    _service_account(cp, namespace, "podrun")
    _post(
        cp,
        f"/api/v1/namespaces/{namespace}/configmaps",
        {"metadata": {"name": "visible"}, "data": {"k": "v"}},
    )
    _post(
        cp,
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
        {
            "metadata": {"name": "podrun"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
        },
    )
    _post(
        cp,
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "metadata": {"name": "podrun"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "podrun"},
            "subjects": [{"kind": "ServiceAccount", "name": "podrun", "namespace": namespace}],
        },
    )
    runner = PodRunner(cp, _manifests(), runner_dir, {"python": sys.executable})
    with runner.start(
        _template(namespace), namespace=namespace, pod_name="probe-0", node_name=node_name
    ) as pod:
        assert pod.processes["prepare"].returncode == 0
        code = pod.wait("probe", timeout=60)
        log = pod.log_text("probe")
    assert code == 0, log
    out = json.loads(log.strip().splitlines()[-1])
    port = cp.server.rsplit(":", 1)[1]

    assert out["conf"] == "a: 1\n"
    assert out["secret"] == "s3cret"
    assert out["secret_mode"] == 0o440
    assert out["from_init"] == "probe-0"
    assert out["conf_writable"] is False
    assert out["sa_files"] == ["ca.crt", "namespace", "token"]
    assert out["sa_namespace"] == namespace
    # lightkube's in-cluster config, TLS verified against the mounted ca.crt.
    assert out["server"] == f"https://127.0.0.1:{port}"
    assert out["username"] == f"system:serviceaccount:{namespace}:podrun"
    assert out["get_configmap"] == 200
    assert out["list_secrets"] == 403

    env = out["env"]
    assert env["POD_NAME"] == "probe-0"
    assert env["GREETING"] == "hello-probe-0-$(LATER)"  # only earlier variables expand
    assert env["APP"] == "probe"
    assert env["NODE"] == node_name
    assert env["CPUS"] == "2"  # 1500m rounded up to whole cores
    assert env["PASSWORD"] == "s3cret"
    assert env["CONF_conf.yaml"] == "a: 1\n"
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert env["KUBERNETES_SERVICE_PORT"] == port
    assert env["HOSTNAME"] == "probe-0"
    assert "GPUSLICE_PODRUN_LEAK_CHECK" not in env
    assert not {"PWD", "OLDPWD", "IFS"} & set(env)
    assert out["argv"] == ["--greeting=hello-probe-0-$(LATER)", "$(GREETING)"]
    assert out["cwd"] == "/etc/gpuslice-podrun-test/work"
    assert out["hostname"] == "probe-0"


def test_failing_init_container_stops_the_pod(
    control_plane: ControlPlane, namespace: str, runner_dir: Path
) -> None:
    template = {
        "automountServiceAccountToken": False,
        "initContainers": [
            {"name": "fail", "command": ["python", "-c", "print('boom'); raise SystemExit(3)"]}
        ],
        "containers": [{"name": "main", "command": ["python", "-c", "print('never')"]}],
    }
    runner = PodRunner(control_plane, [], runner_dir, {"python": sys.executable})
    with pytest.raises(PodRunError, match=r"init container fail exited with status 3(.|\n)*boom"):
        runner.start(template, namespace=namespace, pod_name="fail-0", node_name="n")
    assert not (runner_dir / "fail-0" / "main.log").exists()


def test_unmapped_command_and_missing_objects_are_refused(
    control_plane: ControlPlane, namespace: str, runner_dir: Path
) -> None:
    runner = PodRunner(control_plane, [], runner_dir, {"python": sys.executable})
    base = {"automountServiceAccountToken": False}
    with pytest.raises(PodSpecError, match="'sleep' has no local executable"):
        runner.start(
            {**base, "containers": [{"name": "c", "command": ["sleep", "1"]}]},
            namespace=namespace,
            pod_name="p",
            node_name="n",
        )
    with pytest.raises(PodSpecError, match="ConfigMap .*/absent not found"):
        runner.start(
            {
                **base,
                "volumes": [{"name": "v", "configMap": {"name": "absent"}}],
                "containers": [{"name": "c", "command": ["python", "-c", "pass"]}],
            },
            namespace=namespace,
            pod_name="p",
            node_name="n",
        )
    with pytest.raises(PodRunError, match="ServiceAccount .*/nobody: HTTP 404"):
        runner.start(
            {
                "serviceAccountName": "nobody",
                "containers": [{"name": "c", "command": ["python", "-c", "pass"]}],
            },
            namespace=namespace,
            pod_name="p",
            node_name="n",
        )


def test_failed_mount_setup_is_reported(
    control_plane: ControlPlane, namespace: str, runner_dir: Path
) -> None:
    # procfs cannot be an overlay's lower layer, so a mount point below /proc cannot be made.
    template = {
        "automountServiceAccountToken": False,
        "volumes": [{"name": "v", "emptyDir": {}}],
        "containers": [
            {
                "name": "c",
                "command": ["python", "-c", "pass"],
                "volumeMounts": [{"name": "v", "mountPath": "/proc/gpuslice-podrun-test/x"}],
            }
        ],
    }
    runner = PodRunner(control_plane, [], runner_dir, {"python": sys.executable})
    with pytest.raises(PodRunError, match=r"container c: setup failed(.|\n)*mount"):
        runner.start(template, namespace=namespace, pod_name="bad-0", node_name="n")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _healthz(port: int) -> int:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    try:
        with opener.open(f"https://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:
        return 0


def test_real_kube_scheduler_runs_in_cluster_and_schedules(
    control_plane: ControlPlane, namespace: str, node_name: str, runner_dir: Path
) -> None:
    cp = control_plane
    profile = unique("podrun-sched")
    binding = unique("podrun-sched")
    _service_account(cp, namespace, "scheduler")
    subjects = [{"kind": "ServiceAccount", "name": "scheduler", "namespace": namespace}]
    # What a cluster grants kube-scheduler: both ClusterRoles (the scheduler waits for its
    # StorageClass informer, which only system:volume-scheduler allows), and the reader of the
    # authentication ConfigMap for its delegated authentication.
    for role in ("system:kube-scheduler", "system:volume-scheduler"):
        _post(
            cp,
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "metadata": {"name": f"{binding}-{role.split(':')[1]}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": subjects,
            },
        )
    _post(
        cp,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings",
        {
            "metadata": {"name": binding},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "extension-apiserver-authentication-reader",
            },
            "subjects": subjects,
        },
    )
    config = (
        "apiVersion: kubescheduler.config.k8s.io/v1\n"
        "kind: KubeSchedulerConfiguration\n"
        "leaderElection:\n  leaderElect: false\n"
        f"profiles:\n- schedulerName: {profile}\n"
    )
    manifests = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "sched"},
            "data": {"config.yaml": config},
        }
    ]
    port = _free_port()
    template = {
        "spec": {
            "serviceAccountName": "scheduler",
            "volumes": [{"name": "config", "configMap": {"name": "sched"}}],
            "containers": [
                {
                    "name": "kube-scheduler",
                    "command": ["kube-scheduler"],
                    "args": [
                        "--config=/etc/gpuslice-podrun-test/scheduler/config.yaml",
                        "--bind-address=127.0.0.1",
                        "--secure-port=$(HEALTH_PORT)",
                        "-v=2",
                    ],
                    "env": [{"name": "HEALTH_PORT", "value": str(port)}],
                    "volumeMounts": [
                        {
                            "name": "config",
                            "mountPath": "/etc/gpuslice-podrun-test/scheduler",
                            "readOnly": True,
                        }
                    ],
                }
            ],
        }
    }
    executables = {"kube-scheduler": str(controlplane.binaries_dir() / "kube-scheduler")}
    runner = PodRunner(cp, manifests, runner_dir, executables)
    try:
        with runner.start(template, namespace=namespace, pod_name="sched-0", node_name=node_name) as pod:
            deadline = time.monotonic() + 60
            while _healthz(port) != 200 and pod.running("kube-scheduler") and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _healthz(port) == 200, pod.log_text("kube-scheduler")[-3000:]

            cp.create_node(node_name, NODE_ALLOCATABLE)
            _post(
                cp,
                f"/api/v1/namespaces/{namespace}/pods",
                {
                    "metadata": {"name": "trivial"},
                    "spec": {
                        "schedulerName": profile,
                        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                    },
                },
            )
            bound = ""
            deadline = time.monotonic() + 60
            while not bound and pod.running("kube-scheduler") and time.monotonic() < deadline:
                status, obj = cp.api_request("GET", f"/api/v1/namespaces/{namespace}/pods/trivial")
                assert status == 200, obj
                bound = obj["spec"].get("nodeName", "")
                time.sleep(0.2)
            log = pod.log_text("kube-scheduler")
        assert bound == node_name, log[-3000:]
        assert "Successfully bound pod to node" in log
        assert "/etc/gpuslice-podrun-test/scheduler/config.yaml" in " ".join(
            pod.launches["kube-scheduler"].argv
        )
        assert not Path("/apiserver.local.config").exists()
    finally:
        for suffix in ("kube-scheduler", "volume-scheduler"):
            cp.api_request(
                "DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}-{suffix}"
            )
        cp.api_request(
            "DELETE", f"/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings/{binding}"
        )
        cp.api_request("DELETE", f"/api/v1/namespaces/{namespace}/pods/trivial?gracePeriodSeconds=0")


def test_host_environment_is_not_inherited(
    control_plane: ControlPlane, namespace: str, runner_dir: Path
) -> None:
    assert os.environ.get("PATH")  # the test process has one; the container gets the default
    runner = PodRunner(control_plane, [], runner_dir, {"python": sys.executable})
    template = {
        "automountServiceAccountToken": False,
        "containers": [
            {"name": "c", "command": ["python", "-c", "import json, os; print(json.dumps(dict(os.environ)))"]}
        ],
    }
    with runner.start(template, namespace=namespace, pod_name="env-0", node_name="n") as pod:
        assert pod.wait("c", timeout=60) == 0
        env = json.loads(pod.log_text("c").strip().splitlines()[-1])
    port = control_plane.server.rsplit(":", 1)[1]
    assert set(env) == {
        "PATH",
        "HOME",
        "LANG",
        "HOSTNAME",
        "KUBERNETES_SERVICE_HOST",
        "KUBERNETES_SERVICE_PORT",
        "KUBERNETES_SERVICE_PORT_HTTPS",
        "KUBERNETES_PORT",
        f"KUBERNETES_PORT_{port}_TCP",
        f"KUBERNETES_PORT_{port}_TCP_PROTO",
        f"KUBERNETES_PORT_{port}_TCP_PORT",
        f"KUBERNETES_PORT_{port}_TCP_ADDR",
    }
