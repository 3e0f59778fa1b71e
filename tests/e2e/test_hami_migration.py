"""Moving from HAMi's scheduler to gpuslice: the pods HAMi placed keep their cards (docs/hami-migration.md).

The cluster starts as HAMi left it. Two GPU nodes are registered as HAMi's device plugin registers
them: one in the JSON format of plugins from v2.8, one in the colon format of plugins up to v2.7.
``nodesim`` plays the plugin. Five running pods are placed through the API exactly as HAMi's
scheduler places them (``hamiwire.place``: the filter's annotations and label, the node lock,
``bind-phase: allocating``, the Binding; then the plugin's ``Allocate`` sets ``success``). They use
some cards whole (one with all of its memory, one with all of its cores), some in part, one across
two cards, and one card from two containers of a pod with an init container. HAMi's leader Lease
is left behind in ``kube-system``, as scaling HAMi's scheduler to 0 leaves it.

Then the chart is installed as the runbook says: ``scheduler.name=hami-scheduler``, the agent off.
Its scheduler pod (kube-scheduler + gpuslice) and webhook pod run as local processes with exactly
their rendered commands (``devcluster.podrun``, as in ``test_chart_install.py``).

Checked from the API alone (``gpuaudit``, which decodes with HAMi's formats, not gpuslice's codec):

- new GPU pods, some naming ``hami-scheduler`` and some naming no scheduler (the webhook names it),
  are bound with HAMi's annotations onto cards with room; one that fits a single card goes there,
  not to the card with more free memory whose cores a HAMi pod holds;
- no card is over its memory, cores or slots, and no card held whole is shared;
- a pod whose cards HAMi's filter had claimed, but which HAMi's scheduler never bound (it stopped
  between the two), is bound by gpuslice once the runbook's optional step has cleared that claim;
  left in place, the claim counts as held until it is older than the node lock expiry (5 min), and
  then gpuslice binds the pod over it (``test_a_leftover_hami_filter_claim_*``,
  ``test_a_young_hami_filter_claim_*``);
- HAMi's pods are untouched (annotations, labels, node and resourceVersion);
- gpuslice's per-card metrics count HAMi's grants;
- gpuslice holds its own Lease, and HAMi's is left alone;
- pods that fit only if HAMi's grants were ignored stay Pending, for the reason that names the grant,
  and ``gpuslice explain`` names the largest free memory that the grants leave.

``test_the_audit_flags_*`` shows that the audit can fail: fabricated clusters, each with one fault.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import re
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest

from gpuslice_dev import chart, devcluster, podrun
from gpuslice_dev.controlplane import ControlPlane, binaries_dir
from gpuslice_dev.paths import REPO_ROOT
from tests.e2e import chartrun, gpuaudit, hamiwire
from tests.e2e.hamiwire import Grant

pytestmark = pytest.mark.e2e

HAMI_SCHEDULER = "hami-scheduler"
HAMI_NAMESPACE = "kube-system"
RELEASE = "gpuslice"
NAMESPACE = "gpuslice-system"
WORK = "team"
WORK_LABEL = "gpuslice-migration-e2e"
SCHEDULER_POD = "gpuslice-7f9c6d-s1"
GPU, MEM, PCT, CORES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
)
USE_UUID = "nvidia.com/use-gpuuuid"
MiB = 1024 * 1024
LOCK_EXPIRY_S = 300
"""The chart's ``nodeLock.expiry`` (HAMi's default ``--node-lock-timeout``): a claim older is stale."""

A, B = "hami-a", "hami-b"
CARDS = {
    A: hamiwire.make_cards(A, "NVIDIA A100-PCIE-40GB", 4, 40960, numa=(0, 0, 1, 1)),
    B: hamiwire.make_cards(B, "NVIDIA-Tesla V100-PCIE-32GB", 2, 32768),
}
REGISTRATIONS = {
    A: hamiwire.encode_register_json(CARDS[A]),  # device plugin v2.8 and later
    B: hamiwire.encode_register_legacy(CARDS[B]),  # device plugin up to v2.7
}


def card(node: str, i: int) -> hamiwire.Card:
    return CARDS[node][i]


def grant(node: str, i: int, mib: int, cores: int) -> Grant:
    return Grant(card(node, i).uuid, mib, cores)


@dataclasses.dataclass(frozen=True)
class Ctr:
    name: str
    limits: Mapping[str, str]
    grants: tuple[Grant, ...] = ()


@dataclasses.dataclass(frozen=True)
class HamiPod:
    """A running pod as HAMi's scheduler placed it (limits as they are after HAMi's webhook)."""

    name: str
    node: str
    containers: tuple[Ctr, ...]
    init: tuple[Ctr, ...] = ()

    def body(self) -> dict[str, Any]:
        def spec(c: Ctr) -> dict[str, Any]:
            return {"name": c.name, "image": "pause", "resources": {"limits": dict(c.limits)}}

        pod_spec: dict[str, Any] = {
            "schedulerName": HAMI_SCHEDULER,
            "containers": [spec(c) for c in self.containers],
        }
        if self.init:
            pod_spec["initContainers"] = [spec(c) for c in self.init]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": self.name}, "spec": pod_spec}

    def grants(self) -> list[list[Grant]]:
        return [list(c.grants) for c in (*self.init, *self.containers)]


# Free afterwards (MiB / cores): a0 0/0, a1 10960/70, a2 10960/70, a3 12960/30, b0 16768/0, b1 16384/100.
HAMI_PODS = (
    # nvidia.com/gpu: 1 is a whole card; HAMi's webhook added the 100 cores
    HamiPod("h-whole", A, (Ctr("main", {GPU: "1", CORES: "100"}, (grant(A, 0, 40960, 100),)),)),
    HamiPod(
        "h-pair",
        A,
        (
            Ctr(
                "main",
                {GPU: "2", MEM: "30000", CORES: "30"},
                (grant(A, 1, 30000, 30), grant(A, 2, 30000, 30)),
            ),
        ),
    ),
    # an init container and a container without GPUs keep their (empty) entries
    HamiPod(
        "h-sidecars",
        A,
        (
            Ctr("train", {GPU: "1", MEM: "20000", CORES: "50"}, (grant(A, 3, 20000, 50),)),
            Ctr("log", {}),
            Ctr("eval", {GPU: "1", MEM: "8000", CORES: "20"}, (grant(A, 3, 8000, 20),)),
        ),
        init=(Ctr("setup", {}),),
    ),
    # half the memory but every core: nothing else may join this card
    HamiPod("h-cores", B, (Ctr("main", {GPU: "1", MEM: "16000", CORES: "100"}, (grant(B, 0, 16000, 100),)),)),
    HamiPod("h-percent", B, (Ctr("main", {GPU: "1", PCT: "50"}, (grant(B, 1, 16384, 0),)),)),
)

# HAMi's filter chose a2 for it and wrote its claim, then HAMi's scheduler stopped before the bind
# (a pod in flight at the handover). Kept to the A100s so that it leaves b1 to the tight pod below.
FILTERED = HamiPod("h-filtered", A, (Ctr("main", {GPU: "1", MEM: "5000"}, (grant(A, 2, 5000, 0),)),))
FILTERED_ANNOTATIONS = {"nvidia.com/use-gputype": "A100"}

# name -> (schedulerName or None for the webhook to set, limits). Small enough that every placement
# gpuslice may choose leaves room for the rest: the two-card pod always finds two cards on hami-a,
# and no card's cores fill up (a pod without cores cannot join a card whose cores are all taken).
NEW_PODS: dict[str, tuple[str | None, dict[str, str]]] = {
    "n-named-cores": (HAMI_SCHEDULER, {GPU: "1", MEM: "2000", CORES: "10"}),
    "n-named-mem": (HAMI_SCHEDULER, {GPU: "1", MEM: "3000"}),
    "n-hook-percent": (None, {PCT: "5"}),
    "n-hook-pair": (None, {GPU: "2", MEM: "1000"}),
    "n-hook-cores": (None, {MEM: "2500", CORES: "10"}),
}
# Fits one card only: b1 (16384 MiB free). b0 has more memory free, but HAMi's h-cores holds all of
# its cores; the A100s have at most 12960 MiB free.
TIGHT = ("n-tight", {GPU: "1", MEM: "16000"})


@dataclasses.dataclass
class Migration:
    cp: ControlPlane
    ports: dict[str, int]
    pods: list[podrun.RunningPod]
    before: dict[str, dict[str, Any]]
    """HAMi's pods as they were just before the chart was installed."""
    hami_lease: dict[str, Any]

    def logs(self) -> str:
        return chartrun.logs(self.pods)

    def wait(self, what: Callable[[], Any], timeout: float, message: str) -> Any:
        return chartrun.wait(self.pods, what, timeout, message)

    def pod(self, name: str) -> dict[str, Any]:
        status, obj = self.cp.api_request("GET", f"/api/v1/namespaces/{WORK}/pods/{name}")
        assert status == 200, obj
        return obj

    def create(
        self, name: str, scheduler: str | None, limits: Mapping[str, str], **ann: str
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "containers": [{"name": "main", "image": "pause", "resources": {"limits": dict(limits)}}]
        }
        if scheduler:
            spec["schedulerName"] = scheduler
        meta: dict[str, Any] = {"name": name, "annotations": dict(ann)} if ann else {"name": name}
        status, obj = self.cp.api_request(
            "POST",
            f"/api/v1/namespaces/{WORK}/pods",
            {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec},
        )
        assert status == 201, obj
        return obj

    def placed(self, names: Sequence[str], timeout: float = 90) -> dict[str, dict[str, Any]]:
        """The pods once each is bound and answered by the device plugin."""

        def done() -> dict[str, dict[str, Any]] | None:
            pods = {name: self.pod(name) for name in names}
            return pods if all(allocated_by_plugin(p) for p in pods.values()) else None

        found: dict[str, dict[str, Any]] = self.wait(
            done, timeout, f"not bound and allocated: {sorted(names)}"
        )
        return found

    def cluster(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        status, nodes = self.cp.api_request("GET", "/api/v1/nodes")
        assert status == 200, nodes
        status, pods = self.cp.api_request("GET", "/api/v1/pods")
        assert status == 200, pods
        return nodes["items"], pods["items"]

    def audit(self) -> gpuaudit.Audit:
        return gpuaudit.audit(*self.cluster())

    def events(self, name: str, reason: str) -> list[str]:
        """The messages of the pod's events with this reason."""
        status, body = self.cp.api_request(
            "GET", f"/api/v1/namespaces/{WORK}/events?fieldSelector=involvedObject.name%3D{name}"
        )
        assert status == 200, body
        return [e["message"] for e in body["items"] if e.get("reason") == reason]

    def gpuslice_events(self, name: str, reason: str) -> list[str]:
        """gpuslice's events with this reason about the pod, once there is one (gpuslice sends its
        events in the background)."""
        found: list[str] = self.wait(lambda: self.events(name, reason), 30, f"no {reason} event for {name}")
        return found

    def create_claimed(self, hp: HamiPod, written: int) -> None:
        """Create ``hp`` with the claim HAMi's filter wrote at ``written``, and no bind after it."""
        body = hp.body()  # created with the claim, so gpuslice never sees it without one
        claim = hamiwire.claim_metadata(hp.node, hp.grants())
        claim["annotations"][hamiwire.VGPU_TIME] = str(written)
        body["metadata"].update(claim, annotations={**FILTERED_ANNOTATIONS, **claim["annotations"]})
        status, created = self.cp.api_request("POST", f"/api/v1/namespaces/{WORK}/pods", body)
        assert status == 201, created

    def delete(self, name: str) -> None:
        self.cp.api_request("DELETE", f"/api/v1/namespaces/{WORK}/pods/{name}?gracePeriodSeconds=0")

    def failed_scheduling(self, name: str) -> str:
        """The pod's latest FailedScheduling message; fails at once if the pod gets bound instead."""

        def event() -> str | None:
            pod = self.pod(name)
            bound = pod["spec"].get("nodeName")
            assert not bound, f"{name} was bound to {bound}: {pod['metadata'].get('annotations')}"
            status, body = self.cp.api_request(
                "GET", f"/api/v1/namespaces/{WORK}/events?fieldSelector=involvedObject.name%3D{name}"
            )
            assert status == 200, body
            found = [e["message"] for e in body["items"] if e.get("reason") == "FailedScheduling"]
            return found[-1] if found else None

        message: str = self.wait(event, 30, f"no FailedScheduling event for {name}")
        return message


def allocated_by_plugin(pod: Mapping[str, Any]) -> bool:
    """The device plugin (nodesim) answered: bind-phase success, every entry handed out, pod Running."""
    ann = pod["metadata"].get("annotations") or {}
    return (
        ann.get(hamiwire.BIND_PHASE) == "success"
        and set(ann.get(hamiwire.TO_ALLOCATE, "x")) <= {";"}
        and pod.get("status", {}).get("phase") == "Running"
    )


def _place_as_hami(cp: ControlPlane) -> dict[str, dict[str, Any]]:
    """Create and place HAMi's pods one by one, each answered by the plugin; the pods as they end."""
    out = {}
    for hp in HAMI_PODS:
        status, created = cp.api_request("POST", f"/api/v1/namespaces/{WORK}/pods", hp.body())
        assert status == 201, created
        hamiwire.place(cp, created, hp.node, hp.grants())
        deadline = time.monotonic() + 30
        while True:
            status, pod = cp.api_request("GET", f"/api/v1/namespaces/{WORK}/pods/{hp.name}")
            if status == 200 and allocated_by_plugin(pod):
                break
            assert time.monotonic() < deadline, f"the device plugin never answered {hp.name}: {pod}"
            time.sleep(0.2)
        out[hp.name] = pod
    status, node = cp.api_request("GET", f"/api/v1/nodes/{A}")
    assert hamiwire.NODE_LOCK not in node["metadata"].get("annotations", {}), node["metadata"]
    return out


def _claim_as_hami_filter(cp: ControlPlane, hp: HamiPod) -> None:
    """A pod HAMi's filter wrote its claim on, left unbound (its scheduler stopped before the bind)."""
    body = hp.body()
    body["metadata"]["annotations"] = dict(FILTERED_ANNOTATIONS)
    status, created = cp.api_request("POST", f"/api/v1/namespaces/{WORK}/pods", body)
    assert status == 201, created
    hamiwire.filter_claim(cp, created, hp.node, hp.grants())


def clear_filter_claims(cp: ControlPlane) -> list[str]:
    """The runbook's step before gpuslice's scheduler starts: unbound pods' claims removed.

    As ``kubectl annotate pod NAME hami.io/vgpu-node- ...`` and ``kubectl label pod NAME
    hami.io/vgpu-node-`` would, with the pod's resourceVersion (a pod bound meanwhile is left alone).
    """
    status, pods = cp.api_request("GET", "/api/v1/pods")
    assert status == 200, pods
    cleared = []
    for pod in pods["items"]:
        meta = pod["metadata"]
        if pod["spec"].get("nodeName") or hamiwire.VGPU_NODE not in (meta.get("annotations") or {}):
            continue
        claim = dict.fromkeys(
            (
                hamiwire.VGPU_NODE,
                hamiwire.VGPU_TIME,
                hamiwire.TO_ALLOCATE,
                hamiwire.ALLOCATED,
                hamiwire.BIND_PHASE,
                hamiwire.BIND_TIME,
            )
        )
        patch = {
            "metadata": {
                "annotations": claim,
                "labels": {hamiwire.VGPU_NODE: None},
                "resourceVersion": meta["resourceVersion"],
            }
        }
        status, body = cp.api_request(
            "PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", patch
        )
        assert status == 200, body
        cleared.append(f"{meta['namespace']}/{meta['name']}")
    return cleared


def _hami_lease(cp: ControlPlane) -> dict[str, Any]:
    """The Lease HAMi's last leader left (its chart names it after ``schedulerName``)."""
    renewed = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": HAMI_SCHEDULER, "namespace": HAMI_NAMESPACE},
        "spec": {
            "holderIdentity": "hami-scheduler-6c8d9f7b5-q4xk2_0f1e2d3c",
            "leaseDurationSeconds": 15,
            "acquireTime": renewed,
            "renewTime": renewed,
        },
    }
    status, lease = cp.api_request(
        "POST", f"/apis/coordination.k8s.io/v1/namespaces/{HAMI_NAMESPACE}/leases", body
    )
    assert status == 201, lease
    return lease


def _values(ports: Mapping[str, int]) -> dict[str, object]:
    """The runbook's install (``scheduler.name=hami-scheduler``, agent off) plus this machine's ports."""
    return {
        "scheduler.name": HAMI_SCHEDULER,
        "agent.enabled": False,
        "scheduler.port": ports["scheduler"],
        "extender.port": ports["extender"],
        "extender.metricsPort": ports["metrics"],
        "webhook.port": ports["webhook"],
        "webhook.url": f"https://127.0.0.1:{ports['webhook']}",
        "webhook.failurePolicy": "Fail",
        "webhook.namespaceSelector": {"matchLabels": {WORK_LABEL: "on"}},
    }


@pytest.fixture(scope="module")
def migration(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Migration]:
    work = tmp_path_factory.mktemp("migration")
    cp = ControlPlane()
    cp.start()
    sim: devcluster.NodeSimThread | None = None
    runner: podrun.PodRunner | None = None
    try:
        for ns, labels in ((NAMESPACE, {}), (WORK, {WORK_LABEL: "on"})):
            status, body = cp.api_request(
                "POST", "/api/v1/namespaces", {"metadata": {"name": ns, "labels": labels}}
            )
            assert status == 201, body
        nodes = {
            name: {
                "model": cards[0].type,
                "count": len(cards),
                "memory_mib": cards[0].memory_mib,
                "annotations": {hamiwire.NODE_REGISTER: REGISTRATIONS[name]},
            }
            for name, cards in CARDS.items()
        }
        sim = devcluster.NodeSimThread(cp.kubeconfig, nodes).start()
        before = _place_as_hami(cp)
        _claim_as_hami_filter(cp, FILTERED)
        assert clear_filter_claims(cp) == [f"{WORK}/{FILTERED.name}"]
        hami_lease = _hami_lease(cp)

        ports = dict(
            zip(("scheduler", "extender", "metrics", "webhook"), chartrun.free_ports(4), strict=True)
        )
        objects = chart.template(_values(ports), release=RELEASE, namespace=NAMESPACE)
        for obj in objects:  # what `helm install` sends
            status, body = cp.api_request("POST", chart.resource_path(obj), obj)
            assert status == 201, f"{obj['kind']}/{obj['metadata']['name']}: {body}"
        runner = podrun.PodRunner(
            cp,
            objects,
            work / "pods",
            {
                "gpuslice": str(REPO_ROOT / ".venv" / "bin" / "gpuslice"),
                "kube-scheduler": str(binaries_dir() / "kube-scheduler"),
            },
        )
        m = Migration(cp, ports, [], before, hami_lease)
        for obj, pod_name in (
            (chart.find(objects, "Deployment", f"{RELEASE}-webhook"), f"{RELEASE}-webhook-w1"),
            (chart.find(objects, "Deployment", RELEASE), SCHEDULER_POD),
        ):
            m.pods.append(
                runner.start(
                    podrun.pod_template_of(obj), namespace=NAMESPACE, pod_name=pod_name, node_name="cp-0"
                )
            )
        ca = base64_secret(objects, f"{RELEASE}-tls", "ca.crt")
        ctx = ssl.create_default_context(cadata=ca)
        m.wait(
            lambda: chartrun.get(f"https://127.0.0.1:{ports['webhook']}/readyz", ctx)[0] == 200,
            60,
            "webhook not ready",
        )
        m.wait(
            lambda: chartrun.get(f"http://127.0.0.1:{ports['metrics']}/readyz")[0] == 200,
            60,
            "extender not ready",
        )
        yield m
    finally:
        if runner is not None:
            runner.stop_all()
        if sim is not None:
            sim.stop()
        cp.stop()


def base64_secret(objects: Sequence[Mapping[str, Any]], name: str, key: str) -> str:
    return base64.b64decode(chart.find(objects, "Secret", name)["data"][key]).decode()


def expected_grants(limits: Mapping[str, str], node: str, got: Sequence[Grant]) -> list[tuple[int, int]]:
    """(MiB, cores) per card the request asks for, on the cards it got (the percentage is per card)."""
    count = int(limits.get(GPU, "1"))
    by_uuid = {c.uuid: c for c in CARDS[node]}
    out = []
    for g in got[:count]:
        size = by_uuid[g.uuid].memory_mib if g.uuid in by_uuid else 0
        mib = int(limits[MEM]) if MEM in limits else size * int(limits[PCT]) // 100
        out.append((mib, int(limits.get(CORES, "0"))))
    return out + [(-1, -1)] * (count - len(out))


def _metric_per_card(text: str, family: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(family + "{"):
            labels, value = line[len(family) :].rsplit(" ", 1)
            found = re.search(r'device_uuid="([^"]+)"', labels)
            assert found, line
            out[found.group(1)] = float(value)
    return out


def assert_placed(name: str, pod: Mapping[str, Any], limits: Mapping[str, str]) -> None:
    """Bound with HAMi's annotations, one container's cards as it asked, on its node's cards."""
    ann, node = pod["metadata"]["annotations"], pod["spec"]["nodeName"]
    assert ann[hamiwire.VGPU_NODE] == node == pod["metadata"]["labels"][hamiwire.VGPU_NODE], name
    assert ann[hamiwire.VGPU_TIME].isdigit() and ann[hamiwire.BIND_TIME].isdigit(), ann
    (got,) = hamiwire.decode_pod_devices(ann[hamiwire.ALLOCATED])
    assert len({g.uuid for g in got}) == len(got), f"{name}: a container got one card twice: {got}"
    assert [(g.memory_mib, g.cores) for g in got] == expected_grants(limits, node, got), (name, limits, got)
    assert {g.uuid for g in got} <= {c.uuid for c in CARDS[node]}, (name, node, got)


@pytest.mark.timeout(300)
def test_running_hami_pods_keep_their_cards_and_new_pods_go_around_them(migration: Migration) -> None:
    m = migration
    # the pod HAMi's scheduler left between filter and bind, its claim cleared as the runbook says:
    # gpuslice binds it
    filtered = m.placed([FILTERED.name])[FILTERED.name]
    assert_placed(FILTERED.name, filtered, FILTERED.containers[0].limits)
    start = m.audit()
    assert start.problems == [], start.problems
    assert all(start.use[c.uuid].pods for cards in CARDS.values() for c in cards), "every card starts in use"

    tight_name, tight_limits = TIGHT
    m.create(tight_name, HAMI_SCHEDULER, tight_limits)
    tight = m.placed([tight_name])[tight_name]
    assert hamiwire.decode_pod_devices(tight["metadata"]["annotations"][hamiwire.ALLOCATED]) == [
        [Grant(card(B, 1).uuid, 16000, 0)]
    ]
    for name, (scheduler, limits) in NEW_PODS.items():
        created = m.create(name, scheduler, limits)
        # no schedulerName: the webhook names the scheduler the runbook keeps
        assert created["spec"]["schedulerName"] == HAMI_SCHEDULER, (name, created["spec"])
    new = m.placed(list(NEW_PODS))
    end = m.audit()
    assert end.problems == [], end.problems
    for name, pod in new.items():
        assert_placed(name, pod, NEW_PODS[name][1])  # limits as asked: the apiserver writes "2k" back

    # HAMi's pods: not one write since they were placed
    for name, was in m.before.items():
        now = m.pod(name)
        for field in ("annotations", "labels", "resourceVersion"):
            assert now["metadata"].get(field) == was["metadata"].get(field), (name, field)
        assert now["spec"]["nodeName"] == was["spec"]["nodeName"], name

    # gpuslice's own per-card view counts what HAMi granted (the runbook's metric check)
    status, text = chartrun.get(f"http://127.0.0.1:{m.ports['metrics']}/metrics")
    assert status == 200, text[:300]
    memory = _metric_per_card(text, "hami_gpu_memory_allocated_bytes")
    cores = _metric_per_card(text, "hami_gpu_core_allocated_ratio")
    for uuid, use in end.use.items():
        assert (memory.get(uuid), cores.get(uuid)) == (use.memory_mib * MiB, use.cores), uuid

    # two Leases in two namespaces: gpuslice leads on its own, HAMi's is left as it was
    status, lease = m.cp.api_request(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{HAMI_SCHEDULER}"
    )
    assert status == 200 and lease["spec"]["holderIdentity"].startswith(SCHEDULER_POD), lease
    status, hami = m.cp.api_request(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{HAMI_NAMESPACE}/leases/{HAMI_SCHEDULER}"
    )
    assert (
        status == 200 and hami["metadata"]["resourceVersion"] == m.hami_lease["metadata"]["resourceVersion"]
    )


@pytest.mark.timeout(300)
def test_pods_that_fit_only_if_hami_grants_were_ignored_stay_pending(migration: Migration) -> None:
    m = migration
    m.placed([FILTERED.name])
    now = m.audit()
    assert now.problems == [], now.problems
    b0 = card(B, 0).uuid
    largest_free = max(now.free_memory(u) for u in now.cards)
    # each probe fits an empty card; only what HAMi's pods hold keeps it out
    assert largest_free < 20000 <= max(c.memory_mib for c in now.cards.values()), largest_free
    assert all(u.pods for u in now.use.values()), "a whole card needs one nobody uses"
    assert now.free_cores(b0) == 0 and now.free_memory(b0) >= 1000, (now.use[b0], now.cards[b0])

    probes = {
        "p-larger-than-free": ({GPU: "1", MEM: "20000"}, {}),
        "p-whole-card": ({GPU: "1"}, {}),
        "p-cores-taken": ({GPU: "1", MEM: "1000"}, {USE_UUID: b0}),
    }
    for name, (limits, ann) in probes.items():
        m.create(name, HAMI_SCHEDULER, limits, **ann)
    messages = {name: m.failed_scheduling(name) for name in probes}
    assert "InsufficientGPUMemory" in messages["p-larger-than-free"], messages
    assert "ExclusiveConflict" in messages["p-cores-taken"], messages
    assert "0/2 nodes are available" in messages["p-whole-card"], messages
    time.sleep(3)  # retries after the first refusal change nothing
    for name in probes:
        pod = m.pod(name)
        assert not pod["spec"].get("nodeName"), (name, pod["spec"].get("nodeName"))
        assert hamiwire.VGPU_NODE not in (pod["metadata"].get("annotations") or {}), name

    # the runbook's check of a Pending pod, against the live cluster
    proc = subprocess.run(  # noqa: S603 - our own CLI
        [
            str(REPO_ROOT / ".venv" / "bin" / "gpuslice"),
            "explain",
            f"{WORK}/p-larger-than-free",
            "--kubeconfig",
            str(m.cp.kubeconfig),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["feasible"] == [], doc["feasible"]
    assert f"largest free is {largest_free} MiB" in doc["change"], doc["change"]


def _claimed_late(name: str) -> HamiPod:
    """A pod HAMi's filter claimed 1000 MiB of a1 for; HAMi's scheduler then stopped."""
    return HamiPod(name, A, (Ctr("main", {GPU: "1", MEM: "1000"}, (grant(A, 1, 1000, 0),)),))


@pytest.mark.timeout(120)
def test_a_leftover_hami_filter_claim_does_not_keep_its_pod_pending(migration: Migration) -> None:
    """A claim older than the node lock expiry, no lock naming the pod: gpuslice binds over it."""
    m = migration
    late = _claimed_late("h-claimed-late")
    written = int(time.time()) - LOCK_EXPIRY_S - 60
    m.create_claimed(late, written)
    try:
        pod = m.placed([late.name], timeout=30)[late.name]  # held, it would wait 5 minutes
        assert_placed(late.name, pod, late.containers[0].limits)
        ann = pod["metadata"]["annotations"]
        # the claim's every key is gpuslice's now: its time, and the device plugin took its entries
        assert int(ann[hamiwire.VGPU_TIME]) > written + LOCK_EXPIRY_S, ann
        (replaced,) = m.gpuslice_events(late.name, "StaleClaimReplaced")
        assert f"stale claim on node {A} (written at {written}" in replaced, replaced
        report = m.audit()
        assert report.problems == [], report.problems
    finally:
        m.delete(late.name)


@pytest.mark.timeout(120)
def test_a_young_hami_filter_claim_keeps_its_pod_pending_until_it_is_stale(migration: Migration) -> None:
    """A claim HAMi's scheduler could still bind counts as held; it turns stale with time alone."""
    m = migration
    late = _claimed_late("h-claimed-young")
    left_s = 15
    written = int(time.time()) - LOCK_EXPIRY_S + left_s
    stale_at = written + 1 + LOCK_EXPIRY_S  # its second's end, plus the expiry
    m.create_claimed(late, written)
    try:
        message = m.failed_scheduling(late.name)  # fails at once should the pod be bound meanwhile
        # the filter's reason; or, when the filter ran before gpuslice's watch showed the pod, the
        # bind's refusal, which judges the claim again once it holds the node lock
        assert "ForeignClaimHeld" in message or f"another scheduler's claim on node {A}" in message, message
        (note, *_) = m.gpuslice_events(late.name, "FilteringFailed")
        assert f"another scheduler's claim on node {A} (hami.io/vgpu-time {written}" in note, note
        assert time.time() < stale_at, "the claim went stale before the check: raise left_s"
        pod = m.placed([late.name], timeout=left_s + 45)[late.name]  # no pod or node write in between
        ann = pod["metadata"]["annotations"]
        assert int(ann[hamiwire.BIND_TIME]) >= stale_at, (ann, stale_at)  # not bound while held
        assert_placed(late.name, pod, late.containers[0].limits)
        (replaced,) = m.gpuslice_events(late.name, "StaleClaimReplaced")
        assert f"stale claim on node {A} (written at {written}" in replaced, replaced
        report = m.audit()
        assert report.problems == [], report.problems
    finally:
        m.delete(late.name)


# ----------------------------------------------------------------------------- the audit can fail


def _fake_cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """HAMi's pods as the fixture places them, as plain objects: a cluster the audit passes."""
    nodes = [
        {"metadata": {"name": name, "annotations": {hamiwire.NODE_REGISTER: REGISTRATIONS[name]}}}
        for name in CARDS
    ]
    pods = []
    for hp in HAMI_PODS:
        value = hamiwire.encode_pod_devices(hp.grants())
        ann = {hamiwire.VGPU_NODE: hp.node, hamiwire.ALLOCATED: value, hamiwire.TO_ALLOCATE: value}
        pods.append(
            {
                "metadata": {"namespace": WORK, "name": hp.name, "annotations": ann},
                "spec": {"nodeName": hp.node},
                "status": {"phase": "Running"},
            }
        )
    return nodes, pods


def _with_pod(node: str, grants: Sequence[Grant], name: str = "extra", **fields: Any) -> dict[str, Any]:
    value = hamiwire.encode_pod_devices([grants])
    return {
        "metadata": {
            "namespace": WORK,
            "name": name,
            "annotations": {hamiwire.VGPU_NODE: node, hamiwire.ALLOCATED: value},
        },
        "spec": {"nodeName": fields.get("bound", node)},
        "status": {"phase": fields.get("phase", "Running")},
    }


def test_the_audit_passes_the_cluster_hami_leaves() -> None:
    report = gpuaudit.audit(*_fake_cluster())
    assert report.problems == []
    a3 = report.use[card(A, 3).uuid]
    assert (a3.memory_mib, a3.cores, a3.grants) == (28000, 70, 2)
    assert report.free_memory(card(B, 0).uuid) == 16768 and report.free_cores(card(B, 0).uuid) == 0
    # a finished pod holds nothing: the same over-commit passes once its phase is Succeeded
    nodes, pods = _fake_cluster()
    pods.append(_with_pod(A, [grant(A, 1, 20000, 0)], phase="Succeeded"))
    assert gpuaudit.audit(nodes, pods).problems == []


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (_with_pod(A, [grant(A, 1, 11000, 0)]), "41000 MiB granted, 40960 registered"),
        (_with_pod(A, [grant(A, 3, 1000, 31)]), "101 % cores granted, 100 registered"),
        (_with_pod(A, [grant(A, 0, 0, 0)]), "held whole by ['team/h-whole']"),
        (_with_pod(B, [grant(B, 0, 1000, 0)]), "held whole by ['team/h-cores']"),
        (_with_pod(A, [grant(B, 1, 1000, 0)]), "is registered by node hami-b, not by hami-a"),
        (_with_pod(A, [Grant("GPU-unknown", 1000, 0)]), "is registered by no node"),
        (_with_pod(A, [grant(A, 1, 100, 0)], bound=B), "vgpu-node 'hami-a' but bound to 'hami-b'"),
        (_with_pod(A, [grant(A, 1, 100, 0)], bound=""), "claims cards on 'hami-a' but is not bound"),
    ],
    ids=["memory", "cores", "whole-memory", "whole-cores", "other-node", "unknown", "moved", "unbound"],
)
def test_the_audit_flags_a_fabricated_fault(extra: dict[str, Any], expected: str) -> None:
    nodes, pods = _fake_cluster()
    problems = gpuaudit.audit(nodes, [*pods, extra]).problems
    assert any(expected in p for p in problems), problems


def test_the_audit_flags_slots_and_undecodable_annotations() -> None:
    nodes, pods = _fake_cluster()
    many = [_with_pod(A, [grant(A, 1, 10, 0)], name=f"tiny-{i}") for i in range(10)]
    problems = gpuaudit.audit(nodes, [*pods, *many]).problems
    assert any("11 grants, 10 slots" in p for p in problems), problems
    broken = _with_pod(A, [])
    broken["metadata"]["annotations"][hamiwire.ALLOCATED] = "GPU-x,NVIDIA,lots,0:;"
    assert any("devices do not decode" in p for p in gpuaudit.audit(nodes, [*pods, broken]).problems)


def test_hamiwire_reads_hamis_own_examples() -> None:
    """The encodings of docs/hami-compat.md and HAMi's source, decoded (and the pod one re-encoded)."""
    value = ";GPU-a,NVIDIA,3000,30:GPU-b,NVIDIA,3000,30:;;"
    containers = hamiwire.decode_pod_devices(value)
    assert containers == [[], [Grant("GPU-a", 3000, 30), Grant("GPU-b", 3000, 30)], []]
    assert hamiwire.encode_pod_devices(containers) == value
    legacy = (
        "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
        "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
    )
    assert [(c.index, c.memory_mib, c.slots) for c in hamiwire.decode_register("n", legacy)] == [
        (0, 32768, 10),
        (1, 32768, 10),
    ]
    as_json = (
        '[{"id":"GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec","count":10,"devmem":32768,"devcore":100,'
        '"type":"NVIDIA-Tesla V100-PCIE-32GB","mode":"hami-core","health":true},'
        '{"id":"GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448","index":1,"count":10,"devmem":32768,"devcore":100,'
        '"type":"NVIDIA-Tesla V100-PCIE-32GB","numa":1,"mode":"hami-core","health":true}]'
    )
    cards = hamiwire.decode_register("n", as_json)
    assert hamiwire.encode_register_json(cards) == as_json
    assert hamiwire.decode_register("n", hamiwire.encode_register_legacy(cards)) == cards
