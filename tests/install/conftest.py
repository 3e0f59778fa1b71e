"""Install tier: the Helm chart installed with helm onto real nodes, from the locally built images.

One session fixture builds the cluster an operator would install into, every part the upstream
binary: etcd and kube-apiserver (on an address pods can reach, service accounts on),
kube-controller-manager, kube-proxy, kube-scheduler as the cluster's default scheduler, and two real
nodes (kubelet, containerd, runc, a CNI bridge each) with a HAMi-protocol device plugin over the
fake NVML library (``hack/fake-nvml``), as the prerequisite HAMi's device plugin would be
(``GPUSLICE_NODE_PLUGIN`` names another plugin, HAMi's own among them, as in the node tier). Both
images from ``hack/image/build.sh`` (gpuslice's, and kube-scheduler's made from the Go-built
binary, standing in for ``registry.k8s.io/kube-scheduler``) are imported into each node's
containerd under the names the chart uses by default, as a registry pull would leave them.

Tests then drive ``helm`` (``GPUSLICE_HELM``) against that cluster and check the result from the
API alone. The machine must be able to run real nodes (root, ``hack/node/install.sh``,
``hack/image/install.sh``); when it cannot, the tier fails with the reasons: it is never skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuslice_dev import clusterhost, fakenvml, images, realnode
from gpuslice_dev.controlplane import ControlPlane
from gpuslice_dev.paths import REPO_ROOT
from tests.chaos import audit
from tests.node.conftest import plugin_command
from tests.node.pods import PodOps

CHART = REPO_ROOT / "charts" / "gpuslice"
RELEASE = "gs"
NAMESPACE = "gpuslice-system"
FULLNAME = f"{RELEASE}-gpuslice"
BUSYBOX = realnode.BUSYBOX_IMAGE

# node name -> (index for bridge/subnet, machine shape of the fake NVML library); the node tier
# uses 60/61 and the real-node benchmark 70/71
NODES: dict[str, tuple[int, str]] = {
    "inst-0": (80, "t4-4"),
    "inst-1": (81, "a40-2"),
}

DEFAULT_SCHEDULER = """apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {{kubeconfig: {kubeconfig}}}
leaderElection: {{leaderElect: false}}
"""


def helm_binary() -> str:
    """The pinned helm (``hack/helm/build.sh``), named by ``GPUSLICE_HELM`` as the Makefile does."""
    helm = os.environ.get("GPUSLICE_HELM")
    if not helm:
        pytest.fail("GPUSLICE_HELM must name the pinned helm binary (make test-install sets it)")
    return helm


def helm_release_gone(cluster: ChartCluster, release: str = RELEASE, namespace: str = NAMESPACE) -> bool:
    """True when helm knows no such release (``helm status`` fails)."""
    return cluster.helm("status", release, "--namespace", namespace, check=False).returncode != 0


class ChartCluster(PodOps):
    """The cluster, its nodes, and helm pointed at it."""

    def __init__(
        self,
        cp: ControlPlane,
        services: clusterhost.ClusterServices,
        nodes: Mapping[str, realnode.RealNode],
        work: Path,
        nvml_library: Path,
    ) -> None:
        super().__init__(cp)
        self.services = services
        self.nodes = dict(nodes)
        self.work = work
        self.nvml_library = nvml_library
        self.helm_bin = helm_binary()

    # ------------------------------------------------------------------ helm
    def helm(
        self, *args: str, timeout: float = 600.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run helm against the cluster (admin kubeconfig); fails the test with its output."""
        argv = [self.helm_bin, "--kubeconfig", str(self.cp.kubeconfig), *args]
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.work / "helm-cache"),
            "HELM_CONFIG_HOME": str(self.work / "helm-config"),
            "HELM_DATA_HOME": str(self.work / "helm-data"),
        }
        started = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)  # noqa: S603
        took = time.monotonic() - started
        print(f"helm {' '.join(args[:3])}: exit {proc.returncode} after {took:.1f} s")
        if check and proc.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                f"{proc.stderr[-3000:]}\n{self.diagnostics()}"
            )
        return proc

    def node_values(self) -> list[str]:
        """The ``--set`` flags an operator of this cluster sets: where the NVML library is.

        The agent reads its cards through NVML from the fake library on each node, which reads its
        node's machine file named by ``GPUSLICE_FAKE_NVML_SHAPE``; the node roots share one parent,
        mounted into the agent, and Kubernetes expands ``$(NODE_NAME)`` in the variable.
        """
        roots = {node.root.parent for node in self.nodes.values()}
        assert len(roots) == 1, roots
        (root,) = roots
        shape = {"name": fakenvml.SHAPE_ENV, "value": "/gpuslice-nodes/$(NODE_NAME)/nvml/machine"}
        volume = {"name": "node-shapes", "hostPath": {"path": str(root), "type": "Directory"}}
        mount = {"name": "node-shapes", "mountPath": "/gpuslice-nodes", "readOnly": True}
        return [
            "--set", f"agent.nvmlLibrary={self.nvml_library}",
            "--set-json", "agent.extraEnv=" + json.dumps([shape]),
            "--set-json", "agent.extraVolumes=" + json.dumps([volume]),
            "--set-json", "agent.extraVolumeMounts=" + json.dumps([mount]),
        ]  # fmt: skip

    # ------------------------------------------------------------------ reading
    def get(self, path: str) -> dict[str, Any]:
        status, body = self.cp.api_request("GET", path)
        assert status == 200, (path, body)
        result: dict[str, Any] = body
        return result

    def items(self, path: str) -> list[dict[str, Any]]:
        status, body = self.cp.api_request("GET", path)
        if status == 404:
            return []
        assert status == 200, (path, body)
        found: list[dict[str, Any]] = body.get("items", [])
        return found

    def release_pods(self, component: str, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        """The release's pods of one component, leaving out those already terminating."""
        selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
        pods = self.items(f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]

    def lease_holder(self, name: str, namespace: str = NAMESPACE) -> str:
        status, body = self.cp.api_request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        )
        if status != 200:
            return ""
        return str(body.get("spec", {}).get("holderIdentity") or "")

    def audit(self, extender_url: str | None = None) -> audit.AuditReport:
        """The card-by-card audit from the API alone (and the extender's gauges where given)."""
        report = audit.audit(self.cp, extender_url=extender_url, settle_timeout=60)
        report.assert_clean("install tier")
        return report

    def diagnostics(self) -> str:
        parts = []
        for pod in self.items(f"/api/v1/namespaces/{NAMESPACE}/pods"):
            meta, status = pod["metadata"], pod.get("status", {})
            states = [
                f"{c['name']}:{next(iter(c.get('state', {})), '?')} ready={c.get('ready')}"
                f" restarts={c.get('restartCount')}"
                for c in status.get("containerStatuses") or []
            ]
            parts.append(
                f"{meta['name']} {status.get('phase')} on {pod['spec'].get('nodeName')}: {' '.join(states)}"
            )
            for c in status.get("containerStatuses") or []:
                st, body = self.cp.api_request(
                    "GET",
                    f"/api/v1/namespaces/{NAMESPACE}/pods/{meta['name']}/log?container={c['name']}&tailLines=8",
                )
                if st == 200:
                    text = body.get("text", "") if isinstance(body, dict) else str(body)
                    parts.append(
                        f"  --- {c['name']}:\n" + "\n".join("    " + line for line in text.splitlines())
                    )
        events = self.items(f"/api/v1/namespaces/{NAMESPACE}/events")
        for ev in events[-15:]:
            parts.append(
                f"event {ev.get('reason')}: {ev.get('involvedObject', {}).get('name')}: {ev.get('message')}"
            )
        for name, node in self.nodes.items():
            if node.kubelet is not None:
                parts.append(f"--- {name} kubelet ---\n{node.kubelet.tail(10)}")
        return "\n".join(parts)


@pytest.fixture(scope="session")
def chart_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartCluster]:
    problems = realnode.host_problems()
    if problems:
        pytest.fail("the install tier needs a machine that can run real nodes: " + "; ".join(problems))
    built = images.built_images()
    work: Path = tmp_path_factory.mktemp("install")
    root = Path("/tmp") / f"gsi-{uuid.uuid4().hex[:6]}"
    clusterhost.add_api_address()
    cp = clusterhost.control_plane()
    services: clusterhost.ClusterServices | None = None
    nodes: dict[str, realnode.RealNode] = {}
    try:
        cp.start()
        services = clusterhost.ClusterServices(cp, work / "services")
        services.start_controller_manager()
        cp.start_scheduler(DEFAULT_SCHEDULER.format(kubeconfig=cp.kubeconfig))
        plugin = plugin_command(work)
        for name, (index, shape) in NODES.items():
            nodes[name] = realnode.RealNode(
                cp, name, index, root / name, plugin=plugin, machine=shape, labels={"gpu": "on"}
            )
        realnode.start_all(list(nodes.values()))
        for node in nodes.values():
            for image in built.all():
                node.import_image(image.archive, image.reference)
        services.start_proxy(next(iter(nodes)))
        yield ChartCluster(cp, services, nodes, work, fakenvml.build_library())
    finally:
        for node in nodes.values():
            node.stop()
        if services is not None:
            services.stop()
        cp.stop()
        clusterhost.remove_api_address()
        if root.exists() and not any(root.iterdir()):
            root.rmdir()
