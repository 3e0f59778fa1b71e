"""What HAMi's node lock costs on real nodes: bursts of one-card fractional pods, created at once.

Two real nodes (``devcluster.realnode``: containerd, runc, CNI bridge, kubelet v1.34 and a device
plugin on kubelet's gRPC API speaking HAMi's protocol), a real kube-scheduler and one
``gpuslice serve``, in one run on this machine. HAMi's node lock is held from gpuslice's bind
until the device plugin's ``Allocate``, which kubelet calls when it admits the pod, so at most one
GPU pod per node is between its Binding and its ``Allocate``.

Each configuration creates a burst of ``--pods`` pods (``nvidia.com/gpu: 1``,
``nvidia.com/gpumem: 1000``) from ``--threads`` threads and measures, per burst:

* **bound/s**: pods / (last Binding - first creation), from the pods' ``PodScheduled`` times;
* **running/s**: pods / (last container start - first creation);
* **latency**: each pod's created -> Running (its container's ``startedAt``), median and p90;
* where the pods went (pods per node), and gpuslice's lock waits (``/metrics``).

Configurations: gpuslice with ``binpack`` and ``spread`` node policies, each with the
``extender`` and ``rank`` node choices and ``--lock-margin 0`` (the policy's node, lock or not),
binpack with margins 0.05 (the default) and 0.2 (prefer a node whose lock is free among those
scoring within the margin); the same with the device plugin held to HAMi's client-side API rate
(client-go's default 5 QPS, burst 10, which makes each ``Allocate`` wait for its own API calls as
HAMi's does); and **kube-scheduler alone** on the same nodes
with pods that ask for no GPU (the nodes' own floor: scheduling, sandbox, CNI, runc; GPU pods
cannot run without gpuslice's annotations, so no GPU request is the only like-for-like baseline).
Timestamps from the API have one-second resolution; rates use the client's clock for creation
and the API's for binding and start, so per-burst figures are +-1 s.

Prints a table and writes ``out/bench_realnode.json``. Needs root and the real-node packages
(``make node``). Run::

    GPUSLICE_CONTROL_PLANE_BIN=$(bash hack/control-plane/build.sh | tail -1) \\
    GPUSLICE_NODE_BIN=$(bash hack/node/build.sh | tail -1) \\
      .venv/bin/python bench/bench_realnode.py [--pods 20] [--reps 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib
import statistics
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpuslice_dev import devcluster, nodeplugins, realnode
from gpuslice_dev.controlplane import ControlPlane

SCHEDULER = "gpuslice-scheduler"
MACHINE = "a100-8-2numa"
LABELS = {"gpu": "on"}
RUN = "trap 'exit 0' TERM; while true; do sleep 1; done"


FAST = ()
HAMI_RATE = ("--kube-qps", "5", "--kube-burst", "10")
"""HAMi's plugin talks to the API through client-go at its default client-side limit (5 QPS, burst
10): the plugin's Allocate waits for its own API calls, and the node lock with it."""


def _config(
    policy: str, choice: str, margin: str = "0", plugin: tuple[str, ...] = FAST
) -> tuple[list[str], list[str], bool, tuple[str, ...]]:
    serve = ["--node-policy", policy, "--node-choice", choice, "--lock-margin", margin]
    return serve, ["--node-choice", choice], True, plugin


# name -> (serve flags, render flags, asks for a GPU, device-plugin flags). The extender lists the
# GPU resources as managedResources, so kube-scheduler never calls it for a pod that asks for
# none: the first configuration is kube-scheduler alone.
CONFIGS: dict[str, tuple[list[str], list[str], bool, tuple[str, ...]]] = {
    "kube-scheduler alone (no GPU)": ([], [], False, FAST),
    "binpack, extender, margin 0": _config("binpack", "extender"),
    "spread, extender, margin 0": _config("spread", "extender"),
    "binpack, rank, margin 0": _config("binpack", "rank"),
    "spread, rank, margin 0": _config("spread", "rank"),
    "binpack, extender, margin 0.05": _config("binpack", "extender", "0.05"),
    "binpack, extender, margin 0.2": _config("binpack", "extender", "0.2"),
    "HAMi rate: binpack, extender, margin 0": _config("binpack", "extender", plugin=HAMI_RATE),
    "HAMi rate: spread, extender, margin 0": _config("spread", "extender", plugin=HAMI_RATE),
    "HAMi rate: binpack, rank, margin 0": _config("binpack", "rank", plugin=HAMI_RATE),
    "HAMi rate: binpack, extender, margin 0.05": _config("binpack", "extender", "0.05", plugin=HAMI_RATE),
    "HAMi rate: binpack, extender, margin 0.2": _config("binpack", "extender", "0.2", plugin=HAMI_RATE),
}


def _time(text: str | None) -> float | None:
    if not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def pod_body(ns: str, name: str, scheduler: str, gpu: bool) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"} if gpu else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "schedulerName": scheduler,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": realnode.BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", RUN],
                    "resources": {"limits": limits},
                }
            ],
        },
    }


def _metrics(ext: devcluster.Extender) -> list[Any]:
    try:
        with urllib.request.urlopen(f"{ext.probe_url}/metrics", timeout=5) as resp:  # noqa: S310 - loopback
            return list(text_string_to_metric_families(resp.read().decode()))
    except OSError:
        return []


def lock_waits(ext: devcluster.Extender) -> float:
    """gpuslice's retries of a node lock another pod's Allocate still held."""
    for family in _metrics(ext):
        if family.name == "gpuslice_bind_node_lock_waits":
            return float(sum(s.value for s in family.samples if s.name.endswith("_total")))
    return 0.0


def bind_seconds(ext: devcluster.Extender) -> tuple[float, float]:
    """(sum, count) of gpuslice's /bind handling times: lock wait, checks, Binding."""
    total = count = 0.0
    for family in _metrics(ext):
        if family.name == "gpuslice_extender_request_duration_seconds":
            for s in family.samples:
                if s.labels.get("verb") == "bind" and s.name.endswith("_sum"):
                    total = s.value
                if s.labels.get("verb") == "bind" and s.name.endswith("_count"):
                    count = s.value
    return total, count


def burst(cp: ControlPlane, ns: str, pods: int, threads: int, scheduler: str, gpu: bool) -> dict[str, Any]:
    names = [f"p{i:03d}" for i in range(pods)]
    created: dict[str, float] = {}
    lock = threading.Lock()

    def create(part: list[str]) -> None:
        for name in part:
            t = time.time()
            status, body = cp.api_request(
                "POST", f"/api/v1/namespaces/{ns}/pods", pod_body(ns, name, scheduler, gpu)
            )
            if status != 201:
                raise RuntimeError(f"create {name}: {status} {body}")
            with lock:
                created[name] = t

    start = time.time()
    workers = [threading.Thread(target=create, args=(names[i::threads],)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    deadline = time.monotonic() + 300
    items: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        status, body = cp.api_request("GET", f"/api/v1/namespaces/{ns}/pods")
        items = body.get("items", []) if status == 200 else []
        running = [
            p for p in items
            if p.get("status", {}).get("phase") == "Running"
            and all("running" in c.get("state", {}) for c in p["status"].get("containerStatuses") or [{}])
        ]  # fmt: skip
        failed = [p["metadata"]["name"] for p in items if p.get("status", {}).get("phase") == "Failed"]
        if failed:
            raise RuntimeError(f"pods failed: {failed}")
        if len(running) == pods:
            break
        time.sleep(0.5)
    else:
        raise RuntimeError(f"burst not Running after 300 s: {len(items)} pods")
    bound: list[float] = []
    started: list[float] = []
    latency: list[float] = []
    nodes: Counter[str] = Counter()
    for p in items:
        name = p["metadata"]["name"]
        cond = next(c for c in p["status"]["conditions"] if c["type"] == "PodScheduled")
        bound.append(_time(cond.get("lastTransitionTime")) or 0.0)
        run = _time(p["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]) or 0.0
        started.append(run)
        latency.append(max(0.0, run - created[name]))
        nodes[p["spec"]["nodeName"]] += 1
    # API times are whole seconds: a burst that ends within its first second counts one second.
    bind_span = max(1.0, max(bound) - start)
    run_span = max(1.0, max(started) - start)
    return {
        "bound_per_s": pods / bind_span,
        "running_per_s": pods / run_span,
        "latency_median_s": statistics.median(latency),
        "latency_p90_s": sorted(latency)[int(0.9 * (len(latency) - 1))],
        "nodes": dict(sorted(nodes.items())),
    }


def clear(cp: ControlPlane, ns: str) -> None:
    status, body = cp.api_request("GET", f"/api/v1/namespaces/{ns}/pods")
    for p in body.get("items", []) if status == 200 else []:
        cp.api_request("DELETE", f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}?gracePeriodSeconds=0")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status, body = cp.api_request("GET", f"/api/v1/namespaces/{ns}/pods")
        if status == 200 and not body.get("items"):
            return
        time.sleep(0.5)


def save(args: argparse.Namespace, costs: dict[str, Any], results: dict[str, list[dict[str, Any]]]) -> None:
    """Write the run so far (after every burst: a later failure keeps what was measured)."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    saved = {
        "pods": args.pods,
        "reps": args.reps,
        "machine": MACHINE,
        "plugin": str(args.plugin or "gpuslice-dev device-plugin"),
        "node_cost": costs,
        "results": results,
    }
    args.out.write_text(json.dumps(saved, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=20, help="pods per burst")
    parser.add_argument("--reps", type=int, default=2, help="bursts per configuration")
    parser.add_argument("--threads", type=int, default=4, help="creating threads")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/bench_realnode.json"))
    parser.add_argument("--report", action="store_true", help="only print the table of the saved --out")
    parser.add_argument(
        "--plugin",
        type=pathlib.Path,
        default=None,
        help="another device plugin for every configuration (an executable, as GPUSLICE_NODE_PLUGIN "
        "in docs/real-nodes.md, e.g. a wrapper running HAMi's own); the 'HAMi rate' rows then "
        "run it unchanged",
    )
    parser.add_argument(
        "--only",
        default="",
        help="run only these configurations: their names, separated by '|' (default: all)",
    )
    args = parser.parse_args()
    if args.report:
        return report(args.out)
    problems = realnode.host_problems()
    if problems:
        raise SystemExit("cannot run real nodes here: " + "; ".join(problems))
    results: dict[str, list[dict[str, Any]]] = {}
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-realnode-"))
    root = pathlib.Path(tempfile.mkdtemp(prefix="gsn-", dir="/tmp"))
    plugin = (
        nodeplugins.external_plugin(args.plugin)
        if args.plugin is not None
        else nodeplugins.gpuslice_plugin("nvml")
    )
    wanted = {name.strip() for name in args.only.split("|") if name.strip()}
    unknown = wanted - CONFIGS.keys()
    if unknown:
        raise SystemExit(f"unknown configurations: {sorted(unknown)}; known: {list(CONFIGS)}")
    configs = {name: c for name, c in CONFIGS.items() if not wanted or name in wanted}
    with ControlPlane() as cp:
        nodes = [
            realnode.RealNode(
                cp, f"bench-{i}", 70 + i, root / f"bench-{i}", plugin=plugin, machine=MACHINE, labels=LABELS
            )
            for i in range(2)
        ]  # fmt: skip
        realnode.start_all(nodes)
        try:
            costs = {n.name: node_cost(n) for n in nodes}
            plugin_flags: tuple[str, ...] = FAST
            for config, (serve, render, gpu, flags) in configs.items():
                if flags != plugin_flags and args.plugin is None:
                    for node in nodes:
                        node.plugin_command = nodeplugins.gpuslice_plugin("nvml", extra_args=flags)
                        node.restart_plugin()
                    plugin_flags = flags
                ext = devcluster.Extender(cp.kubeconfig, work / "gpuslice.log", extra_args=serve).start()
                cp.start_scheduler(
                    devcluster.render_scheduler_config(ext.url, cp.kubeconfig, SCHEDULER, extra_args=render)
                )
                try:
                    for rep in range(args.reps):
                        ns = f"b-{uuid.uuid4().hex[:6]}"
                        cp.api_request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
                        waits0, binds0 = lock_waits(ext), bind_seconds(ext)
                        row = burst(cp, ns, args.pods, args.threads, SCHEDULER, gpu)
                        row["lock_waits"] = lock_waits(ext) - waits0
                        total, count = (b - a for a, b in zip(binds0, bind_seconds(ext), strict=True))
                        row["bind_mean_ms"] = 1e3 * total / count if count else 0.0
                        results.setdefault(config, []).append(row)
                        save(args, costs, results)
                        print(f"{config:42s} rep {rep}: {json.dumps(row)}", flush=True)
                        clear(cp, ns)
                finally:
                    cp.stop_scheduler()
                    ext.stop()
        finally:
            for n in nodes:
                n.stop()
    root.rmdir()
    return report(args.out)


METRICS = ("bound_per_s", "running_per_s", "latency_median_s", "latency_p90_s", "bind_mean_ms", "lock_waits")


def report(path: pathlib.Path) -> int:
    """Print the table of a run's JSON (medians over each configuration's bursts)."""
    saved = json.loads(path.read_text())
    print(
        f"\n{saved['pods']}-pod bursts, {saved['reps']} per configuration, 2 real nodes ({saved['machine']}, "
        f"device plugin: {saved.get('plugin', 'gpuslice-dev device-plugin')}); medians over bursts"
    )
    header = f"{'configuration':42s} {'bound/s':>8s} {'running/s':>9s} {'lat p50':>8s} {'lat p90':>8s}"
    print(header + f" {'bind ms':>8s} {'lock waits':>10s}  pods per node")
    for config, rows in saved["results"].items():
        med = {k: statistics.median(r.get(k, 0.0) for r in rows) for k in METRICS}
        spread = " / ".join(",".join(str(n) for n in r["nodes"].values()) for r in rows)
        print(
            f"{config:42s} {med['bound_per_s']:8.2f} {med['running_per_s']:9.2f} "
            f"{med['latency_median_s']:7.1f}s {med['latency_p90_s']:7.1f}s {med['bind_mean_ms']:8.0f} "
            f"{med['lock_waits']:10.0f}  {spread}"
        )
    print("\nper node, resident memory when idle (MiB): " + json.dumps(saved.get("node_cost", {})))
    print(f"from {path}")
    return 0


def node_cost(node: realnode.RealNode) -> dict[str, float]:
    """Resident memory (MiB) of the node's own processes: containerd, kubelet, the device plugin."""

    def rss(pid: int) -> float:
        try:
            for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    out = {}
    for proc in (node.containerd, node.kubelet, node.plugin):
        if proc is not None:
            out[f"{proc.name}_rss_mib"] = round(rss(proc.pid), 1)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
