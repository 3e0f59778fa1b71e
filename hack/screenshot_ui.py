"""Take ``docs/img/cluster-view.png``: the cluster view of a small dev cluster with a few pods.

Starts what ``gpuslice-dev dev-cluster`` starts (etcd, kube-apiserver, kube-scheduler, ``gpuslice
serve``, fake GPU nodes), with four mixed nodes: one card cordoned (``hami.io/device-cordon``), one
registered unhealthy, and one node whose device plugin goes away after the pods are placed (the
extender excludes it, ``NodeHandshakeStale``). It binds a dozen pods of three teams, leaves one pod
that fits nowhere pending, and photographs ``/ui`` in headless Debian ``chromium`` through
Playwright (the system browser; nothing is downloaded).

    export GPUSLICE_CONTROL_PLANE_BIN=$(bash hack/control-plane/build.sh | tail -1)
    .venv/bin/python hack/screenshot_ui.py [--out docs/img/cluster-view.png]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from gpuslice.codec import keys, registrations
from gpuslice_dev import browser, controlplane, devcluster, nodesim

A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"
STALE_NODE = "gpu-l4-0"


def specs() -> dict[str, dict[str, Any]]:
    """Node name -> ``nodesim.make_node`` arguments."""
    h100 = list(nodesim.cards("gpu-h100-0", model=H100, count=4, memory_mib=81559, numa_nodes=2))
    h100[3] = msgspec.structs.replace(h100[3], health=False)
    a100_1 = nodesim.cards("gpu-a100-1", model=A100, count=4, memory_mib=81920, numa_nodes=2)
    return {
        "gpu-a100-0": {"model": A100, "count": 4, "memory_mib": 81920, "numa_nodes": 2},
        "gpu-a100-1": {
            "model": A100,
            "count": 4,
            "memory_mib": 81920,
            "numa_nodes": 2,
            "annotations": {keys.DEVICE_CORDON: a100_1[3].uuid},
        },
        "gpu-h100-0": {
            "model": H100,
            "count": 4,
            "memory_mib": 81559,
            "numa_nodes": 2,
            "annotations": {keys.NODE_REGISTER: registrations.encode_json(h100)},
        },
        STALE_NODE: {"model": L4, "count": 2, "memory_mib": 23034},
    }


def gpu(count: int = 1, mem: int | None = None, cores: int | None = None) -> dict[str, str]:
    """A container's GPU limits."""
    out = {"nvidia.com/gpu": str(count)}
    if mem is not None:
        out["nvidia.com/gpumem"] = str(mem)
    if cores is not None:
        out["nvidia.com/gpucores"] = str(cores)
    return out


PODS: list[tuple[str, str, dict[str, str], dict[str, str]]] = [
    ("ml-train", "llama-ft-0", gpu(2), {keys.USE_GPU_TYPE: "A100"}),
    ("ml-train", "bert-large", gpu(1), {keys.USE_GPU_TYPE: "H100"}),
    ("ml-train", "resnet-sweep-a", gpu(1, 40000, 50), {}),
    ("ml-train", "resnet-sweep-b", gpu(1, 40000, 50), {}),
    ("inference", "llama-7b-0", gpu(1, 20000, 25), {}),
    ("inference", "llama-7b-1", gpu(1, 20000, 25), {}),
    ("inference", "llama-7b-2", gpu(1, 20000, 25), {}),
    ("inference", "whisper", gpu(1, 10000, 20), {}),
    ("inference", "embedder", gpu(1, 6000, 10), {keys.USE_GPU_TYPE: "L4"}),
    ("notebooks", "alice", gpu(1, 8000, 10), {}),
    ("notebooks", "bob", gpu(1, 12000, 15), {}),
    ("notebooks", "carol", gpu(1, 16000, 20), {}),
]
PENDING: tuple[str, str, dict[str, str], dict[str, str]] = ("ml-train", "llama-70b", gpu(4), {})
"""Four whole cards on one node: every 4-card node has a card in use, cordoned or unhealthy."""


def pod_body(ns: str, name: str, limits: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    """A one-container pod for gpuslice's scheduler."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {
            "schedulerName": "gpuslice-scheduler",
            "containers": [{"name": "main", "image": "pause", "resources": {"limits": limits}}],
        },
    }


def wait(what: Callable[[], bool], timeout: float, message: str) -> None:
    """Poll ``what`` until it holds; exit with ``message`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: {message}")
        time.sleep(0.3)


def main() -> int:
    """Start the cluster, place the pods, take the screenshot, stop everything."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img/cluster-view.png"))
    parser.add_argument("--width", type=int, default=1480)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        cp = controlplane.ControlPlane()
        cp.start()
        stack.callback(cp.stop)
        sim = devcluster.NodeSimThread(cp.kubeconfig, specs()).start()
        stack.callback(sim.stop)
        extra = ["-v", "1", "--workload-min-count", "8", "--workload-period-s", "0"]
        extra += ["--shadow-policy", "fgd-lookahead"]
        ext = devcluster.Extender(cp.kubeconfig, cp.workdir / "gpuslice.log", extra_args=extra).start()
        stack.callback(ext.stop)
        cp.start_scheduler(devcluster.render_scheduler_config(ext.url, cp.kubeconfig))
        stack.callback(cp.stop_scheduler)
        for ns in sorted({p[0] for p in [*PODS, PENDING]}):
            cp.api_request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        for ns, name, limits, ann in PODS:
            status, body = cp.api_request(
                "POST", f"/api/v1/namespaces/{ns}/pods", pod_body(ns, name, limits, ann)
            )
            assert status == 201, body

            def bound(ns: str = ns, name: str = name) -> bool:
                _, obj = cp.api_request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
                return bool(obj["spec"].get("nodeName"))

            wait(bound, 60, f"{ns}/{name} not bound")  # one by one: a stable, readable placement
        sim.stop_node(STALE_NODE)
        ns, name, limits, ann = PENDING
        cp.api_request("POST", f"/api/v1/namespaces/{ns}/pods", pod_body(ns, name, limits, ann))
        time.sleep(4.0)  # a filter round for the pending pod, and the node watch
        with browser.persistent_context(
            viewport={"width": args.width, "height": 900}, device_scale_factor=1
        ) as context:
            page = context.new_page()
            page.goto(ext.url + "/ui")
            page.wait_for_selector("[data-testid=pending]", timeout=30_000)
            page.click("[data-testid=pending] summary")
            page.wait_for_timeout(500)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.out), full_page=True)
        print(f"wrote {args.out} ({ext.url}/ui)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
