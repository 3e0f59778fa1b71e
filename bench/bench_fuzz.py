"""Hostile HTTP input against a real ``gpuslice serve``: fuzz, slow connections, large annotations.

(a) depth: the cost of the JSON depth check (``extender.jsondepth.too_deep``) per request on
    filter bodies built as bench_extender.py builds them, next to msgspec's decode of the same
    body: the bench pod with 500 and with ~3500 candidate names (cheap path: few brackets), a
    richer pod (env, volumes, probes, affinity: over 64 brackets, exact scan) and the same with a
    ``last-applied-configuration`` annotation (JSON inside a string, escapes). No server.
(b) fuzz: on a fresh local control plane with two fake GPU nodes, one ``gpuslice serve`` with its
    default timeouts (header 10 s, body 10 s), ``--leader-elect none`` and an FGD-style node policy
    whose learned workload is trusted from the first request and handed each shape at once (so a
    hostile pod reaching the workload would reach every later decision):
    - RSS of the extender before and after 300 pods that each carry a 200 KB unrelated annotation
      are created (after the watch delivered them, and after a relist: ``--resync-period-s 20``);
    - 10 000 fuzzed requests (``devcluster.hostile.probes``) over the five verbs, malformed ones and
      valid ones with hostile values (absurd amounts, over-long names, 256 KB of annotations): the
      count of each status code (goal: no 5xx);
    - 200 slow connections that never finish their headers or body: how many are still open
      after 30 s (goal: 0), while normal /filter calls go on;
    - request memory, each case on a fresh extender (``hostile.MEMORY_CASES``): RSS growth over 200
      filter calls for pods carrying 256 KB of unrelated annotations, over 10 000 distinct
      over-long node names and over 10 000 distinct names of 253 characters (goal: under 30 MiB).
    ``--untrimmed`` runs the same extender with the pod store keeping every annotation (for the
    RSS comparison only: ``kinds.PODS`` is replaced through a ``sitecustomize`` in the child).

Run:
    .venv/bin/python bench/bench_fuzz.py depth
    GPUSLICE_CONTROL_PLANE_BIN=$(bash hack/control-plane/build.sh | tail -1) \\
        .venv/bin/python bench/bench_fuzz.py fuzz [--requests 10000] [--slow 200] [--untrimmed]
Writes out/bench_fuzz_depth.json, out/bench_fuzz.json (out/bench_fuzz_untrimmed.json).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import random
import statistics
import tempfile
import time
import timeit
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import bench_extender
from gpuslice_dev import devcluster, hostile
from gpuslice_dev.controlplane import ControlPlane

OUT = pathlib.Path("out")
NODES = ("fuzz-0", "fuzz-1")
BIG_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"
UNTRIMMED_SITECUSTOMIZE = """
from gpuslice.kube import kinds, objects
kinds.PODS = kinds.Kind("pods", "/api/v1/pods", objects.Pod, lambda p: p.metadata)
"""


# ----------------------------------------------------------------------------- (a) depth


def _rich_pod(k: int, last_applied: bool) -> dict[str, Any]:
    """bench_extender's pod with the spec of a typical Deployment pod (over 64 brackets)."""
    pod = bench_extender._pod(k)
    c = pod["spec"]["containers"][0]
    c["env"] = [{"name": f"ENV_{i}", "value": f'value {i} with "quotes" and [brackets]'} for i in range(40)]
    c["env"] += [
        {"name": f"REF_{i}", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} for i in range(10)
    ]
    c["ports"] = [{"containerPort": 8000 + i, "protocol": "TCP"} for i in range(5)]
    c["livenessProbe"] = {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10}
    pod["spec"]["volumes"] += [
        {"name": f"cfg-{i}", "configMap": {"name": f"cm-{i}", "items": [{"key": "a", "path": "a"}]}}
        for i in range(10)
    ]
    term = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100", "h100"]}]}
    pod["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    }
    if last_applied:
        pod["metadata"]["annotations"][BIG_ANNOTATION] = json.dumps({"spec": pod["spec"]})
    return pod


def _per_call_us(fn: Any, number: int = 200, repeat: int = 15) -> dict[str, float]:
    times = [t / number * 1e6 for t in timeit.repeat(fn, number=number, repeat=repeat)]
    return {"min_us": round(min(times), 2), "median_us": round(statistics.median(times), 2)}


def depth_cost() -> dict[str, Any]:
    """(a): ``too_deep`` and msgspec's decode per call on four filter bodies."""
    from gpuslice.extender import wire
    from gpuslice.extender.http import jsondepth

    rng = random.Random(7)
    names = [f"node-{n:05d}" for n in range(5000)]
    bodies = {
        "bench pod, 500 names": (bench_extender._pod(1), 500),
        "bench pod, 3500 names": (bench_extender._pod(1), 3500),
        "rich pod, 2500 names": (_rich_pod(1, False), 2500),
        "rich pod + last-applied annotation, 2000 names": (_rich_pod(1, True), 2000),
    }
    out: dict[str, Any] = {}
    for label, (pod, n) in bodies.items():
        body = bench_extender._compact({"Pod": pod, "Nodes": None, "NodeNames": rng.sample(names, n)})
        out[label] = {
            "bytes": len(body),
            "open_brackets": body.count(b"[") + body.count(b"{"),
            "depth": jsondepth.max_depth(body),
            "exact_scan": body.count(b"[") + body.count(b"{") > 64,
            "too_deep": _per_call_us(lambda body=body: jsondepth.too_deep(body, 64)),
            "msgspec_decode": _per_call_us(lambda body=body: wire.FILTER_DECODER.decode(body)),
        }
    return {
        "limit": 64,
        "bodies": out,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }


# ----------------------------------------------------------------------------- (b) fuzz


def _big_pod(ns: str, i: int, size: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"big-{i:04d}", "namespace": ns, "annotations": {BIG_ANNOTATION: "x" * size}},
        "spec": {
            "schedulerName": "nobody-schedules-this",
            "containers": [{"name": "c", "image": "pause", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }


def fuzz(requests: int, slow: int, pods: int, annotation_kb: int, untrimmed: bool) -> dict[str, Any]:
    """(b): RSS with large annotations, the fuzz, the slow connections."""
    cp = ControlPlane()
    cp.start()
    sim = ext = None
    site = tempfile.TemporaryDirectory()
    try:
        env: dict[str, str] = {}
        if untrimmed:
            pathlib.Path(site.name, "sitecustomize.py").write_text(UNTRIMMED_SITECUSTOMIZE)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (site.name, os.environ.get("PYTHONPATH")) if p)
        sim = devcluster.NodeSimThread(
            cp.kubeconfig, {n: {"count": 4, "numa_nodes": 2} for n in NODES}
        ).start()
        args = ["--leader-elect", "none", "--resync-period-s", "20", *hostile.LEARNING_ARGS, "-v", "0"]
        ext = devcluster.Extender(
            cp.kubeconfig, cp.workdir / "gpuslice.log", extra_args=args, env=env
        ).start()
        assert ext.pid is not None
        results: dict[str, Any] = {"pod_store": "untrimmed (every annotation)" if untrimmed else "trimmed"}

        # RSS with large annotations
        rss: dict[str, float] = {"before": hostile.settled_rss(ext.pid)}
        ns = "big"
        status, body = cp.api_request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        assert status == 201, body

        def create(i: int) -> None:
            code, obj = cp.api_request(
                "POST", f"/api/v1/namespaces/{ns}/pods", _big_pod(ns, i, annotation_kb * 1024)
            )
            assert code == 201, obj

        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, range(pods)))
        created_s = time.monotonic() - t0
        rss["after_watch"] = hostile.settled_rss(ext.pid)
        time.sleep(22.0)  # a relist (resync 20 s) lists every big pod again in one page
        rss["after_relist"] = hostile.settled_rss(ext.pid)
        results["rss_mb"] = {k: round(v, 1) for k, v in rss.items()}
        results["big_pods"] = {"pods": pods, "annotation_kb": annotation_kb, "create_s": round(created_s, 1)}
        results["rss_growth_mb"] = round(rss["after_relist"] - rss["before"], 1)

        if requests:
            results["fuzz"] = _fuzz(ext, requests)
        if slow:
            results["slow_connections"] = _slow(ext.port, slow)
        results["rss_mb"]["end"] = round(hostile.rss_mb(ext.pid), 1)
        results["request_memory"] = {case: _request_memory(cp, case) for case in hostile.MEMORY_CASES}
        results["alive_at_end"] = ext.running()
        results["log_tracebacks"] = ext.log_path.read_text(errors="replace").count("Traceback")
        results["load_average_1m"] = round(os.getloadavg()[0], 2)
        results["cpus"] = os.cpu_count()
        return results
    finally:
        if ext is not None:
            ext.stop()
        if sim is not None:
            sim.stop()
        cp.stop()
        site.cleanup()


def _request_memory(cp: ControlPlane, case: str) -> dict[str, Any]:
    """RSS of a fresh extender before and after 200 requests of one ``hostile.MEMORY_CASES`` case."""
    args = ["--leader-elect", "none", *hostile.LEARNING_ARGS, "-v", "0"]
    ext = devcluster.Extender(
        cp.kubeconfig, cp.workdir / f"memory-{case.replace(' ', '-')}.log", extra_args=args
    )
    ext.start()
    try:
        assert ext.pid is not None
        rng = random.Random(7)
        for _ in range(20):  # warm up
            hostile.send("127.0.0.1", ext.port, hostile.probe("valid", "/filter", rng, list(NODES), 0).raw)
        before = hostile.settled_rss(ext.pid)
        statuses: collections.Counter[int] = collections.Counter()
        for i in range(200):
            verb, body, _ = hostile.memory_probe(case, i, rng, list(NODES))
            statuses[
                hostile.send("127.0.0.1", ext.port, hostile.request(verb, json.dumps(body).encode()))
            ] += 1
        after = hostile.settled_rss(ext.pid)
        return {
            "requests": 200,
            "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "rss_before_mb": round(before, 1),
            "rss_after_mb": round(after, 1),
            "growth_mb": round(after - before, 1),
        }
    finally:
        ext.stop()


def _fuzz(ext: devcluster.Extender, requests: int) -> dict[str, Any]:
    """The fuzz: status counts, in all and per probe kind."""
    probes = hostile.probes(requests, seed=20261201, nodes=list(NODES))
    t0 = time.monotonic()
    counts = hostile.fuzz("127.0.0.1", ext.port, probes, workers=8, timeout=40)
    elapsed = time.monotonic() - t0
    every = hostile.total(counts)
    return {
        "requests": requests,
        "status_counts": {str(k): v for k, v in sorted(every.items())},
        "server_errors_5xx": sum(v for k, v in every.items() if k >= 500),
        "by_kind": {kind: {str(k): v for k, v in sorted(c.items())} for kind, c in sorted(counts.items())},
        "elapsed_s": round(elapsed, 1),
        "alive_after": ext.running(),
        "healthz_after": devcluster.http_status(ext.url + "/healthz"),
    }


def _slow(port: int, slow: int) -> dict[str, Any]:
    """Slow connections held 30 s while normal filter calls go on: how many are still open."""
    normal: collections.Counter[int] = collections.Counter()
    valid = hostile.probe("valid", "/filter", random.Random(1), list(NODES), 0).raw

    def normal_request() -> None:
        normal[hostile.send("127.0.0.1", port, valid)] += 1

    with hostile.SlowClients("127.0.0.1", port, slow) as clients:
        still_open = clients.wait_closed(30.0, on_tick=normal_request)
        all_closed_after = time.monotonic() - clients.opened
    return {
        "opened": slow,
        "kinds": list(hostile.SLOW_KINDS),
        "still_open_after_30s": sum(still_open.values()),
        "still_open_by_kind": still_open,
        "all_closed_after_s": round(all_closed_after, 1) if not still_open else None,
        "normal_filter_statuses_meanwhile": {str(k): v for k, v in normal.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["depth", "fuzz", "all"])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--slow", type=int, default=200)
    ap.add_argument("--pods", type=int, default=300, help="pods carrying a large annotation")
    ap.add_argument("--annotation-kb", type=int, default=200)
    ap.add_argument("--untrimmed", action="store_true", help="pod store keeps every annotation (comparison)")
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    if args.what in ("depth", "all"):
        res = depth_cost()
        (OUT / "bench_fuzz_depth.json").write_text(json.dumps(res, indent=2) + "\n")
        print(json.dumps(res, indent=2))
    if args.what in ("fuzz", "all"):
        res = fuzz(args.requests, args.slow, args.pods, args.annotation_kb, args.untrimmed)
        name = "bench_fuzz_untrimmed.json" if args.untrimmed else "bench_fuzz.json"
        (OUT / name).write_text(json.dumps(res, indent=2) + "\n")
        print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
