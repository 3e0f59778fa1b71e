"""Chaos tier fixtures: one control plane and one set of fake GPU nodes for the whole tier.

``chaos_session`` starts etcd + kube-apiserver and ``nodesim`` (nine fake nodes: eight with four
A100 80 GB cards for the workloads, and ``chaos-solo`` with one card, tainted, for the restart
case). The function fixture ``chaos`` hands each test a ``Chaos`` with helpers to start
``gpuslice serve`` replicas (short fault settings, a unique ``--leader-identity`` each), point
kube-scheduler at a URL, create pods and audit; afterwards it stops every process the test
started, deletes the test's pods, restores every node (plugin started, registration as created,
no lock) and deletes the extender's Lease, so tests do not leak into each other.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuslice.codec import keys, registrations
from gpuslice.model import devices
from gpuslice_dev import devcluster, nodesim
from gpuslice_dev.controlplane import ControlPlane
from tests.chaos import audit

SCHEDULER = "gpuslice-chaos"
"""The kube-scheduler profile the chaos pods name."""
NOBODY = "nobody-schedules-this"
"""A scheduler name no scheduler serves: pods the tests drive through the extender directly."""
MODEL = "NVIDIA A100-SXM4-80GB"
CARD_MIB = 81920
GPUS_PER_NODE = 4
WORK_NODES = tuple(f"chaos-{i}" for i in range(8))
SOLO = "chaos-solo"
SOLO_TAINT = {"key": "chaos.gpuslice.io/solo", "value": "true", "effect": "NoSchedule"}
SOLO_TOLERATION = {
    "key": "chaos.gpuslice.io/solo",
    "operator": "Equal",
    "value": "true",
    "effect": "NoSchedule",
}
REPORT_PERIOD_S = 2.0
"""The device-plugin stand-in's handshake period (HAMi: 30 s)."""

LEASE_NAME = "gpuslice-extender"
LEASE_NAMESPACE = "kube-system"
LEASE_DURATION_S = 4.0
ALLOCATE_TIMEOUT_S = 6.0
FAULT_ARGS = (
    "--orphan-grace-s",
    "3",
    "--commit-deadline-s",
    "2",
    "--allocate-timeout-s",
    str(ALLOCATE_TIMEOUT_S),
    "--stuck-lock-s",
    "3",
    "--handshake-timeout-s",
    "6",
    "--recovery-period-s",
    "0.5",
    "--leader-elect",
    "lease",
    "--lease-name",
    LEASE_NAME,
    "--lease-namespace",
    LEASE_NAMESPACE,
    "--lease-duration-s",
    str(LEASE_DURATION_S),
    "--renew-deadline-s",
    "3",
    "--retry-period-s",
    "0.5",
    "--watch-timeout-s",
    "20",
    "-v",
    "2",
)
"""``gpuslice serve`` flags of every replica: fault settings short enough that the tier's bounds
(seconds, not the defaults' minutes) can be checked, and a short own Lease (``lease`` mode)."""


def node_spec(node: str) -> dict[str, Any]:
    """``nodesim.make_node`` arguments of a chaos node."""
    count = 1 if node == SOLO else GPUS_PER_NODE
    return {
        "model": MODEL,
        "count": count,
        "memory_mib": CARD_MIB,
        "numa_nodes": 1 if count == 1 else 2,
        "labels": {"kubernetes.io/hostname": node},
    }


def inventory(node: str) -> tuple[devices.GpuDevice, ...]:
    """The cards a chaos node registers."""
    spec = node_spec(node)
    return nodesim.cards(
        node,
        model=spec["model"],
        count=spec["count"],
        memory_mib=spec["memory_mib"],
        numa_nodes=spec["numa_nodes"],
    )


def post_json(url: str, body: Mapping[str, Any], timeout: float = 10.0) -> tuple[int, Any]:
    """POST JSON; (status, decoded body or text); status 0 when nothing answered."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback
            text = resp.read().decode()
            status = int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as err:
        return 0, str(err)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def metric_sum(url: str, name: str, labels: Mapping[str, str] | None = None) -> float | None:
    """Sum of a metric's samples (matching ``labels``) from ``<url>/metrics``; None if unreachable."""
    try:
        text = audit.scrape(url, timeout=2.0)
    except OSError:
        return None
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if labels and not all(f'{k}="{v}"' in line for k, v in labels.items()):
            continue
        total += float(line.rsplit(" ", 1)[1])
    return total


class Chaos:
    """What a chaos test works with (see the module docstring)."""

    def __init__(self, cp: ControlPlane, sim: devcluster.NodeSimThread, work: Path) -> None:
        self.cp = cp
        self.sim = sim
        self.work = work
        self.extenders: list[devcluster.Extender] = []
        self.proxies: list[devcluster.ServiceProxy] = []
        self.namespaces: list[str] = []

    # ----- processes

    def extender(
        self,
        identity: str,
        *,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        port: int | None = None,
    ) -> devcluster.Extender:
        """A ``gpuslice serve`` replica (not started) with the tier's fault settings."""
        ext = devcluster.Extender(
            self.cp.kubeconfig,
            self.work / f"gpuslice-{identity}.log",
            port=port,
            extra_args=[
                *FAULT_ARGS,
                "--leader-identity",
                identity,
                "--scheduler-name",
                SCHEDULER,
                *extra_args,
            ],
            env=env,
        )
        self.extenders.append(ext)
        return ext

    def proxy(self, backends: Sequence[str]) -> devcluster.ServiceProxy:
        """A started ``ServiceProxy`` over the given replicas."""
        proxy = devcluster.ServiceProxy(backends).start()
        self.proxies.append(proxy)
        return proxy

    def point_scheduler(self, url: str) -> None:
        """(Re)start kube-scheduler with gpuslice's rendered configuration for ``url``."""
        self.cp.stop_scheduler()
        self.cp.start_scheduler(devcluster.render_scheduler_config(url, self.cp.kubeconfig, SCHEDULER))

    # ----- API helpers

    def namespace(self, prefix: str) -> str:
        """A fresh namespace, cleaned up after the test."""
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        status, body = self.cp.api_request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        assert status == 201, body
        self.namespaces.append(name)
        return name

    def create_pod(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create a pod from a full body."""
        ns = body["metadata"]["namespace"]
        status, obj = self.cp.api_request("POST", f"/api/v1/namespaces/{ns}/pods", body)
        assert status == 201, obj
        return obj

    def pod(self, ns: str, name: str) -> dict[str, Any]:
        """One pod."""
        status, obj = self.cp.api_request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
        assert status == 200, obj
        return obj

    def pods(self, ns: str) -> list[dict[str, Any]]:
        """Every pod of a namespace."""
        status, body = self.cp.api_request("GET", f"/api/v1/namespaces/{ns}/pods", timeout=30)
        assert status == 200, body
        items: list[dict[str, Any]] = body.get("items") or []
        return items

    def bound(self, ns: str) -> dict[str, str]:
        """Pod name -> node, for the namespace's bound pods."""
        return {
            p["metadata"]["name"]: p["spec"]["nodeName"] for p in self.pods(ns) if p["spec"].get("nodeName")
        }

    def events(self, ns: str, name: str | None = None) -> list[dict[str, Any]]:
        """Core-view events of a namespace (of one object when ``name`` is given)."""
        path = f"/api/v1/namespaces/{ns}/events"
        if name is not None:
            path += f"?fieldSelector=involvedObject.name%3D{name}"
        status, body = self.cp.api_request("GET", path)
        assert status == 200, body
        items: list[dict[str, Any]] = body.get("items") or []
        return items

    def node(self, name: str) -> dict[str, Any]:
        """One node."""
        status, obj = self.cp.api_request("GET", f"/api/v1/nodes/{name}")
        assert status == 200, obj
        return obj

    def patch_node_annotations(self, name: str, changes: Mapping[str, str | None]) -> None:
        """Merge-patch a node's annotations (None removes one)."""
        status, obj = self.cp.api_request(
            "PATCH", f"/api/v1/nodes/{name}", {"metadata": {"annotations": dict(changes)}}
        )
        assert status == 200, obj

    def wait(self, what: Callable[[], Any], timeout: float, message: str, period: float = 0.2) -> Any:
        """Poll until ``what()`` is truthy; fail with the extenders' log tails after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            got = what()
            if got:
                return got
            if time.monotonic() >= deadline:
                break
            time.sleep(period)
        tails = "\n".join(f"--- {e.log_path.name} ---\n{e.tail(30)}" for e in self.extenders)
        raise AssertionError(f"timed out after {timeout:.0f} s: {message}\n{tails}")

    def wait_quiet(self, ns: str, quiet_s: float = 5.0, timeout: float = 90.0) -> float:
        """Wait until the namespace's set of bound pods has not changed for ``quiet_s``."""
        start = last_change = time.monotonic()
        last = self.bound(ns)
        while time.monotonic() - start < timeout:
            time.sleep(0.5)
            now = self.bound(ns)
            if now != last:
                last, last_change = now, time.monotonic()
            elif time.monotonic() - last_change >= quiet_s:
                break
        return time.monotonic() - start

    def audit(
        self,
        extender: devcluster.Extender | None,
        *,
        registrations_: Mapping[str, Sequence[devices.GpuDevice]] | None = None,
        settle_timeout: float = 30.0,
    ) -> audit.AuditReport:
        """``audit.audit`` of the whole cluster, comparing ``extender``'s gauges when given."""
        return audit.audit(
            self.cp,
            extender_url=None if extender is None else extender.url,
            registrations=registrations_,
            settle_timeout=settle_timeout,
        )

    # ----- cleanup

    def cleanup(self) -> None:
        """Stop what the test started and restore the shared cluster (see the module docstring)."""
        self.cp.stop_scheduler()
        for proxy in self.proxies:
            proxy.stop()
        for ext in self.extenders:
            ext.kill()  # no graceful drain needed: the cleanup below resets what it leaves
        if self.cp.apiserver_frozen:
            self.cp.thaw_apiserver()
        for ns in self.namespaces:
            self.cp.api_request("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0", timeout=60)
            self.cp.api_request("DELETE", f"/api/v1/namespaces/{ns}")
        sim = self.sim.sim
        for node in sorted(sim.stopped | sim.muted):
            self.sim.start_node(node)
        for node in (*WORK_NODES, SOLO):
            self.patch_node_annotations(
                node, {keys.NODE_REGISTER: registrations.encode_json(inventory(node)), keys.NODE_LOCK: None}
            )
        self.cp.api_request(
            "DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{LEASE_NAME}"
        )


@pytest.fixture(scope="session")
def chaos_session(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ControlPlane, devcluster.NodeSimThread, Path]]:
    """The tier's control plane and fake nodes (no scheduler, no extender)."""
    work = tmp_path_factory.mktemp("chaos")
    cp = ControlPlane()
    cp.start()
    sim: devcluster.NodeSimThread | None = None
    try:
        specs = {name: node_spec(name) for name in (*WORK_NODES, SOLO)}
        sim = devcluster.NodeSimThread(cp.kubeconfig, specs, report_period_s=REPORT_PERIOD_S).start()
        status, obj = cp.api_request("PATCH", f"/api/v1/nodes/{SOLO}", {"spec": {"taints": [SOLO_TAINT]}})
        assert status == 200, obj
        yield cp, sim, work
    finally:
        if sim is not None:
            sim.stop()
        cp.stop()


@pytest.fixture
def chaos(chaos_session: tuple[ControlPlane, devcluster.NodeSimThread, Path]) -> Iterator[Chaos]:
    """A ``Chaos`` for one test; everything it started is stopped and the cluster restored after."""
    cp, sim, work = chaos_session
    handle = Chaos(cp, sim, work)
    try:
        yield handle
    finally:
        handle.cleanup()
