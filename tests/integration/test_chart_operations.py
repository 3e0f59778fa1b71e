"""The chart under an operator's day-2 work: upgrades and drains in standalone mode, certificates
across upgrades, the node agent on varied GPU nodes, pod customisation, webhook selectors, `helm test`
and NOTES.

Renders use the pinned helm. Where Helm's ``lookup`` matters (certificates kept or issued on
upgrade) the chart is rendered against the session's real kube-apiserver with
``--validate --dry-run=server``, which reads the objects an earlier install left there, as
``helm upgrade`` does.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice_dev import chart
from gpuslice_dev.controlplane import ControlPlane

pytestmark = pytest.mark.integration

SELECTOR_KEYS = {"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component"}


def _deployment(objects: list[dict[str, Any]], suffix: str = "gpuslice") -> dict[str, Any]:
    return chart.find(objects, "Deployment", suffix)


def _container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(next(c for c in chart.pod_spec(obj)["containers"] if c["name"] == name))


def _secret(objects: list[dict[str, Any]], suffix: str) -> dict[str, str]:
    data = chart.find(objects, "Secret", suffix)["data"]
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def _openssl(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    return subprocess.run(["openssl", *args], input=stdin, capture_output=True, text=True, check=False)  # noqa: S603


def _verifies(ca: str, cert: str, tmp_path: Path) -> bool:
    name = uuid.uuid4().hex
    (tmp_path / f"{name}-ca.pem").write_text(ca)
    (tmp_path / f"{name}.pem").write_text(cert)
    proc = _openssl("verify", "-CAfile", str(tmp_path / f"{name}-ca.pem"), str(tmp_path / f"{name}.pem"))
    return proc.returncode == 0


# ----------------------------------------------------------------------- duplicate keys and labels


class DuplicateKeyError(ValueError):
    """A YAML mapping names one key twice."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys without a word; kustomize and Flux refuse them."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise DuplicateKeyError(f"key {key!r} twice, line {key_node.start_mark.line + 1}")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _load_unique(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.load_all(text, Loader=_UniqueKeyLoader) if doc]  # noqa: S506 - a SafeLoader


def test_the_duplicate_key_check_has_teeth() -> None:
    with pytest.raises(DuplicateKeyError, match="app.kubernetes.io/name"):
        _load_unique("metadata:\n  labels:\n    app.kubernetes.io/name: a\n    app.kubernetes.io/name: a\n")


DUPLICATE_CASES: dict[str, dict[str, object]] = {
    "defaults": {},
    "standalone": {"scheduler.enabled": False, "tls.clientCA": True},
    "everything-labelled": {
        "podLabels": {"app.kubernetes.io/name": "mine", "team": "gpu"},
        "podAnnotations": {"checksum/tls": "mine", "example.com/a": "b"},
        "metrics.serviceMonitor.enabled": True,
        "metrics.serviceMonitor.labels": {"release": "prom", "app.kubernetes.io/component": "x"},
        "metrics.dashboard.labels": {"grafana_dashboard": "1", "team": "gpu"},
        "priorityQuota.enabled": True,
    },
}


@pytest.mark.parametrize("case", sorted(DUPLICATE_CASES))
def test_no_rendered_mapping_names_a_key_twice(case: str) -> None:
    text = chart.template_text(DUPLICATE_CASES[case], tests=True)
    objects = _load_unique(text)  # raises on any duplicate key, labels included
    for obj in objects:
        if obj["kind"] in ("Deployment", "DaemonSet"):
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert SELECTOR_KEYS <= set(labels), labels
            assert "helm.sh/chart" not in labels and "app.kubernetes.io/version" not in labels, labels
            # podLabels never replace a selector label
            assert labels["app.kubernetes.io/name"] == "gpuslice", labels
            assert obj["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_a_chart_version_bump_leaves_every_pod_template_as_it_was(tmp_path: Path) -> None:
    """No chart version in a pod template: bumping the chart restarts no pod (agent included)."""
    bumped = tmp_path / "gpuslice"
    shutil.copytree(chart.CHART_DIR, bumped)
    meta = (bumped / "Chart.yaml").read_text()
    (bumped / "Chart.yaml").write_text(meta.replace("version: 0.1.0", "version: 0.1.1"))
    values = {"tls.mode": "secret", "tls.existingSecret": "s", "tls.caBundle": "x"}  # no random certificates
    before, after = chart.template(values), chart.template(values, chart=bumped)
    for kind, suffix in (("Deployment", "gpuslice"), ("Deployment", "-webhook"), ("DaemonSet", "-agent")):
        old, new = chart.find(before, kind, suffix), chart.find(after, kind, suffix)
        assert old["metadata"]["labels"] != new["metadata"]["labels"], "the object itself carries the version"
        assert old["spec"]["template"] == new["spec"]["template"], (kind, suffix)


def test_pod_customisation_values_reach_the_pods() -> None:
    values = {
        "podAnnotations": {"example.com/owner": "gpu-team"},
        "podLabels": {"team": "gpu"},
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
        "extraVolumes": [{"name": "extra-ca", "configMap": {"name": "corp-ca"}}],
        "extraVolumeMounts": [{"name": "extra-ca", "mountPath": "/etc/corp-ca", "readOnly": True}],
        "scheduler.extraArgs": ["--kube-api-qps=100"],
        "webhook.extraArgs": ["--deny-privileged"],
        "extender.extraArgs": ["--qps=400"],
    }
    objects = chart.template(values)
    pods = {
        "scheduler": (_deployment(objects), "gpuslice"),
        "webhook": (_deployment(objects, "-webhook"), "webhook"),
        "agent": (chart.find(objects, "DaemonSet", "-agent"), "agent"),
    }
    for name, (obj, container_name) in pods.items():
        meta = obj["spec"]["template"]["metadata"]
        assert meta["annotations"]["example.com/owner"] == "gpu-team", name
        assert meta["labels"]["team"] == "gpu", name
        container = _container(obj, container_name)
        assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in container["env"], name
        assert {"name": "extra-ca", "mountPath": "/etc/corp-ca", "readOnly": True} in container[
            "volumeMounts"
        ]
        assert {"name": "extra-ca", "configMap": {"name": "corp-ca"}} in chart.pod_spec(obj)["volumes"], name
    # agent-only additions stay on the agent (a hostPath that only GPU nodes have)
    agent_only = {
        "agent.extraEnv": [{"name": "SHAPE", "value": "/nodes/$(NODE_NAME)/machine"}],
        "agent.extraVolumes": [{"name": "nodes", "hostPath": {"path": "/srv/nodes", "type": "Directory"}}],
        "agent.extraVolumeMounts": [{"name": "nodes", "mountPath": "/nodes", "readOnly": True}],
    }
    both = chart.template({**values, **agent_only})
    agent = chart.find(both, "DaemonSet", "-agent")
    env = _container(agent, "agent")["env"]
    assert env[0]["name"] == "NODE_NAME", "the agent's own variables come first, so $(NODE_NAME) expands"
    assert env[-2:] == [*values["extraEnv"], *agent_only["agent.extraEnv"]]  # type: ignore[misc]
    assert [v["name"] for v in chart.pod_spec(agent)["volumes"]][-2:] == ["extra-ca", "nodes"]
    assert [m["name"] for m in _container(agent, "agent")["volumeMounts"]][-2:] == ["extra-ca", "nodes"]
    for suffix in ("gpuslice", "-webhook"):
        assert "nodes" not in [v["name"] for v in chart.pod_spec(_deployment(both, suffix))["volumes"]]
    assert "--kube-api-qps=100" in _container(_deployment(objects), "kube-scheduler")["command"]
    assert "--kube-api-qps=100" not in _container(_deployment(objects), "gpuslice")["command"]
    assert _container(_deployment(objects), "gpuslice")["command"][-1] == "--qps=400"
    assert _container(_deployment(objects, "-webhook"), "webhook")["command"][-1] == "--deny-privileged"


# ------------------------------------------------------------------------------- standalone mode


def test_the_gpuslice_container_knows_its_own_pod() -> None:
    for values in ({}, {"scheduler.enabled": False}):
        env = _container(_deployment(chart.template(values)), "gpuslice")["env"]
        assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in env
        assert {
            "name": "POD_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        } in env


def test_standalone_extender_service_selects_the_leader_and_metrics_every_replica() -> None:
    objects = chart.template(
        {"scheduler.enabled": False, "replicas": 3, "metrics.serviceMonitor.enabled": True}
    )
    deployment = _deployment(objects)
    match = deployment["spec"]["selector"]["matchLabels"]
    assert "gpuslice.io/leader" not in match
    assert "gpuslice.io/leader" not in deployment["spec"]["template"]["metadata"]["labels"]
    extender = chart.find(objects, "Service", "gpuslice")
    assert extender["spec"]["selector"] == {**match, "gpuslice.io/leader": "true"}
    assert [p["name"] for p in extender["spec"]["ports"]] == ["extender"]
    metrics = chart.find(objects, "Service", "-metrics")
    assert metrics["spec"]["selector"] == match
    assert [p["name"] for p in metrics["spec"]["ports"]] == ["metrics"]
    config = yaml.safe_load(chart.find(objects, "ConfigMap", "-scheduler-config")["data"]["config.yaml"])
    assert config["extenders"][0]["urlPrefix"] == "https://gpuslice.gpuslice-system.svc:8888"
    monitor = chart.find(objects, "ServiceMonitor", "-scheduler")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]


def test_sidecar_service_selects_every_replica() -> None:
    objects = chart.template()
    service = chart.find(objects, "Service", "gpuslice")
    assert service["spec"]["selector"] == _deployment(objects)["spec"]["selector"]["matchLabels"]
    assert not [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"].endswith("-metrics")]


def _max_scaled_down(replicas: int, ready: int) -> int:
    """kubernetes pkg/controller/deployment/rolling.go: old pods a rollout may remove now, with one
    surge pod (new, ``ready`` of the ``replicas + 1`` pods Ready)."""
    max_unavailable = 0
    min_available = replicas - max_unavailable
    new_unavailable = 0 if ready == replicas + 1 else 1
    return max(0, (replicas + 1) - min_available - new_unavailable)


def _pdb_allows_eviction(replicas: int, ready: int, max_unavailable: int) -> bool:
    """kubernetes pkg/controller/disruption: disruptionsAllowed = currentHealthy - desiredHealthy."""
    return ready - (replicas - max_unavailable) > 0


@pytest.mark.parametrize("replicas", [2, 3])
def test_standalone_rollouts_and_drains_proceed_with_followers_ready(replicas: int) -> None:
    """The arithmetic that deadlocked when only the leader was Ready, with what the chart renders:
    every replica (and the surge pod) Ready, so a rollout removes an old pod and a drain evicts one."""
    objects = chart.template({"scheduler.enabled": False, "replicas": replicas})
    deployment = _deployment(objects)
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert _container(deployment, "gpuslice")["readinessProbe"]["httpGet"]["path"] == "/readyz"
    pdb = chart.find(objects, "PodDisruptionBudget", "gpuslice")["spec"]
    assert pdb["maxUnavailable"] == 1 and pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # followers Ready: the surge pod counts, so one old pod goes; before, only the leader was
    assert _max_scaled_down(replicas, ready=replicas + 1) == 1
    assert _max_scaled_down(replicas, ready=1) == 0
    assert _pdb_allows_eviction(replicas, ready=replicas, max_unavailable=pdb["maxUnavailable"])
    assert not _pdb_allows_eviction(replicas, ready=1, max_unavailable=pdb["maxUnavailable"])


def test_every_budget_lets_an_unhealthy_pod_be_evicted() -> None:
    objects = chart.template({"replicas": 3})
    budgets = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    assert len(budgets) == 2
    assert all(b["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow" for b in budgets)
    strict = chart.template({"podDisruptionBudget.unhealthyPodEvictionPolicy": "IfHealthyBudget"})
    assert chart.find(strict, "PodDisruptionBudget", "gpuslice")["spec"]["unhealthyPodEvictionPolicy"] == (
        "IfHealthyBudget"
    )


# ----------------------------------------------------------------------------------- certificates


def _tls_checksum(objects: list[dict[str, Any]], suffix: str) -> str | None:
    annotations = _deployment(objects, suffix)["spec"]["template"]["metadata"].get("annotations") or {}
    return annotations.get("checksum/tls")


def test_generated_certificates_agree_within_one_render(tmp_path: Path) -> None:
    objects = chart.template({"tls.clientCA": True})
    tls, client = _secret(objects, "gpuslice-tls"), _secret(objects, "-client-tls")
    assert set(tls) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}, "the CA key is kept to sign later"
    assert client["ca.crt"] == tls["ca.crt"]
    assert _verifies(tls["ca.crt"], tls["tls.crt"], tmp_path)
    assert _verifies(tls["ca.crt"], client["tls.crt"], tmp_path)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        bundle = chart.find(objects, kind, "-webhook")["webhooks"][0]["clientConfig"]["caBundle"]
        assert base64.b64decode(bundle).decode() == tls["ca.crt"]
    scheduler = hashlib.sha256((tls["ca.crt"] + tls["tls.crt"] + client["tls.crt"]).encode()).hexdigest()
    webhook = hashlib.sha256((tls["ca.crt"] + tls["tls.crt"]).encode()).hexdigest()
    assert _tls_checksum(objects, "gpuslice") == scheduler
    assert _tls_checksum(objects, "-webhook") == webhook


def test_no_pod_mounts_the_ca_key() -> None:
    objects = chart.template({"tls.clientCA": True}, tests=True)
    for obj in objects:
        if obj["kind"] not in ("Deployment", "DaemonSet", "Pod"):
            continue
        for volume in chart.pod_spec(obj).get("volumes", []):
            secret = volume.get("secret")
            if (
                secret
                and secret["secretName"].endswith("-tls")
                and not secret["secretName"].endswith("client-tls")
            ):
                keys = {item["key"] for item in secret.get("items", [])}
                assert keys and "ca.key" not in keys, (obj["metadata"]["name"], volume)


def test_certificates_from_cert_manager_or_a_secret_carry_no_checksum() -> None:
    """The chart cannot know them; the servers reload them from disk."""
    for values in (
        {"tls.mode": "certManager"},
        {"tls.mode": "secret", "tls.existingSecret": "mine", "tls.caBundle": "x"},
    ):
        objects = chart.template(values)
        assert _tls_checksum(objects, "gpuslice") is None and _tls_checksum(objects, "-webhook") is None


@pytest.fixture
def release_ns(control_plane: ControlPlane) -> Iterator[str]:
    name = f"chart-tls-{uuid.uuid4().hex[:6]}"
    status, body = control_plane.api_request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    assert status == 201, body
    yield name
    control_plane.api_request("DELETE", f"/api/v1/namespaces/{name}")


def _install_secrets(cp: ControlPlane, objects: list[dict[str, Any]], drop: tuple[str, ...] = ()) -> None:
    """What `helm install` leaves of the certificates: the rendered Secrets (less the keys in ``drop``)."""
    for obj in objects:
        if obj["kind"] != "Secret":
            continue
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["annotations"] = {  # Helm's ownership marks, which an upgrade checks
            "meta.helm.sh/release-name": "gpuslice",
            "meta.helm.sh/release-namespace": obj["metadata"]["namespace"],
        }
        for key in drop:
            obj["data"].pop(key, None)
        status, body = cp.api_request("POST", chart.resource_path(obj), obj)
        assert status == 201, body


def test_an_upgrade_keeps_the_certificates_and_rolls_no_pod(
    control_plane: ControlPlane, release_ns: str
) -> None:
    first = chart.template(namespace=release_ns, kubeconfig=control_plane.kubeconfig)
    _install_secrets(control_plane, first)
    upgrade = chart.template(namespace=release_ns, kubeconfig=control_plane.kubeconfig)
    assert _secret(upgrade, "gpuslice-tls") == _secret(first, "gpuslice-tls")
    assert _tls_checksum(upgrade, "gpuslice") == _tls_checksum(first, "gpuslice")
    assert _tls_checksum(upgrade, "-webhook") == _tls_checksum(first, "-webhook")


def test_turning_client_ca_on_for_an_existing_release_issues_a_client_certificate(
    control_plane: ControlPlane, release_ns: str, tmp_path: Path
) -> None:
    first = chart.template(namespace=release_ns, kubeconfig=control_plane.kubeconfig)
    _install_secrets(control_plane, first)
    upgrade = chart.template(
        {"tls.clientCA": True}, namespace=release_ns, kubeconfig=control_plane.kubeconfig
    )
    tls, client = _secret(upgrade, "gpuslice-tls"), _secret(upgrade, "-client-tls")
    assert tls == _secret(first, "gpuslice-tls"), "the serving certificate and CA stay"
    assert client["ca.crt"] == tls["ca.crt"] and _verifies(tls["ca.crt"], client["tls.crt"], tmp_path)
    # the scheduler pods mount the new client certificate, so they roll; the webhook's did not change
    assert _tls_checksum(upgrade, "gpuslice") != _tls_checksum(first, "gpuslice")
    assert _tls_checksum(upgrade, "-webhook") == _tls_checksum(first, "-webhook")
    # once installed, the client certificate is kept too
    _install_secrets(control_plane, [o for o in upgrade if o["metadata"]["name"].endswith("-client-tls")])
    again = chart.template({"tls.clientCA": True}, namespace=release_ns, kubeconfig=control_plane.kubeconfig)
    assert _secret(again, "-client-tls") == client


def test_a_release_whose_secret_lacks_the_ca_key_gets_new_certificates_for_client_ca(
    control_plane: ControlPlane, release_ns: str, tmp_path: Path
) -> None:
    """A secret written by a chart that did not keep the CA key: nothing can sign a client
    certificate with the old CA, so every certificate is made anew and the pods roll with them."""
    first = chart.template(namespace=release_ns, kubeconfig=control_plane.kubeconfig)
    _install_secrets(control_plane, first, drop=("ca.key",))
    kept = chart.template(namespace=release_ns, kubeconfig=control_plane.kubeconfig)
    kept_crt = _secret(kept, "gpuslice-tls")["tls.crt"]
    assert kept_crt == _secret(first, "gpuslice-tls")["tls.crt"], "kept while it suffices"
    upgrade = chart.template(
        {"tls.clientCA": True}, namespace=release_ns, kubeconfig=control_plane.kubeconfig
    )
    tls, client = _secret(upgrade, "gpuslice-tls"), _secret(upgrade, "-client-tls")
    assert tls["ca.crt"] != _secret(first, "gpuslice-tls")["ca.crt"] and "ca.key" in tls
    assert _verifies(tls["ca.crt"], tls["tls.crt"], tmp_path)
    assert _verifies(tls["ca.crt"], client["tls.crt"], tmp_path)
    bundle = chart.find(upgrade, "MutatingWebhookConfiguration", "-webhook")["webhooks"][0]["clientConfig"]
    assert base64.b64decode(bundle["caBundle"]).decode() == tls["ca.crt"]
    assert _tls_checksum(upgrade, "gpuslice") != _tls_checksum(first, "gpuslice")
    assert _tls_checksum(upgrade, "-webhook") != _tls_checksum(first, "-webhook")


def test_offline_renders_make_new_certificates_every_time() -> None:
    """What GitOps renderers see (no lookup): documented, so they use certManager or secret."""
    one, two = _secret(chart.template(), "gpuslice-tls"), _secret(chart.template(), "gpuslice-tls")
    assert one["ca.crt"] != two["ca.crt"]


# ---------------------------------------------------------------------------------------- agent


def test_the_agent_relies_on_the_nvidia_runtime_by_default() -> None:
    agent = chart.find(chart.template(), "DaemonSet", "-agent")
    spec = chart.pod_spec(agent)
    assert not [v for v in spec["volumes"] if "hostPath" in v]
    assert not [m for m in _container(agent, "agent")["volumeMounts"] if m["name"] == "nvml"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert "runtimeClassName" not in spec
    env = {e["name"]: e.get("value") for e in _container(agent, "agent")["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility" and env["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_an_nvml_library_path_is_mounted_without_a_type_check() -> None:
    path = "/run/nvidia/driver/usr/lib64/libnvidia-ml.so.1"
    agent = chart.find(
        chart.template(
            {
                "agent.nvmlLibrary": path,
                "agent.runtimeClassName": "nvidia",
                "agent.priorityClassName": "gpu-agents",
            }
        ),
        "DaemonSet",
        "-agent",
    )
    spec = chart.pod_spec(agent)
    assert {"name": "nvml", "hostPath": {"path": path, "type": ""}} in spec["volumes"]
    mounts = _container(agent, "agent")["volumeMounts"]
    assert {
        "name": "nvml",
        "mountPath": "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
        "readOnly": True,
    } in mounts
    assert spec["runtimeClassName"] == "nvidia" and spec["priorityClassName"] == "gpu-agents"


def test_the_priority_quota_admits_the_charts_critical_classes() -> None:
    assert not [o for o in chart.template() if o["kind"] == "ResourceQuota"]
    quota = chart.find(chart.template({"priorityQuota.enabled": True}), "ResourceQuota", "-critical-pods")
    assert quota["metadata"]["namespace"] == "gpuslice-system"
    assert quota["spec"]["hard"] == {"pods": "10000"}
    assert quota["spec"]["scopeSelector"]["matchExpressions"] == [
        {
            "scopeName": "PriorityClass",
            "operator": "In",
            "values": ["system-cluster-critical", "system-node-critical"],
        }
    ]


# -------------------------------------------------------------------------------------- webhook


def test_webhook_selectors_add_to_the_built_in_opt_outs() -> None:
    mine = {"key": "team", "operator": "In", "values": ["ml"]}
    objects = chart.template(
        {
            "webhook.namespaceSelector": {"matchLabels": {"gpu": "yes"}, "matchExpressions": [mine]},
            "webhook.objectSelector": {"matchExpressions": [mine]},
            "webhook.reinvocationPolicy": "IfNeeded",
        }
    )
    opt_out = {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}
    namespaces = {
        "key": "kubernetes.io/metadata.name",
        "operator": "NotIn",
        "values": ["kube-system", "gpuslice-system"],
    }
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        hook = chart.find(objects, kind, "-webhook")["webhooks"][0]
        assert hook["namespaceSelector"] == {
            "matchLabels": {"gpu": "yes"},
            "matchExpressions": [opt_out, namespaces, mine],
        }
        assert hook["objectSelector"] == {"matchExpressions": [opt_out, mine]}
    assert chart.find(objects, "MutatingWebhookConfiguration", "-webhook")["webhooks"][0][
        "reinvocationPolicy"
    ] == ("IfNeeded")
    default = chart.find(chart.template(), "MutatingWebhookConfiguration", "-webhook")["webhooks"][0]
    assert default["reinvocationPolicy"] == "Never"
    assert default["namespaceSelector"] == {"matchExpressions": [opt_out, namespaces]}
    assert default["objectSelector"] == {"matchExpressions": [opt_out]}


def test_the_webhook_metrics_are_scraped_over_https_with_the_charts_ca(tmp_path: Path) -> None:
    objects = chart.template({"metrics.serviceMonitor.enabled": True})
    monitor = chart.find(objects, "ServiceMonitor", "-webhook")
    service = chart.find(objects, "Service", "-webhook")
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"] and endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": "gpuslice-tls", "key": "ca.crt"}}
    cert = _secret(objects, "gpuslice-tls")["tls.crt"]
    sans = _openssl("x509", "-noout", "-ext", "subjectAltName", stdin=cert).stdout
    assert f"DNS:{endpoint['tlsConfig']['serverName']}" in sans, sans
    assert not [
        o
        for o in chart.template({"metrics.serviceMonitor.enabled": True, "webhook.enabled": False})
        if o["kind"] == "ServiceMonitor" and o["metadata"]["name"].endswith("-webhook")
    ]


# ------------------------------------------------------------------------------------- helm test


class _Handler(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        code = self.server.status if self.path in ("/readyz", "/healthz") else 404  # type: ignore[attr-defined]
        body = b"ok" if code == 200 else b"not ready: cache not synced"
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _serve(status: int, tls: tuple[Path, Path] | None = None) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.status = status  # type: ignore[attr-defined]
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _run_test_pod(
    objects: list[dict[str, Any]], env: dict[str, str], ca: Path
) -> subprocess.CompletedProcess[str]:
    """The rendered test pod's script and GPUSLICE_CHECKS, here, with the CA at a local path."""
    pod = chart.find(objects, "Pod", "-test")
    script = chart.find(objects, "ConfigMap", "-test")["data"]["helm-test.py"]
    [container] = pod["spec"]["containers"]
    assert container["command"] == ["python", "/etc/gpuslice/test/helm-test.py"]
    checks = json.loads(next(e["value"] for e in container["env"] if e["name"] == "GPUSLICE_CHECKS"))
    for check in checks:
        if "ca" in check:
            check["ca"] = str(ca)
    return subprocess.run(  # noqa: S603 - our interpreter and the chart's script
        [sys.executable, "-c", script],
        env={"PATH": os.environ.get("PATH", ""), **env, "GPUSLICE_CHECKS": json.dumps(checks)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_helm_test_pod_is_a_restricted_test_hook() -> None:
    objects = chart.template(tests=True)
    pod = chart.find(objects, "Pod", "-test")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert chart.find(objects, "ConfigMap", "-test")["metadata"]["annotations"]["helm.sh/hook"] == "test"
    [container] = pod["spec"]["containers"]
    assert container["image"] == _container(_deployment(objects), "gpuslice")["image"]
    security = container["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]
    assert security["capabilities"] == {"drop": ["ALL"]} and not security["allowPrivilegeEscalation"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    script = chart.find(objects, "ConfigMap", "-test")["data"]["helm-test.py"]
    assert script == (chart.CHART_DIR / "files" / "helm-test.py").read_text()
    assert not [o for o in chart.template() if o["kind"] == "Pod"], "helm install creates no test pod"


def test_the_helm_test_script_passes_on_healthy_services_and_says_what_failed(tmp_path: Path) -> None:
    objects = chart.template({"scheduler.enabled": False}, release="gs", tests=True)
    tls = _secret(objects, "gpuslice-tls")
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (tmp_path / name).write_text(tls[name])
    metrics = _serve(200)
    leader = _serve(200)
    webhook = _serve(200, tls=(tmp_path / "tls.crt", tmp_path / "tls.key"))
    env = {
        "GS_GPUSLICE_METRICS_SERVICE_HOST": "127.0.0.1",
        "GS_GPUSLICE_METRICS_SERVICE_PORT_METRICS": str(metrics.server_address[1]),
        "GS_GPUSLICE_SERVICE_HOST": "127.0.0.1",
        "GS_GPUSLICE_SERVICE_PORT_EXTENDER": str(leader.server_address[1]),
        "GS_GPUSLICE_WEBHOOK_SERVICE_HOST": "127.0.0.1",
        "GS_GPUSLICE_WEBHOOK_SERVICE_PORT_WEBHOOK": str(webhook.server_address[1]),
        "GPUSLICE_CHECK_TIMEOUT_S": "0",
    }
    try:
        ok = _run_test_pod(objects, env, tmp_path / "ca.crt")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert ok.stdout.count("ok ") == 3, ok.stdout
        metrics.status = 503  # type: ignore[attr-defined]
        failed = _run_test_pod(objects, env, tmp_path / "ca.crt")
        assert failed.returncode == 1
        assert "FAIL extender metrics: GET http://127.0.0.1:" in failed.stderr, failed.stderr
        assert "/readyz (Service gpuslice-system/gs-gpuslice-metrics" in failed.stderr
        assert "HTTP 503: not ready: cache not synced" in failed.stderr
        metrics.status = 200  # type: ignore[attr-defined]
        other_ca = _secret(chart.template(release="gs"), "gpuslice-tls")["ca.crt"]
        (tmp_path / "other-ca.crt").write_text(other_ca)
        wrong = _run_test_pod(objects, env, tmp_path / "other-ca.crt")
        assert wrong.returncode == 1 and "FAIL webhook" in wrong.stderr and "TLS failed" in wrong.stderr
        leader.shutdown()
        leader.server_close()
        gone = _run_test_pod(objects, env, tmp_path / "ca.crt")
        assert "FAIL extender API (leader): connect to tcp://127.0.0.1:" in gone.stderr, gone.stderr
    finally:
        for server in (metrics, webhook):
            server.shutdown()
            server.server_close()


# ---------------------------------------------------------------------------------------- NOTES


def test_notes_state_the_prerequisites_and_warn_about_register(
    control_plane: ControlPlane, release_ns: str
) -> None:
    def notes(*values: str) -> str:
        out = chart.helm(
            "install",
            "gs",
            str(chart.CHART_DIR),
            "-n",
            release_ns,
            "--dry-run=server",
            "--kubeconfig",
            str(control_plane.kubeconfig),
            *values,
        )
        return out[out.index("NOTES:") :]

    default = notes()
    assert "HAMi's device plugin" in default and "must run on the GPU nodes" in default
    assert "NVIDIA" in default and "container runtime" in default
    assert "agent.register" not in default
    assert "helm test gs" in default
    assert "kube-scheduler v1.34" in default
    warned = notes("--set", "agent.register=true")
    assert "WARNING: agent.register=true" in warned and "hami.io/node-nvidia-register" in warned
