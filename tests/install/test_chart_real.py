"""``helm install`` of the chart onto real nodes, then what an operator does with a release.

In order, on one release (sidecar mode: kube-scheduler with gpuslice beside it, two replicas):
install and check every component runs as a real container from the built images, under its own
ServiceAccount, reached through its Service; GPU pods created without ``schedulerName`` go through
the webhook, are scheduled by the chart's kube-scheduler and gpuslice, and run with HAMi's
environment from the device plugin; mTLS turned on for the existing release; ``helm upgrade``
rolling both scheduler pods while GPU pods keep arriving; ``helm test``; ``helm uninstall``.
Everything is checked from the API alone.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from gpuslice.codec import keys, pod_devices
from tests.install.conftest import CHART, FULLNAME, NAMESPACE, RELEASE, ChartCluster, helm_release_gone

pytestmark = [pytest.mark.install, pytest.mark.timeout(600)]

SCHEDULER_NAME = "gpuslice-scheduler"
GPU = "nvidia.com/gpu"
MEM = "nvidia.com/gpumem"
PCT = "nvidia.com/gpumem-percentage"
LEASE_DURATION_S = 15.0
RUN = "env; echo --env-end--; trap 'exit 0' TERM; while true; do sleep 1; done"


def gpu_pod(name: str, limits: dict[str, str]) -> dict[str, Any]:
    """A busybox pod asking for GPUs, with no ``schedulerName``: the webhook must set it."""
    return {
        "metadata": {"name": name, "labels": {"app": "gpu-work"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "containers": [
                {
                    "name": "main",
                    "image": "gpuslice.local/busybox:1",
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", RUN],
                    "resources": {"limits": limits},
                }
            ],
        },
    }


def stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def leader_pod(cluster: ChartCluster) -> dict[str, Any]:
    """The scheduler pod whose kube-scheduler holds the Lease (identity ``<pod name>_<uuid>``)."""
    holder = cluster.lease_holder(SCHEDULER_NAME)
    for pod in cluster.release_pods("scheduler"):
        if holder.startswith(pod["metadata"]["name"] + "_") and ready(pod):
            return pod
    raise AssertionError(f"no ready scheduler pod holds the Lease (holder {holder!r})")


def extender_metrics(cluster: ChartCluster) -> str:
    return f"http://{leader_pod(cluster)['status']['podIP']}:9395"


@pytest.fixture(scope="module")
def release(chart_cluster: ChartCluster) -> Iterator[ChartCluster]:
    """The chart installed with its defaults (plus where this cluster's NVML library lies)."""
    started = time.monotonic()
    chart_cluster.helm(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
        "--wait", "--timeout", "8m", *chart_cluster.node_values(),
    )  # fmt: skip
    print(f"helm install --wait: {time.monotonic() - started:.1f} s")
    yield chart_cluster
    if not helm_release_gone(chart_cluster):
        chart_cluster.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", check=False)


def test_components_run_from_the_images_under_their_accounts(release: ChartCluster) -> None:
    cluster = release
    scheduler = cluster.release_pods("scheduler")
    webhook = cluster.release_pods("webhook")
    agent = cluster.release_pods("agent")
    assert len(scheduler) == 2 and len(webhook) == 2, cluster.diagnostics()
    assert sorted(p["spec"]["nodeName"] for p in agent) == sorted(cluster.nodes), "one agent per GPU node"
    for pod in scheduler + webhook + agent:
        name = pod["metadata"]["name"]
        assert ready(pod), f"{name} not Ready\n{cluster.diagnostics()}"
        component = pod["metadata"]["labels"]["app.kubernetes.io/component"]
        assert pod["spec"]["serviceAccountName"] == f"{FULLNAME}-{component}", name
        for status in pod["status"]["containerStatuses"]:
            # a real container from an image containerd holds: an image digest, a container id
            assert status["imageID"].startswith("sha256:") or "@sha256:" in status["imageID"], status
            assert status["containerID"].startswith("containerd://"), status
            assert status["restartCount"] == 0, (name, status)
        images = {c["name"]: c["image"] for c in pod["spec"]["containers"]}
        for container, image in images.items():
            if container == "kube-scheduler":
                version = cluster.get("/version")["gitVersion"]
                assert image == f"registry.k8s.io/kube-scheduler:{version}", image
            else:
                assert image.startswith("ghcr.io/gpuslice/gpuslice:"), image
    # The scheduler Lease is held by one of the pods' kube-scheduler.
    leader_pod(cluster)
    # Services reach their pods: the webhook's endpoints are both webhook pods.
    slices = cluster.items(
        f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
        f"?labelSelector=kubernetes.io/service-name={FULLNAME}-webhook"
    )
    addresses = {
        a
        for s in slices
        for e in s.get("endpoints", [])
        for a in e["addresses"]
        if e["conditions"].get("ready")
    }
    assert addresses == {p["status"]["podIP"] for p in webhook}, (addresses, slices)
    # The agent read each node's cards through NVML (the fake library, mounted as the chart mounts
    # the driver's) and published them.
    for name, node in cluster.nodes.items():
        annotations = cluster.get(f"/api/v1/nodes/{name}")["metadata"].get("annotations", {})
        topology = annotations.get("gpuslice.io/gpu-topology", "")
        assert topology, f"{name}: the agent published no topology\n{cluster.diagnostics()}"
        assert topology.count("GPU-") >= node.cards, topology


def test_gpu_pods_go_through_the_webhook_and_run_with_hamis_environment(release: ChartCluster) -> None:
    cluster = release
    ns = cluster.namespace("gpu")
    requests = {
        "mib": {GPU: "1", MEM: "3000"},
        "pct": {GPU: "1", PCT: "25"},
        "two": {GPU: "2", MEM: "1024"},
    }
    for name, limits in requests.items():
        cluster.create(ns, gpu_pod(name, limits))
    for name in requests:
        pod = cluster.wait_running(ns, name, timeout=120)
        assert pod["spec"]["schedulerName"] == SCHEDULER_NAME, "the webhook did not set schedulerName"
        annotations = pod["metadata"]["annotations"]
        assert annotations.get(keys.BIND_PHASE) == keys.BIND_PHASE_SUCCESS, annotations
        decided = pod_devices.decode(annotations[keys.DEVICES_ALLOCATED])[0]
        env = cluster.env(ns, name, "main")
        assert env.get("NVIDIA_VISIBLE_DEVICES") == ",".join(g.uuid for g in decided), env
        for i, grant in enumerate(decided):
            assert env.get(f"CUDA_DEVICE_MEMORY_LIMIT_{i}") == f"{grant.memory_mib}m", (i, env)
        assert len(decided) == int(requests[name][GPU])
    # An impossible request is refused at create time by the validating webhook.
    status, body = cluster.cp.api_request(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        {**gpu_pod("bad", {GPU: "1", PCT: "150"}), "apiVersion": "v1", "kind": "Pod"},
    )
    assert status in (400, 403, 422), (status, body)
    assert "gpumem-percentage" in str(body.get("message", "")), body
    cluster.audit(extender_metrics(cluster))
    cluster.cp.api_request("DELETE", f"/api/v1/namespaces/{ns}")


def test_client_certificates_turned_on_for_the_existing_release(release: ChartCluster) -> None:
    cluster = release
    before = {p["metadata"]["name"] for p in cluster.release_pods("scheduler")}
    cluster.helm(
        "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values",
        "--set", "tls.clientCA=true", "--wait", "--timeout", "6m",
    )  # fmt: skip
    after = cluster.release_pods("scheduler")
    assert before.isdisjoint(p["metadata"]["name"] for p in after), "the scheduler pods did not roll"
    assert all(ready(p) for p in after), cluster.diagnostics()
    secret = cluster.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{FULLNAME}-client-tls")
    assert secret["data"].get("tls.crt") and secret["data"].get("tls.key")
    # kube-scheduler now presents the client certificate, and still gets GPU pods placed.
    ns = cluster.namespace("mtls")
    cluster.create(ns, gpu_pod("after-mtls", {GPU: "1", MEM: "1000"}))
    cluster.wait_running(ns, "after-mtls", timeout=120)
    cluster.audit(extender_metrics(cluster))
    cluster.cp.api_request("DELETE", f"/api/v1/namespaces/{ns}")


class Arrivals:
    """GPU pods created one a second, each deleted some seconds after it runs; waits recorded."""

    def __init__(self, cluster: ChartCluster, ns: str, period_s: float = 1.0, keep_s: float = 6.0) -> None:
        self.cluster = cluster
        self.ns = ns
        self.period_s = period_s
        self.keep_s = keep_s
        self.created: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.deleted: set[str] = set()
        self.stop = threading.Event()
        self.errors: list[str] = []
        self._threads = [
            threading.Thread(target=self._create, daemon=True),
            threading.Thread(target=self._watch, daemon=True),
        ]

    def __enter__(self) -> Arrivals:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _create(self) -> None:
        n = 0
        while not self.stop.is_set():
            name = f"arrive-{n:03d}"
            status, body = self.cluster.cp.api_request(
                "POST",
                f"/api/v1/namespaces/{self.ns}/pods",
                {**gpu_pod(name, {GPU: "1", MEM: "500"}), "apiVersion": "v1", "kind": "Pod"},
            )
            if status == 201:
                self.created[name] = time.time()
            else:
                self.errors.append(f"create {name}: {status} {body}")
            n += 1
            self.stop.wait(self.period_s)

    def _watch(self) -> None:
        while not self.stop.is_set() or len(self.bound) < len(self.created):
            if self.stop.is_set() and time.time() - max(self.created.values(), default=0) > 120:
                return
            for pod in self.cluster.items(f"/api/v1/namespaces/{self.ns}/pods"):
                name = pod["metadata"]["name"]
                if name not in self.bound and pod["spec"].get("nodeName"):
                    self.bound[name] = time.time()
                if (
                    name in self.bound
                    and name not in self.deleted
                    and time.time() - self.bound[name] > self.keep_s
                    and pod.get("status", {}).get("phase") == "Running"
                ):
                    self.cluster.cp.api_request(
                        "DELETE", f"/api/v1/namespaces/{self.ns}/pods/{name}?gracePeriodSeconds=1"
                    )
                    self.deleted.add(name)
            time.sleep(0.25)

    def waits(self) -> dict[str, float]:
        return {name: self.bound[name] - t for name, t in self.created.items() if name in self.bound}


class LeaseLog:
    """The scheduler Lease sampled four times a second: who held it, and when it was renewed."""

    def __init__(self, cluster: ChartCluster) -> None:
        self.cluster = cluster
        self.samples: list[tuple[float, str, float | None]] = []
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LeaseLog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{SCHEDULER_NAME}"
        while not self.stop.is_set():
            status, body = self.cluster.cp.api_request("GET", path)
            if status == 200:
                spec = body.get("spec", {})
                renew = spec.get("renewTime")
                self.samples.append(
                    (time.time(), spec.get("holderIdentity") or "", stamp(renew) if renew else None)
                )
            self.stop.wait(0.25)

    def holders(self) -> list[str]:
        out: list[str] = []
        for _, holder, _ in self.samples:
            if holder and (not out or out[-1] != holder):
                out.append(holder)
        return out

    def leaderless_s(self) -> float:
        """The longest stretch with no valid leader: from the last renewal of one holder to the
        first renewal of the next."""
        worst = 0.0
        last: tuple[str, float] | None = None
        for _, holder, renew in self.samples:
            if not holder or renew is None:
                continue
            if last is not None and holder != last[0]:
                worst = max(worst, renew - last[1])
            last = (holder, renew)
        return worst


def test_upgrade_rolls_both_scheduler_pods_while_gpu_pods_arrive(release: ChartCluster) -> None:
    cluster = release
    ns = cluster.namespace("rollout")
    before = {p["metadata"]["name"] for p in cluster.release_pods("scheduler")}
    first_holder = cluster.lease_holder(SCHEDULER_NAME)
    with LeaseLog(cluster) as leases, Arrivals(cluster, ns) as arrivals:
        time.sleep(10)
        upgrade_start = time.time()
        cluster.helm(
            "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values",
            "--set", "extender.verbosity=3", "--wait", "--timeout", "6m",
        )  # fmt: skip
        upgrade_s = time.time() - upgrade_start
        time.sleep(15)
    waits = arrivals.waits()
    after = cluster.release_pods("scheduler")
    assert not arrivals.errors, arrivals.errors[:5]
    assert before.isdisjoint(p["metadata"]["name"] for p in after), "both scheduler pods must be replaced"
    assert len(after) == 2 and all(ready(p) for p in after), cluster.diagnostics()
    holders = leases.holders()
    assert holders[0] == first_holder and len(holders) >= 2, f"leadership never moved: {holders}"
    assert cluster.lease_holder(SCHEDULER_NAME).split("_")[0] in {p["metadata"]["name"] for p in after}
    unbound = sorted(set(arrivals.created) - set(waits))
    assert not unbound, f"pods never bound: {unbound}\n{cluster.diagnostics()}"
    during = [w for name, w in waits.items() if arrivals.created[name] >= upgrade_start - 1]
    worst = max(waits.values())
    print(
        f"upgrade: {upgrade_s:.1f} s; {len(waits)} GPU pods arrived ({len(during)} during and after the"
        f" upgrade); wait median {statistics.median(waits.values()):.2f} s, max {worst:.2f} s;"
        f" leader changes {len(holders) - 1}; longest time without a leader {leases.leaderless_s():.2f} s"
    )
    assert worst <= LEASE_DURATION_S + 10, f"a pod waited {worst:.1f} s for its node"
    # No card handed out twice, with the pods still there; then all of them gone.
    cluster.audit(extender_metrics(cluster))
    cluster.cp.api_request("DELETE", f"/api/v1/namespaces/{ns}")


def test_helm_test_runs_its_check_pod(release: ChartCluster) -> None:
    """``helm test`` runs the chart's check pod (deleted once it succeeded, by its hook policy);
    helm exits non-zero when the pod fails."""
    cluster = release
    proc = cluster.helm("test", RELEASE, "--namespace", NAMESPACE, "--timeout", "3m")
    print(proc.stdout[-1500:])
    phases = [line.split(":", 1)[1].strip() for line in proc.stdout.splitlines() if line.startswith("Phase:")]
    assert phases and set(phases) == {"Succeeded"}, proc.stdout


# What `helm uninstall` leaves, as docs/install.md ("Uninstalling") lists it: gpuslice's own node
# annotations, and the Lease kube-scheduler created at run time.
DOCUMENTED_LEFTOVER_ANNOTATIONS = {
    "gpuslice.io/gpu-topology",
    "gpuslice.io/gpu-telemetry",
    "gpuslice.io/capacity-freed",
}


def test_uninstall_leaves_what_the_docs_say(release: ChartCluster) -> None:
    cluster = release
    cluster.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "3m")
    selector = f"app.kubernetes.io/instance={RELEASE}"
    kinds = [
        "/api/v1/pods", "/api/v1/services", "/api/v1/configmaps", "/api/v1/secrets",
        "/api/v1/serviceaccounts", "/apis/apps/v1/deployments", "/apis/apps/v1/daemonsets",
        "/apis/policy/v1/poddisruptionbudgets", "/apis/rbac.authorization.k8s.io/v1/roles",
        "/apis/rbac.authorization.k8s.io/v1/rolebindings", "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
    ]  # fmt: skip

    def left() -> list[str]:
        return [
            f"{kind} {o['metadata'].get('namespace', '')}/{o['metadata']['name']}"
            for kind in kinds
            for o in cluster.items(f"{kind}?labelSelector={selector}")
        ]

    cluster.wait(lambda: not left(), 120, "objects of the release left after uninstall")
    # The webhook configurations are gone whatever their labels: a leftover one would intercept
    # every pod create.
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        names = [
            o["metadata"]["name"] for o in cluster.items(f"/apis/admissionregistration.k8s.io/v1/{kind}")
        ]
        assert not [n for n in names if FULLNAME in n], names
    # A pod asking for GPUs is no longer mutated: nothing intercepts it.
    ns = cluster.namespace("after")
    created = cluster.create(ns, gpu_pod("plain", {GPU: "1"}))
    assert created["spec"]["schedulerName"] == "default-scheduler", created["spec"]
    cluster.cp.api_request("DELETE", f"/api/v1/namespaces/{ns}")
    # What stays is what the docs list.
    for name in cluster.nodes:
        annotations = cluster.get(f"/api/v1/nodes/{name}")["metadata"].get("annotations", {})
        ours = {k for k in annotations if k.startswith("gpuslice.io/")}
        assert ours <= DOCUMENTED_LEFTOVER_ANNOTATIONS, ours
    assert (
        cluster.lease_holder(SCHEDULER_NAME) != ""
        or cluster.cp.api_request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{SCHEDULER_NAME}"
        )[0]
        == 200
    ), "the documented kube-scheduler Lease"
