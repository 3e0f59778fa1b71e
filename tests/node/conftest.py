"""Node tier: real kubelets with containerd and runc, a device plugin on kubelet's gRPC API, a real
kube-scheduler calling ``gpuslice serve``, on a real apiserver.

One session fixture starts everything: the control plane, two ``RealNode``s (each: containerd,
CNI bridge, kubelet, and the device plugin in the node's own mount namespace) and gpuslice. Pods
run the locally built busybox image and print their environment, which tests read back through
the apiserver (``pods/log``, served by the node's kubelet).

The device plugin is gpuslice's own (``gpuslice_dev.deviceplugin``) reading its cards
through NVML from the fake ``libnvidia-ml.so.1`` (``hack/fake-nvml``). ``GPUSLICE_NODE_PLUGIN``
names another plugin command (an executable run with the environment ``nodeplugins.external_plugin``
documents), HAMi's own among them (``docs/real-nodes.md``); nothing here assumes which one runs.

The machine must be able to run real nodes (root, the Debian packages ``hack/node/install.sh``
installs); when it cannot, the tier fails with the reasons: it is never skipped.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuslice.codec import keys
from gpuslice_dev import devcluster, nodeplugins, realnode
from gpuslice_dev.controlplane import ControlPlane
from tests.chaos import audit
from tests.node.pods import PodOps

SCHEDULER = "gpuslice-scheduler"
IMAGE = realnode.BUSYBOX_IMAGE

# node name -> (index for bridge/subnet, machine shape of the fake NVML library)
NODES: dict[str, tuple[int, str]] = {
    "real-0": (60, "t4-4"),
    "real-1": (61, "a40-2"),
}


class NodeCluster(PodOps):
    """Handles for tests: the control plane, the nodes, gpuslice, and pod helpers."""

    def __init__(
        self, cp: ControlPlane, nodes: Mapping[str, realnode.RealNode], ext: devcluster.Extender, work: Path
    ) -> None:
        super().__init__(cp)
        self.nodes = dict(nodes)
        self.ext = ext
        self.work = work

    def audit(self) -> audit.AuditReport:
        """The card-by-card audit from the API once nothing is mid-bind: must be clean."""
        report = audit.audit(self.cp, extender_url=self.ext.probe_url, settle_timeout=60)
        report.assert_clean("after the test")
        return report

    def diagnostics(self) -> str:
        parts = [f"--- gpuslice ---\n{self.ext.tail(30)}"]
        for name, node in self.nodes.items():
            for proc in (node.kubelet, node.plugin):
                if proc is not None:
                    parts.append(f"--- {name} {proc.name} ---\n{proc.tail(15)}")
        return "\n".join(parts)


def gpu_pod(
    name: str,
    containers: list[dict[str, Any]],
    *,
    node: str | None = None,
    init: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    grace: int = 1,
    priority_class: str | None = None,
) -> dict[str, Any]:
    """A pod of busybox containers that print their environment, then ``--env-end--``, then sleep.

    Each container is ``{"name", "limits", optional "command", "restartPolicy"}``.
    """

    def container(spec: dict[str, Any], default_command: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": spec["name"],
            "image": IMAGE,
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", spec.get("command", default_command)],
            "resources": {"limits": dict(spec.get("limits", {}))},
        }
        if "restartPolicy" in spec:
            out["restartPolicy"] = spec["restartPolicy"]
        return out

    run = "env; echo --env-end--; trap 'exit 0' TERM; while true; do sleep 1; done"
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": grace,
        "containers": [container(c, run) for c in containers],
    }
    if init:
        spec["initContainers"] = [
            container(c, run if c.get("restartPolicy") == "Always" else "env; echo --env-end--") for c in init
        ]
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": spec}


def plugin_command(work: Path) -> nodeplugins.PluginCommand:
    """The device plugin under test: ``GPUSLICE_NODE_PLUGIN`` or gpuslice's own over the fake NVML."""
    external = os.environ.get("GPUSLICE_NODE_PLUGIN")
    if external:
        return nodeplugins.external_plugin(Path(external))
    return nodeplugins.gpuslice_plugin("nvml")


@pytest.fixture(scope="session")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    problems = realnode.host_problems()
    if problems:
        pytest.fail("the node tier needs a machine that can run real nodes: " + "; ".join(problems))
    work: Path = tmp_path_factory.mktemp("node")
    cp = ControlPlane()
    cp.start()
    nodes: dict[str, realnode.RealNode] = {}
    ext: devcluster.Extender | None = None
    root = Path("/tmp") / f"gsn-{uuid.uuid4().hex[:6]}"
    try:
        command = plugin_command(work)
        for name, (index, shape) in NODES.items():
            nodes[name] = realnode.RealNode(
                cp,
                name,
                index,
                root / name,
                plugin=command,
                machine=shape,
                labels={"gpu": "on"},
            )
        realnode.start_all(list(nodes.values()))
        ext = devcluster.Extender(cp.kubeconfig, work / "gpuslice.log", extra_args=["-v", "4"]).start()
        cp.start_scheduler(devcluster.render_scheduler_config(ext.url, cp.kubeconfig, SCHEDULER))
        cluster = NodeCluster(cp, nodes, ext, work)
        yield cluster
    finally:
        if ext is not None:
            ext.stop()
        for node in nodes.values():
            node.stop()
        cp.stop()
        if root.exists() and not any(root.iterdir()):
            root.rmdir()


@pytest.fixture
def cluster(node_cluster: NodeCluster) -> Iterator[NodeCluster]:
    """The session's cluster; after each test (and its pods) a clean audit: no lock held."""
    yield node_cluster
    node_cluster.audit()


@pytest.fixture
def ns(cluster: NodeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace for the test. When the test ends, the card-by-card audit runs with its pods
    still there (none over-committed, gauges equal to the API); then they are deleted and gone."""
    name = cluster.namespace(request.node.name.removeprefix("test_")[:20].replace("_", "-").rstrip("-"))
    yield name
    report = cluster.audit()
    print(f"[{request.node.name}] {report.summary()}")
    status, body = cluster.cp.api_request("GET", f"/api/v1/namespaces/{name}/pods")
    items = body.get("items", []) if status == 200 else []
    for pod in items:
        cluster.delete(name, pod["metadata"]["name"])
    for pod in items:
        cluster.wait_gone(name, pod["metadata"]["name"])


def registered_cards(cluster: NodeCluster, node: str) -> list[dict[str, Any]]:
    """The node's cards as its device plugin registered them (HAMi's JSON registration)."""
    import json

    obj = cluster.cp.api_request("GET", f"/api/v1/nodes/{node}")[1]
    value = obj["metadata"]["annotations"][keys.NODE_REGISTER]
    cards: list[dict[str, Any]] = json.loads(value)
    return cards
