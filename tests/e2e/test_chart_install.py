"""The Helm chart, run for real: what ``helm template`` renders is what runs.

A control plane with an audit log gets every rendered object (ServiceAccounts, RBAC, ConfigMaps,
Secrets with the chart-generated certificates, webhook configurations, ...). Then the rendered pod
templates run as local processes (``devcluster.podrun``): the scheduler pod (kube-scheduler + the
gpuslice sidecar), the webhook pod and the agent pod on a fake GPU node, each with exactly its
rendered command, arguments, environment and mounted files, and its own ServiceAccount's token.
The only values set here are the ones any install sets for its environment: free ports (every
process shares this machine's network), the webhook's URL (the apiserver cannot reach Service IPs
without a cluster network), a namespace selector that keeps the webhook to this test's namespace,
and the agent's fake backend (no GPU here). ``nodesim`` stands in for HAMi's device plugin.

Checked from the API alone: GPU pods created without ``schedulerName`` are defaulted by the webhook
and bound by gpuslice onto the cards the agent registered; an invalid pod is refused at create
time; the audit log shows no 403 for any gpuslice component's account; and none of them can read
Secrets. The Grafana dashboard's metric names are checked against the live ``/metrics``.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuslice_dev import chart, devcluster, podrun
from gpuslice_dev.controlplane import ControlPlane, binaries_dir
from gpuslice_dev.paths import REPO_ROOT
from tests.e2e import chartrun

pytestmark = pytest.mark.e2e

RELEASE = "gs"
NAMESPACE = "gpuslice-system"
WORK_LABEL = "gpuslice-chart-e2e"
NODE = "chart-gpu-0"
AGENT_SHAPE = "t4-4"
FULLNAME = f"{RELEASE}-gpuslice"
ACCOUNTS = {c: f"system:serviceaccount:{NAMESPACE}:{FULLNAME}-{c}" for c in ("scheduler", "webhook", "agent")}

AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
"""


class Install:
    """The running install and handles for the tests."""

    def __init__(self, cp: ControlPlane, objects: list[dict[str, Any]], ports: dict[str, int], audit: Path):
        self.cp = cp
        self.objects = objects
        self.ports = ports
        self.audit = audit
        self.pods: list[podrun.RunningPod] = []
        self.ca = self.secret_data(f"{FULLNAME}-tls")["ca.crt"]

    def secret_data(self, name: str) -> dict[str, str]:
        secret = chart.find(self.objects, "Secret", name)
        return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}

    def https(self, port: int, path: str) -> tuple[int, str]:
        """GET over TLS, verified with the chart's CA (0 and the error when nothing answers)."""
        ctx = ssl.create_default_context(cadata=self.ca)
        return chartrun.get(f"https://127.0.0.1:{port}{path}", ctx)

    def http(self, port: int, path: str) -> tuple[int, str]:
        return chartrun.get(f"http://127.0.0.1:{port}{path}")

    def logs(self) -> str:
        return chartrun.logs(self.pods)

    def wait(self, what: Any, timeout: float, message: str) -> Any:
        return chartrun.wait(self.pods, what, timeout, message)

    def audit_events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.audit.read_text().splitlines() if line.strip()]


def _values(ports: dict[str, int]) -> dict[str, object]:
    return {
        "scheduler.port": ports["scheduler"],
        "extender.port": ports["extender"],
        "extender.metricsPort": ports["metrics"],
        "webhook.port": ports["webhook"],
        "webhook.url": f"https://127.0.0.1:{ports['webhook']}",
        "webhook.failurePolicy": "Fail",
        "webhook.namespaceSelector": {"matchLabels": {WORK_LABEL: "on"}},
        "agent.port": ports["agent"],
        "agent.backend": f"fake:{AGENT_SHAPE}",
        "agent.register": True,
        "tls.clientCA": True,
    }


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    work = tmp_path_factory.mktemp("chart")
    (work / "audit-policy.yaml").write_text(AUDIT_POLICY)
    audit = work / "audit.log"
    cp = ControlPlane(
        extra_apiserver_args=[
            f"--audit-policy-file={work / 'audit-policy.yaml'}",
            f"--audit-log-path={audit}",
        ]
    )
    cp.start()
    sim: devcluster.NodeSimThread | None = None
    runner: podrun.PodRunner | None = None
    try:
        ports = dict(
            zip(("scheduler", "extender", "metrics", "webhook", "agent"), chartrun.free_ports(5), strict=True)
        )
        objects = chart.template(_values(ports), release=RELEASE, namespace=NAMESPACE)
        for ns, labels in ((NAMESPACE, {}), ("chart-work", {WORK_LABEL: "on"})):
            status, body = cp.api_request(
                "POST", "/api/v1/namespaces", {"metadata": {"name": ns, "labels": labels}}
            )
            assert status == 201, body
        for obj in objects:  # what `helm install` sends
            status, body = cp.api_request("POST", chart.resource_path(obj), obj)
            assert status == 201, f"{obj['kind']}/{obj['metadata']['name']}: {body}"
        # A GPU node whose device plugin nodesim plays. With `agent.register` the agent is the
        # registrar, and it never overwrites a registration another component wrote: the one
        # nodesim created the node with (one A10) is removed, as on a node whose device plugin does
        # not register, and the agent registers what it discovers (the fake shape's four T4s).
        sim = devcluster.NodeSimThread(
            cp.kubeconfig,
            {NODE: {"model": "NVIDIA A10", "count": 1, "memory_mib": 24576, "labels": {"gpu": "on"}}},
        ).start()
        deadline = time.monotonic() + 30
        while cp.api_request("GET", f"/api/v1/nodes/{NODE}")[0] != 200:
            assert time.monotonic() < deadline, f"nodesim did not create {NODE}"
            time.sleep(0.1)
        status, body = cp.api_request(
            "PATCH",
            f"/api/v1/nodes/{NODE}",
            {"metadata": {"annotations": {"hami.io/node-nvidia-register": None}}},
        )
        assert status == 200, body
        runner = podrun.PodRunner(
            cp,
            objects,
            work / "pods",
            {
                "gpuslice": str(REPO_ROOT / ".venv" / "bin" / "gpuslice"),
                "kube-scheduler": str(binaries_dir() / "kube-scheduler"),
            },
        )
        inst = Install(cp, objects, ports, audit)
        deployment = chart.find(objects, "Deployment", FULLNAME)
        webhook = chart.find(objects, "Deployment", f"{FULLNAME}-webhook")
        agent = chart.find(objects, "DaemonSet", f"{FULLNAME}-agent")
        for obj, pod_name, node in (
            (agent, f"{FULLNAME}-agent-x1", NODE),
            (webhook, f"{FULLNAME}-webhook-w1", "cp-0"),
            (deployment, f"{FULLNAME}-s1", "cp-0"),
        ):
            template = podrun.pod_template_of(obj)
            inst.pods.append(runner.start(template, namespace=NAMESPACE, pod_name=pod_name, node_name=node))
        inst.wait(lambda: inst.https(ports["webhook"], "/readyz")[0] == 200, 60, "webhook not ready")
        inst.wait(lambda: inst.http(ports["metrics"], "/readyz")[0] == 200, 60, "extender not ready")
        inst.wait(lambda: inst.http(ports["agent"], "/healthz")[0] == 200, 60, "agent not healthy")

        def registered() -> bool:
            status, node = cp.api_request("GET", f"/api/v1/nodes/{NODE}")
            return status == 200 and "T4" in node["metadata"]["annotations"].get(
                "hami.io/node-nvidia-register", ""
            )

        inst.wait(registered, 60, "the agent did not register the fake T4s")
        yield inst
    finally:
        if runner is not None:
            runner.stop_all()
        if sim is not None:
            sim.stop()
        cp.stop()


def _pod(name: str, limits: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "chart-work"},
        "spec": {"containers": [{"name": "main", "image": "pause", "resources": {"limits": limits}}], **spec},
    }


def test_gpu_pods_without_a_scheduler_name_are_defaulted_and_scheduled(install: Install) -> None:
    cp = install.cp
    asks = {
        "whole-card": {"nvidia.com/gpu": "1"},
        "memory-slice": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"},
        "percentage-only": {"nvidia.com/gpumem-percentage": "25"},
    }
    for name, limits in asks.items():
        status, body = cp.api_request("POST", "/api/v1/namespaces/chart-work/pods", _pod(name, limits))
        assert status == 201, body
        assert body["spec"]["schedulerName"] == "gpuslice-scheduler", body["spec"]
    created = {name: cp.api_request("GET", f"/api/v1/namespaces/chart-work/pods/{name}")[1] for name in asks}
    assert (
        created["whole-card"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] == "100"
    )
    assert created["percentage-only"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"

    def bound() -> dict[str, dict[str, Any]] | None:
        pods = {n: cp.api_request("GET", f"/api/v1/namespaces/chart-work/pods/{n}")[1] for n in asks}
        return pods if all(p["spec"].get("nodeName") for p in pods.values()) else None

    pods = install.wait(bound, 60, "GPU pods not bound")
    status, node = cp.api_request("GET", f"/api/v1/nodes/{NODE}")
    registered = node["metadata"]["annotations"]["hami.io/node-nvidia-register"]
    uuids = set(re.findall(r"GPU-[0-9a-fA-F-]+", registered))
    for name, pod in pods.items():
        assert pod["spec"]["nodeName"] == NODE
        allocated = pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
        cards = set(re.findall(r"GPU-[0-9a-fA-F-]+", allocated))
        assert cards and cards <= uuids, (name, allocated, registered)


def test_an_invalid_gpu_pod_is_refused_at_create_time(install: Install) -> None:
    status, body = install.cp.api_request(
        "POST",
        "/api/v1/namespaces/chart-work/pods",
        _pod("bad", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"}),
    )
    assert status in (400, 403, 422), body
    assert "main" in body["message"] and "gpumem-percentage" in body["message"], body["message"]


def test_no_component_account_was_refused_and_none_can_read_secrets(install: Install) -> None:
    # Let each component run for a while (leases renewed, informers resynced, agent refreshes).
    time.sleep(3)
    events = install.audit_events()
    by_user: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_user.setdefault(event["user"]["username"], []).append(event)
    for component, user in ACCOUNTS.items():
        calls = by_user.get(user, [])
        assert calls, f"{component} never called the API as {user}"
        refused = [
            f"{e['verb']} {e['requestURI']}" for e in calls if e.get("responseStatus", {}).get("code") == 403
        ]
        assert not refused, f"{component} got 403s: {refused}"
    for component in ACCOUNTS:
        status, body = install.cp.api_request(
            "POST",
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{FULLNAME}-{component}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 600},
            },
        )
        assert status == 201, body
        token = body["status"]["token"]
        for path in (
            f"/api/v1/namespaces/{NAMESPACE}/secrets",
            "/api/v1/secrets",
            f"/api/v1/namespaces/{NAMESPACE}/secrets/{FULLNAME}-tls",
        ):
            code = _get_as(install.cp, token, path)
            assert code == 403, f"{component} got {code} for GET {path}"


def _get_as(cp: ControlPlane, token: str, path: str) -> int:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(cp.server + path, headers={"Authorization": f"Bearer {token}"})  # noqa: S310
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    try:
        with opener.open(request, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return err.code


def _exported(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split()[:4]
            names.add(family)
            if kind in ("histogram", "summary"):  # samples exist only once something was observed
                names |= {family + "_bucket", family + "_sum", family + "_count"}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_every_dashboard_query_names_an_exported_metric(install: Install) -> None:
    exported = set()
    for status, text in (
        install.http(install.ports["metrics"], "/metrics"),
        install.https(install.ports["webhook"], "/metrics"),
        install.http(install.ports["agent"], "/metrics"),
    ):
        assert status == 200, text[:500]
        exported |= _exported(text)
    dashboard = json.loads(chart.find(install.objects, "ConfigMap", "-dashboard")["data"]["gpuslice.json"])
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b(?:gpuslice|hami)_[a-z0-9_]+", target["expr"])
    }
    assert len(queried) >= 15
    missing = sorted(queried - exported)
    assert not missing, f"dashboard queries metrics nobody exports: {missing}"


def test_the_extender_requires_the_chart_client_certificate(install: Install) -> None:
    """``tls.clientCA``: a caller without the chart's client certificate is refused at the handshake;
    with it (what kube-scheduler presents, above) the extender answers."""
    port = install.ports["extender"]
    status, text = install.https(port, "/healthz")
    assert status == 0, (status, text)
    client = install.secret_data(f"{FULLNAME}-client-tls")
    ctx = ssl.create_default_context(cadata=install.ca)
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert.write_text(client["tls.crt"])
        key.write_text(client["tls.key"])
        ctx.load_cert_chain(cert, key)
    assert chartrun.get(f"https://127.0.0.1:{port}/healthz", ctx)[0] == 200


def test_standalone_mode_leads_with_its_own_lease(install: Install, tmp_path: Path) -> None:
    """``scheduler.enabled=false``: gpuslice alone, holding its own Lease with its rendered account;
    ready (the Service's signal that this replica takes calls) only once it leads."""
    cp, release, namespace = install.cp, "sa", "gpuslice-standalone"
    metrics, extender = chartrun.free_ports(2)
    values: dict[str, object] = {
        "scheduler.enabled": False,
        "webhook.enabled": False,
        "agent.enabled": False,
        "extender.port": extender,
        "extender.metricsPort": metrics,
    }
    objects = chart.template(values, release=release, namespace=namespace)
    status, body = cp.api_request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    assert status == 201, body
    for obj in objects:
        status, body = cp.api_request("POST", chart.resource_path(obj), obj)
        assert status == 201, f"{obj['kind']}/{obj['metadata']['name']}: {body}"
    deployment = chart.find(objects, "Deployment", f"{release}-gpuslice")
    assert [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]] == ["gpuslice"]
    runner = podrun.PodRunner(
        cp, objects, tmp_path, {"gpuslice": str(REPO_ROOT / ".venv" / "bin" / "gpuslice")}
    )
    try:
        install.pods.append(
            runner.start(
                podrun.pod_template_of(deployment),
                namespace=namespace,
                pod_name=f"{release}-gpuslice-a1",
                node_name="cp-0",
            )
        )
        # A synced follower is Ready too (``ok (follower)``); the leader answers plain ``ok``.
        install.wait(
            lambda: install.http(metrics, "/readyz")[1].strip() == "ok", 60, "standalone extender never led"
        )
        status, lease = cp.api_request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{release}-gpuslice"
        )
        assert status == 200 and lease["spec"]["holderIdentity"].startswith(f"{release}-gpuslice-a1"), lease
        user = f"system:serviceaccount:{namespace}:{release}-gpuslice-scheduler"
        calls = [e for e in install.audit_events() if e["user"]["username"] == user]
        assert calls, "no API call under the standalone account"
        refused = [
            f"{e['verb']} {e['requestURI']}" for e in calls if e.get("responseStatus", {}).get("code") == 403
        ]
        assert not refused, refused
    finally:
        runner.stop_all()
