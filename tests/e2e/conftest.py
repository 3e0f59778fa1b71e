"""E2E tier: a real kube-scheduler, configured by ``gpuslice render scheduler-config``, calling a
``gpuslice serve`` process, on a real apiserver with fake GPU nodes.

One session fixture starts everything (about 15 s); tests use unique pod names and namespaces.
``nodesim`` plays HAMi's device plugin after each bind: it blanks ``vgpu-devices-to-allocate``,
sets ``bind-phase: success`` and releases the node lock.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuslice.codec import keys
from gpuslice.model import devices
from gpuslice_dev import devcluster, nodesim
from gpuslice_dev.controlplane import ControlPlane

SCHEDULER = "gpuslice-scheduler"
A100 = "NVIDIA A100-SXM4-80GB"
V100 = "NVIDIA-Tesla V100-PCIE-32GB"

# name -> (model, cards, MiB per card, cards per NUMA node)
NODES: dict[str, tuple[str, int, int, int]] = {
    "e2e-a100-0": (A100, 4, 81920, 2),
    "e2e-a100-1": (A100, 4, 81920, 2),
    "e2e-v100-0": (V100, 2, 32768, 2),
}


def node_spec(node: str) -> dict[str, Any]:
    model, n, mem, per_numa = NODES[node]
    return {"model": model, "count": n, "memory_mib": mem, "numa": [i // per_numa for i in range(n)]}


def inventory(node: str) -> tuple[devices.GpuDevice, ...]:
    return nodesim.cards(node, **node_spec(node))


def card_uuid(node: str, i: int) -> str:
    return inventory(node)[i].uuid


class Cluster:
    """Handles for tests."""

    def __init__(self, cp: ControlPlane, ext: devcluster.Extender) -> None:
        self.cp = cp
        self.ext = ext

    def namespace(self, prefix: str = "e2e") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        status, body = self.cp.api_request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        assert status == 201, body
        return name

    def create_pod(
        self,
        ns: str,
        name: str,
        limits: dict[str, str],
        annotations: dict[str, str] | None = None,
        containers: int = 1,
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": ns}
        if annotations:
            meta["annotations"] = annotations
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {
                "schedulerName": SCHEDULER,
                "containers": [
                    {"name": f"c{i}", "image": "pause", "resources": {"limits": dict(limits)}}
                    for i in range(containers)
                ],
            },
        }
        status, obj = self.cp.api_request("POST", f"/api/v1/namespaces/{ns}/pods", body)
        assert status == 201, obj
        return obj

    def pod(self, ns: str, name: str) -> dict[str, Any]:
        status, obj = self.cp.api_request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
        assert status == 200, obj
        return obj

    def delete_pod(self, ns: str, name: str) -> None:
        self.cp.api_request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=0")

    def wait(self, what: Callable[[], Any], timeout: float = 30.0, message: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = what()
            if got:
                return got
            time.sleep(0.2)
        raise AssertionError(
            f"timed out after {timeout:.0f} s: {message}\n--- gpuslice log ---\n{self.ext.tail(60)}"
        )

    def wait_bound(self, ns: str, name: str, timeout: float = 30.0) -> dict[str, Any]:
        def bound() -> dict[str, Any] | None:
            pod = self.pod(ns, name)
            return pod if pod["spec"].get("nodeName") else None

        result: dict[str, Any] = self.wait(bound, timeout, f"pod {ns}/{name} not bound")
        return result

    def wait_labelled(self, ns: str, name: str, timeout: float = 45.0) -> dict[str, Any]:
        """The bound pod once it carries HAMi's ``hami.io/vgpu-node`` label.

        The annotations arrive with the Binding; the label is patched after the device plugin's
        ``Allocate`` released the node lock (at the latest ``bind.LABEL_AFTER_S`` later).
        """

        def labelled() -> dict[str, Any] | None:
            pod = self.pod(ns, name)
            labels = pod["metadata"].get("labels") or {}
            return pod if pod["spec"].get("nodeName") and keys.VGPU_NODE in labels else None

        result: dict[str, Any] = self.wait(labelled, timeout, f"pod {ns}/{name} not bound and labelled")
        return result

    def events(self, ns: str, name: str) -> list[dict[str, Any]]:
        status, body = self.cp.api_request(
            "GET", f"/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name%3D{name}"
        )
        assert status == 200, body
        items: list[dict[str, Any]] = body.get("items", [])
        return items

    def wait_event(self, ns: str, name: str, reason: str, timeout: float = 30.0) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            return next((e for e in self.events(ns, name) if e.get("reason") == reason), None)

        result: dict[str, Any] = self.wait(found, timeout, f"no {reason} event for {ns}/{name}")
        return result

    def all_pods(self) -> list[dict[str, Any]]:
        status, body = self.cp.api_request("GET", "/api/v1/pods")
        assert status == 200
        items: list[dict[str, Any]] = body["items"]
        return items


@pytest.fixture(scope="session")
def e2e_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work: Path = tmp_path_factory.mktemp("e2e")
    cp = ControlPlane()
    cp.start()
    sim: devcluster.NodeSimThread | None = None
    ext: devcluster.Extender | None = None
    try:
        sim = devcluster.NodeSimThread(cp.kubeconfig, {name: node_spec(name) for name in NODES}).start()
        ext = devcluster.Extender(cp.kubeconfig, work / "gpuslice.log", extra_args=["-v", "4"]).start()
        cp.start_scheduler(devcluster.render_scheduler_config(ext.url, cp.kubeconfig, SCHEDULER))
        yield Cluster(cp, ext)
    finally:
        if ext is not None:
            ext.stop()
        if sim is not None:
            sim.stop()
        cp.stop()
