"""The Helm chart: lint, a matrix of values rendered and sent to the real kube-apiserver as server-side
dry runs, kube-scheduler's ConfigMap against ``gpuslice render scheduler-config``, and the README's
generated values table.

cert-manager's CRDs are its real ones, read from the cert-manager Go module (the module proxy
serves the repository, CRDs included). The Prometheus Operator's module on the proxy lacks its
CRD files, so ServiceMonitor gets a stand-in CRD that checks group, version, kind and scope only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice_dev import chart, chartvalues
from gpuslice_dev.controlplane import ControlPlane

pytestmark = pytest.mark.integration

CERT_MANAGER_MODULE = "github.com/cert-manager/cert-manager@v1.18.2"

MATRIX: dict[str, dict[str, object]] = {
    "defaults": {},
    "replicas-3": {"replicas": 3},
    "webhook-off": {"webhook.enabled": False},
    "agent-off": {"agent.enabled": False},
    "standalone": {"scheduler.enabled": False},
    "mtls": {"tls.clientCA": True},
    "tls-off": {"tls.enabled": False},
    "cert-manager": {"tls.mode": "certManager", "tls.clientCA": True},
    "service-monitor": {"metrics.serviceMonitor.enabled": True, "overcommit.enabled": True},
    "one-replica": {"replicas": 1, "leaderElect.enabled": False, "podDisruptionBudget.enabled": False},
    "renamed": {"resourceNames.count": "example.com/vgpu", "resourceNames.memory": "example.com/vmem"},
    "standalone-mtls-3": {"scheduler.enabled": False, "tls.clientCA": True, "replicas": 3},
    "customised": {
        "global.imageRegistry": "mirror.example.com",
        "imagePullSecrets": ["regcred"],
        "podAnnotations": {"example.com/owner": "gpu-team"},
        "podLabels": {"team": "gpu"},
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
        "extraVolumes": [{"name": "extra-ca", "configMap": {"name": "corp-ca"}}],
        "extraVolumeMounts": [{"name": "extra-ca", "mountPath": "/etc/corp-ca", "readOnly": True}],
        "scheduler.extraArgs": ["--kube-api-qps=100"],
        "webhook.extraArgs": ["--deny-privileged"],
        "webhook.reinvocationPolicy": "IfNeeded",
        "webhook.namespaceSelector": {
            "matchExpressions": [{"key": "team", "operator": "In", "values": ["ml"]}]
        },
        "agent.nvmlLibrary": "/usr/lib64/libnvidia-ml.so.1",
        "agent.extraVolumes": [{"name": "nodes", "hostPath": {"path": "/srv/nodes", "type": "Directory"}}],
        "agent.extraVolumeMounts": [{"name": "nodes", "mountPath": "/nodes", "readOnly": True}],
        "agent.priorityClassName": "system-cluster-critical",
        "priorityQuota.enabled": True,
        "metrics.serviceMonitor.enabled": True,
    },
}

RENAMED: dict[str, object] = {
    "resourceNames.count": "example.com/vgpu",
    "resourceNames.memory": "example.com/vmem",
    "resourceNames.memoryPercentage": "example.com/vmem-percentage",
    "resourceNames.cores": "example.com/vcores",
    "resourceNames.priority": "example.com/vprio",
}


def _crd_from_file(path: Path) -> dict[str, Any]:
    """A CRD from cert-manager's deploy/crds: YAML whose templating sits in comments and labels."""
    crd = yaml.safe_load(path.read_text())
    assert crd["kind"] == "CustomResourceDefinition", path
    crd["metadata"] = {"name": crd["metadata"]["name"]}
    return dict(crd)


def _cert_manager_crds() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            ["go", "mod", "download", "-json", CERT_MANAGER_MODULE],
            capture_output=True,
            text=True,
            check=False,
            cwd=tmp,
            env={**os.environ, "GOFLAGS": "-mod=mod", "GOWORK": "off"},
        )
    info = json.loads(proc.stdout or "{}")
    assert proc.returncode == 0 and "Dir" in info, f"go mod download {CERT_MANAGER_MODULE}: {proc.stderr}"
    crds = Path(info["Dir"]) / "deploy" / "crds"
    return [_crd_from_file(crds / f"crd-{name}.yaml") for name in ("issuers", "certificates")]


SERVICE_MONITOR_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "names": {"kind": "ServiceMonitor", "plural": "servicemonitors", "singular": "servicemonitor"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane) -> Iterator[None]:
    created = []
    for crd in [*_cert_manager_crds(), SERVICE_MONITOR_CRD]:
        status, body = control_plane.api_request(
            "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd
        )
        assert status in (201, 409), body
        created.append(crd["metadata"]["name"])
    for name in created:  # served once Established
        deadline = time.monotonic() + 30
        while True:
            status, body = control_plane.api_request(
                "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            )
            conditions = {c["type"]: c["status"] for c in (body.get("status") or {}).get("conditions") or []}
            if conditions.get("Established") == "True":
                break
            assert time.monotonic() < deadline, f"CRD {name} not established: {body}"
            time.sleep(0.2)
    time.sleep(1.0)  # discovery of the new groups
    yield
    for name in created:
        control_plane.api_request("DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_helm_lint_is_clean(case: str) -> None:
    out = chart.lint(MATRIX[case])
    assert "0 chart(s) failed" in out, out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_every_rendered_object_passes_server_side_dry_run(
    control_plane: ControlPlane, crds: None, case: str
) -> None:
    ns = f"chart-{case}-{uuid.uuid4().hex[:5]}"
    status, body = control_plane.api_request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    assert status == 201, body
    objects = chart.template(MATRIX[case], release=f"g{uuid.uuid4().hex[:4]}", namespace=ns, tests=True)
    assert objects, "nothing rendered"
    refused = []
    for obj in objects:
        path = chart.resource_path(obj) + "?dryRun=All&fieldValidation=Strict"
        status, body = control_plane.api_request("POST", path, obj)
        if status != 201:
            refused.append(f"{obj['kind']}/{obj['metadata']['name']}: {status} {body.get('message', body)}")
    assert not refused, "\n".join(refused)
    kinds = {o["kind"] for o in objects}
    expected = {"Deployment", "ConfigMap", "ClusterRole", "Service", "ServiceAccount", "Pod"}
    if MATRIX[case].get("webhook.enabled", True):
        expected |= {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    if MATRIX[case].get("agent.enabled", True):
        expected.add("DaemonSet")
    if case == "cert-manager":
        expected |= {"Certificate", "Issuer"}
    if case in ("service-monitor", "customised"):
        expected.add("ServiceMonitor")
    if case == "customised":
        expected.add("ResourceQuota")
    assert expected <= kinds, f"missing {expected - kinds}"


def _render_args(values: Mapping[str, Any], namespace: str) -> list[str]:
    """``gpuslice render scheduler-config`` flags that say what ``values`` say."""
    v = _merged(values)
    tls, sidecar = v["tls"]["enabled"], v["scheduler"]["enabled"]
    scheme = "https" if tls else "http"
    host = "127.0.0.1" if sidecar else f"gpuslice.{namespace}.svc"
    args = [
        f"--url={scheme}://{host}:{v['extender']['port']}",
        f"--scheduler-name={v['scheduler']['name']}",
        f"--http-timeout={v['scheduler']['httpTimeout']}",
        f"--node-choice={v['policy']['nodeChoice']}",
    ]
    if v["scheduler"]["extenderWeight"]:
        args.append(f"--weight={v['scheduler']['extenderWeight']}")
    if not v["scheduler"]["preempt"]:
        args.append("--no-preempt")
    if v["leaderElect"]["enabled"]:
        le = v["leaderElect"]
        args += [
            "--leader-elect",
            f"--lease-duration={le['leaseDuration']}",
            f"--renew-deadline={le['renewDeadline']}",
            f"--retry-period={le['retryPeriod']}",
            f"--lease-name={v['scheduler']['name']}",
            f"--lease-namespace={namespace}",
        ]
    names = v["resourceNames"]
    args += [
        f"--resource-count-name={names['count']}",
        f"--resource-memory-name={names['memory']}",
        f"--resource-memory-percentage-name={names['memoryPercentage']}",
        f"--resource-core-name={names['cores']}",
        f"--resource-priority-name={names['priority']}",
    ]
    if tls:
        args.append("--ca-file=/etc/gpuslice/tls/ca.crt")
        if v["tls"]["clientCA"]:
            args += [
                "--client-cert=/etc/gpuslice/client-tls/tls.crt",
                "--client-key=/etc/gpuslice/client-tls/tls.key",
            ]
    return args


def _merged(values: Mapping[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = yaml.safe_load((chart.CHART_DIR / "values.yaml").read_text())
    for dotted, value in values.items():
        node = merged
        *parents, last = dotted.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    return merged


CONFIG_CASES: dict[str, dict[str, object]] = {
    "defaults": {},
    "mtls": {"tls.clientCA": True},
    "tls-off": {"tls.enabled": False},
    "standalone": {"scheduler.enabled": False},
    "tuned": {
        "scheduler.name": "hami-scheduler",
        "scheduler.extenderWeight": 3,
        "scheduler.httpTimeout": "20s",
        "scheduler.preempt": False,
        "extender.port": 9999,
        "leaderElect.leaseDuration": "30s",
        "leaderElect.renewDeadline": "20s",
        "leaderElect.retryPeriod": "4s",
    },
    "no-election": {"replicas": 1, "leaderElect.enabled": False},
    "rank": {"policy.nodeChoice": "rank"},
    "blend-weighted": {"policy.nodeChoice": "blend", "scheduler.extenderWeight": 5},
    "renamed": RENAMED,
    "renamed-standalone": {**RENAMED, "resourceNames.cores": "nvidia.com/cores", "scheduler.enabled": False},
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_scheduler_configmap_is_what_render_prints(case: str) -> None:
    values = CONFIG_CASES[case]
    namespace = "gpuslice-system"
    objects = chart.template(values, release="gpuslice", namespace=namespace)
    from_chart = yaml.safe_load(chart.find(objects, "ConfigMap", "-scheduler-config")["data"]["config.yaml"])
    proc = subprocess.run(
        [sys.executable, "-m", "gpuslice", "render", "scheduler-config", *_render_args(values, namespace)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert from_chart == yaml.safe_load(proc.stdout)


@pytest.mark.parametrize("values", [{}, RENAMED], ids=["defaults", "renamed"])
def test_extender_webhook_and_scheduler_get_the_same_resource_names(values: dict[str, object]) -> None:
    objects = chart.template(values)
    names = list(_merged(values)["resourceNames"].values())
    config = yaml.safe_load(chart.find(objects, "ConfigMap", "-scheduler-config")["data"]["config.yaml"])
    assert [m["name"] for m in config["extenders"][0]["managedResources"]] == names
    assert all(m["ignoredByScheduler"] is True for m in config["extenders"][0]["managedResources"])
    flags = [
        "--resource-count-name",
        "--resource-memory-name",
        "--resource-memory-percentage-name",
        "--resource-core-name",
        "--resource-priority-name",
    ]
    want = [f"{flag}={name}" for flag, name in zip(flags, names, strict=True)]
    for deployment, container in (("gpuslice", "gpuslice"), ("-webhook", "webhook")):
        pod = chart.find(objects, "Deployment", deployment)["spec"]["template"]["spec"]
        command = next(c for c in pod["containers"] if c["name"] == container)["command"]
        assert [a for a in command if a.startswith("--resource-")] == want, (deployment, command)


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"resourceNames.cores": "nvidia.com/gpu"}, "resourceNames must be five different names"),
        ({"resourceNames.count": "gpu"}, "not an extended-resource name"),
        ({"resourceNames.memory": "Example.com/mem"}, "not an extended-resource name"),
    ],
)
def test_bad_resource_names_fail_to_render(values: dict[str, object], fragment: str) -> None:
    with pytest.raises(chart.ChartError, match=fragment):
        chart.template(values)


def test_overcommit_is_applied_once_by_the_registering_agent() -> None:
    objects = chart.template(
        {"overcommit.enabled": True, "overcommit.deviceMemoryScaling": 2, "agent.register": True}
    )
    pod = chart.find(objects, "Deployment", "gpuslice")["spec"]["template"]["spec"]
    extender = next(c for c in pod["containers"] if c["name"] == "gpuslice")["command"]
    assert not [a for a in extender if "scaling" in a], extender
    agent = chart.find(objects, "DaemonSet", "-agent")["spec"]["template"]["spec"]["containers"][0]
    assert "--memory-scaling=2" in agent["command"] + agent.get("args", [])


def test_the_sidecar_mounts_what_its_configuration_names() -> None:
    objects = chart.template({"tls.clientCA": True})
    config = yaml.safe_load(chart.find(objects, "ConfigMap", "-scheduler-config")["data"]["config.yaml"])
    pod = chart.find(objects, "Deployment", "gpuslice")["spec"]["template"]["spec"]
    scheduler = next(c for c in pod["containers"] if c["name"] == "kube-scheduler")
    mounted = [m["mountPath"] for m in scheduler["volumeMounts"]]
    for path in config["extenders"][0]["tlsConfig"].values():
        assert any(str(path).startswith(m + "/") for m in mounted), (path, mounted)
    assert any(arg.startswith("--config=/etc/gpuslice/scheduler/") for arg in scheduler["command"])


def test_every_value_is_documented_and_the_readme_table_is_current() -> None:
    text = (chart.CHART_DIR / "values.yaml").read_text()
    documented = {key for key, _ in chartvalues.documented(text)}

    def leaves(node: Any, prefix: str = "") -> Iterator[str]:
        if isinstance(node, dict) and node:
            for key, child in node.items():
                yield from leaves(child, f"{prefix}{key}.")
        else:
            yield prefix.rstrip(".")

    undocumented = [
        leaf
        for leaf in leaves(yaml.safe_load(text))
        if not any(leaf == d or leaf.startswith(d + ".") for d in documented)
    ]
    assert not undocumented, f"values without a '# --' comment: {undocumented}"
    readme = (chart.CHART_DIR.parents[1] / "README.md").read_text()
    assert chartvalues.splice(readme, chartvalues.table(text)) == readme, "run make chart-docs"


def test_an_impossible_combination_fails_to_render() -> None:
    with pytest.raises(chart.ChartError, match="leaderElect"):
        chart.template({"replicas": 2, "leaderElect.enabled": False})
    with pytest.raises(chart.ChartError, match="tls.mode"):
        chart.template({"tls.mode": "letsencrypt"})


def test_the_dry_run_refuses_what_the_apiserver_would(control_plane: ControlPlane) -> None:
    """The check has teeth: a value the schema leaves free-form and the apiserver refuses (a label
    key with a space)."""
    objects = chart.template({"podLabels": {"not a key": "x"}}, namespace="default")
    deployment = chart.find(objects, "Deployment", "-webhook")
    status, body = control_plane.api_request(
        "POST", chart.resource_path(deployment) + "?dryRun=All", deployment
    )
    assert status == 422 and "not a key" in body.get("message", ""), body
