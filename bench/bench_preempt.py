"""Preemption latency: a high-priority GPU pod created on a full node -> bound, through kube-scheduler.

One control plane (etcd, kube-apiserver, kube-scheduler configured by ``gpuslice render
scheduler-config``), one ``gpuslice serve`` and the node simulator (HAMi's device plugin and the
kubelet stand-in, which finishes the deletion of evicted pods), as the e2e tier runs them. One
node with two 80 GiB A100 cards. Each repetition, in a fresh namespace:

* ``preempt``: the node is filled with four low-priority pods of half a card each (two per card,
  pinned, each Running), then a high-priority pod asking a whole card is created. Timed from just
  before its POST until the node simulator's pod watch first shows it bound. In between: the
  filter finds no node, the leader picks the victims on concrete cards, nominates the card,
  evicts the victims through the Eviction API, the simulator finishes their deletion, the watch
  frees their cards, kube-scheduler retries the pod, filter and bind place it on the nominated
  card.
* ``bind``: the same pod created on an empty node (no preemption), for comparison.

Everything is deleted between repetitions. Prints a table (median and p90, ms) and writes
``out/bench_preempt.json``.

Run (needs the control plane binaries, ``hack/control-plane/build.sh``):
    .venv/bin/python bench/bench_preempt.py [--reps 10]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import threading
import time
import uuid
from typing import Any

import numpy as np

from gpuslice.codec import keys
from gpuslice.kube import objects
from gpuslice_dev import devcluster, nodesim
from gpuslice_dev.controlplane import ControlPlane

OUT = pathlib.Path("out")
SCHEDULER = "gpuslice-scheduler"
NODE = "bench-preempt-0"
HALF = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40960", "nvidia.com/gpucores": "50"}
WHOLE = {"nvidia.com/gpu": "1"}


class Bound:
    """First time (monotonic) the simulator's pod watch showed each pod bound."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.changed = threading.Condition()

    def seen(self, pod: objects.Pod) -> None:
        if pod.spec.node_name and pod.key not in self.at:
            with self.changed:
                self.at[pod.key] = time.monotonic()
                self.changed.notify_all()

    def wait(self, key: str, timeout: float) -> float:
        with self.changed:
            if not self.changed.wait_for(lambda: key in self.at, timeout):
                raise TimeoutError(f"{key} not bound within {timeout:.0f} s")
            return self.at[key]


PRIORITIES = (5, 1000)
"""The victims' and the preemptor's priorities (a PriorityClass each)."""


def pod_body(name: str, priority: int, limits: dict[str, str], card: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if card is not None:
        meta["annotations"] = {keys.USE_GPU_UUID: card}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "schedulerName": SCHEDULER,
            "priorityClassName": f"bench-priority-{priority}",  # resolved by the Priority admission plugin
            "containers": [{"name": "c", "image": "pause", "resources": {"limits": limits}}],
        },
    }


def create(cp: ControlPlane, ns: str, body: dict[str, Any]) -> None:
    status, obj = cp.api_request("POST", f"/api/v1/namespaces/{ns}/pods", body)
    assert status == 201, obj


def wait_until(what: Any, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise TimeoutError(message)
        time.sleep(0.02)


def running(cp: ControlPlane, ns: str, name: str) -> bool:
    status, obj = cp.api_request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
    return status == 200 and obj.get("status", {}).get("phase") == "Running"


def pods_left(cp: ControlPlane, ns: str) -> int:
    status, obj = cp.api_request("GET", f"/api/v1/namespaces/{ns}/pods")
    return len(obj.get("items", [])) if status == 200 else 0


def one(cp: ControlPlane, bound: Bound, cards: list[str], preempt: bool) -> float:
    """One repetition; the milliseconds from the high-priority pod's creation to its binding."""
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    status, body = cp.api_request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    assert status == 201, body
    low = [(f"low-{k}", cards[k // 2]) for k in range(4)] if preempt else []
    for name, card in low:
        create(cp, ns, pod_body(name, PRIORITIES[0], HALF, card))
    for name, _ in low:
        wait_until(lambda n=name: running(cp, ns, n), 60, f"{name} not running")
    start = time.monotonic()
    create(cp, ns, pod_body("high", PRIORITIES[1], WHOLE))
    took = bound.wait(f"{ns}/high", 120) - start
    for name in [n for n, _ in low] + ["high"]:
        cp.api_request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=0")
    wait_until(lambda: pods_left(cp, ns) == 0, 60, f"pods of {ns} not deleted")
    time.sleep(0.5)  # the extender's watch frees the cards before the next repetition
    return took * 1000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-preempt-"))
    cp = ControlPlane()
    cp.start()
    sim: devcluster.NodeSimThread | None = None
    ext: devcluster.Extender | None = None
    results: dict[str, list[float]] = {"bind": [], "preempt": []}
    try:
        sim = devcluster.NodeSimThread(cp.kubeconfig, {NODE: {"count": 2, "memory_mib": 81920}}).start()
        bound = Bound()
        sim.sim.on_bound = bound.seen
        ext = devcluster.Extender(cp.kubeconfig, work / "gpuslice.log").start()
        cp.start_scheduler(devcluster.render_scheduler_config(ext.url, cp.kubeconfig, SCHEDULER))
        cards = nodesim.card_uuids(NODE, 2)
        for value in PRIORITIES:
            cp.priority_class(f"bench-priority-{value}", value)
        one(cp, bound, cards, preempt=True)  # warm-up
        for _ in range(args.reps):
            for mode in ("bind", "preempt"):
                results[mode].append(one(cp, bound, cards, preempt=mode == "preempt"))
    finally:
        if ext is not None:
            ext.stop()
        if sim is not None:
            sim.stop()
        cp.stop()
    print(f"{'mode':<10}{'reps':>6}{'median ms':>12}{'p90 ms':>10}{'min ms':>10}{'max ms':>10}")
    summary = {}
    for mode, xs in results.items():
        a = np.asarray(xs)
        row = {
            "reps": len(xs),
            "median_ms": float(np.median(a)),
            "p90_ms": float(np.percentile(a, 90)),
            "min_ms": float(a.min()),
            "max_ms": float(a.max()),
        }
        summary[mode] = {**row, "samples_ms": xs}
        print(
            f"{mode:<10}{row['reps']:>6}{row['median_ms']:>12.0f}{row['p90_ms']:>10.0f}"
            f"{row['min_ms']:>10.0f}{row['max_ms']:>10.0f}"
        )
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_preempt.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
