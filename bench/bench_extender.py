"""Extender benchmarks: HTTP latency, end-to-end throughput against a real kube-scheduler, RSS.

(a) latency: filter + prioritize over HTTP for one GPU pod with 500 candidate node names, served
    by real uvicorn on 127.0.0.1 from an in-memory 5000-node x 8-GPU cache. The headline client is
    a raw keep-alive HTTP/1.1 socket (kube-scheduler's Go net/http costs about as little); httpx
    (about 0.45 ms of its own per request) is reported under ``httpx_client`` for reference. Bodies
    are encoded outside the timed region. Targets p50 1 ms, p99 3 ms (the pair).
(c) rss: the same server process holds 5000 nodes and 50k pods; its VmRSS after the run.
    Target <= 300 MB.
(b) throughput: the same N one-GPU pods on the same fake nodes (nodesim), scheduled once by
    kube-scheduler alone with ``nvidia.com/gpu`` as a plain extended resource and once by
    kube-scheduler + gpuslice (``render scheduler-config``); bind times come from the node
    simulator's pod watch (the harness adds no watch of its own).
    Rate = (N - 1) / (last bind - first bind); alternating rounds, medians compared. Target ratio
    >= 0.6.

Run:
    .venv/bin/python bench/bench_extender.py latency [--reps 500]        # (a) + (c)
    .venv/bin/python bench/bench_extender.py throughput [--pods 200]     # (b), needs the control plane
    .venv/bin/python bench/bench_extender.py all
Writes out/bench_extender_latency.json, out/bench_extender_throughput.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    pass

OUT = pathlib.Path("out")
NODES = 5000
GPUS = 8
MEM = 81920
CANDIDATES = 500


# ----------------------------------------------------------------------------- (a) + (c) server


def build_cache(pods: int, seed: int) -> Any:
    """5000 nodes x 8 A100 and ``pods`` one-card pods of 2..16 GiB / 0..30 cores, spread randomly."""
    from gpuslice.cache import cache as caches
    from gpuslice.model import allocations, devices, nodes

    rng = np.random.default_rng(seed)
    c = caches.ClusterCache()
    for n in range(NODES):
        devs = tuple(
            devices.GpuDevice(
                uuid=f"GPU-{n}-{i}", index=i, type="NVIDIA A100-SXM4-80GB", memory_mib=MEM, numa=i // 4
            )
            for i in range(GPUS)
        )
        c.upsert_node(nodes.NodeInventory(name=f"node-{n:05d}", devices=devs))
    cards = rng.integers(0, NODES * GPUS, pods)
    mems = rng.integers(2, 17, pods) * 1024
    cores = rng.choice([0, 10, 20, 30], pods)
    for k in range(pods):
        n, i = divmod(int(cards[k]), GPUS)
        grant = allocations.DeviceGrant(f"GPU-{n}-{i}", int(mems[k]), int(cores[k]))
        alloc = allocations.PodAllocation(node=f"node-{n:05d}", containers=((grant,),))
        c.add_pod(f"bench/p-{k}", f"uid-{k}", alloc)
    return c


class _NoBinder:
    """A ``Binder`` for a server that is never asked to bind (filter and prioritize only)."""

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def lock_node(self, node: str, namespace: str, name: str) -> str:
        raise RuntimeError("no binds in this benchmark")

    async def unlock_node(self, node: str, namespace: str, name: str) -> None:
        return None

    async def annotate(
        self,
        namespace: str,
        name: str,
        uid: str,
        annotations: Mapping[str, str | None],
        timeout: float | None = None,
    ) -> None:
        return None

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, timeout: float | None = None
    ) -> None:
        return None

    async def touch_node(self, node: str, annotations: Mapping[str, str]) -> None:
        return None


def serve_memory(port: int, pods: int, seed: int) -> None:
    """The benchmark server: the real app on an in-memory cache (no apiserver)."""
    import uvicorn

    from gpuslice.extender import app as apps
    from gpuslice.extender import bind as binds
    from gpuslice.extender import config, logs, metrics, scheduling, view

    cache = build_cache(pods, seed)
    cache.snapshot()
    gc.collect()
    gc.freeze()
    settings = config.Settings(events=False)
    log = logs.Log(0)
    m = metrics.Metrics(lambda: view.states(cache.snapshot()))
    policies = scheduling.Policies.build(settings.node_policy, settings.card_policy)
    flow = binds.BindFlow(
        cache=cache,
        binder=_NoBinder(),
        policies=policies,
        request_config=settings.request_config,
        clock=time.time,
        log=log,
        metrics=m,
        lock_wait_s=settings.lock_wait_s,
        bind_timeout_s=settings.bind_timeout_s,
        commit_deadline_s=settings.commit_deadline_s,
        sync_wait_s=settings.sync_wait_s,
    )  # the only writer and always synced: Trusting truth, leading, no exclusions (the defaults)
    deps = apps.Deps(
        settings=settings,
        cache=cache,
        flow=flow,
        policies=policies,
        log=log,
        metrics=m,
        events=binds.NoEvents(),
    )
    uvicorn.run(
        apps.create_app(deps),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
    )


def _pod(k: int) -> dict[str, Any]:
    """A pod as kube-scheduler sends it (managedFields stripped), about 1.5 KB of JSON."""
    return {
        "metadata": {
            "name": f"bench-{k}",
            "namespace": "default",
            "uid": f"5f3c9d1e-0000-4000-8000-{k:012d}",
            "resourceVersion": str(100000 + k),
            "creationTimestamp": "2026-11-30T01:00:00Z",
            "labels": {"app": "train", "team": "ml"},
            "annotations": {"example.com/owner": "bench"},
        },
        "spec": {
            "schedulerName": "gpuslice-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                    "command": ["python", "train.py"],
                    "resources": {
                        "limits": {
                            "nvidia.com/gpu": "1",
                            "nvidia.com/gpumem": "8000",
                            "nvidia.com/gpucores": "30",
                        },
                        "requests": {"cpu": "4", "memory": "16Gi"},
                    },
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "restartPolicy": "Never",
            "priority": 0,
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def _compact(obj: Any) -> bytes:
    """JSON without spaces, as Go's ``json.Marshal`` (kube-scheduler) writes it."""
    return json.dumps(obj, separators=(",", ":")).encode()


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback URL we built
        text: str = resp.read().decode()
    return text


def _rss_mb(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class RawClient:
    """A minimal keep-alive HTTP/1.1 client on a socket, to separate httpx's own cost (about 0.45 ms
    per request here) from the server's; kube-scheduler's Go client is closer to this one."""

    def __init__(self, port: int) -> None:
        import socket

        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def post(self, path: str, body: bytes) -> bytes:
        head = f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        self.sock.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        header, _, rest = self.buf.partition(b"\r\n\r\n")
        length = 0
        for line in header.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v)
        while len(rest) < length:
            rest += self.sock.recv(65536)
        self.buf = rest[length:]
        return rest[:length]

    def close(self) -> None:
        self.sock.close()


def _server_side(text: str) -> dict[str, float]:
    """Mean handler time per verb from the server's own latency histogram (decode to encode)."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        for suffix, into in (("_sum", sums), ("_count", counts)):
            prefix = f'gpuslice_extender_request_duration_seconds{suffix}{{verb="'
            if line.startswith(prefix):
                verb = line[len(prefix) :].split('"', 1)[0]
                into[verb] = float(line.rsplit(" ", 1)[1])
    return {v: round(sums[v] / counts[v] * 1e3, 3) for v in sums if counts.get(v)}


def latency(reps: int, pods: int, seed: int) -> dict[str, Any]:
    """(a) and (c): start the server, time filter + prioritize, read its RSS."""
    import httpx

    from gpuslice.devcluster import devcluster

    port = devcluster.free_port()
    server = subprocess.Popen(  # noqa: S603 - this script
        [sys.executable, __file__, "_serve", "--port", str(port), "--pods", str(pods), "--seed", str(seed)],
        stdin=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        t0 = time.perf_counter()
        while devcluster.http_status(url + "/healthz") != 200:
            if server.poll() is not None:
                raise RuntimeError("benchmark server exited")
            time.sleep(0.2)
        startup_s = time.perf_counter() - t0
        rng = np.random.default_rng(seed + 1)
        all_names = [f"node-{n:05d}" for n in range(NODES)]
        batches = [[all_names[j] for j in rng.choice(NODES, CANDIDATES, replace=False)] for _ in range(16)]
        # Request bodies are encoded and answers decoded outside the timed region: the figures are
        # the extender's round trip (kube-scheduler's own JSON work is not gpuslice's cost).
        raw = RawClient(port)
        raw_filt: list[float] = []
        raw_prio: list[float] = []
        raw_pair: list[float] = []
        feasible: list[int] = []
        body_bytes = 0
        for k in range(reps + 50):
            args = {"Pod": _pod(100_000 + k), "Nodes": None, "NodeNames": batches[k % len(batches)]}
            body = _compact(args)
            body_bytes = len(body)
            t0 = time.perf_counter()
            answer = raw.post("/filter", body)
            t1 = time.perf_counter()
            ok = json.loads(answer)["NodeNames"]
            pbody = _compact({"Pod": args["Pod"], "Nodes": None, "NodeNames": ok})
            t2 = time.perf_counter()
            raw.post("/prioritize", pbody)
            t3 = time.perf_counter()
            if k >= 50:  # warm-up excluded
                raw_filt.append((t1 - t0) * 1e3)
                raw_prio.append((t3 - t2) * 1e3)
                raw_pair.append((t1 - t0 + t3 - t2) * 1e3)
                feasible.append(len(ok))
        raw.close()
        server_side = _server_side(_get(url + "/metrics"))
        filt: list[float] = []
        prio: list[float] = []
        pair: list[float] = []
        with httpx.Client(base_url=url, timeout=10.0) as client:
            for k in range(reps + 50):
                args = {"Pod": _pod(k), "Nodes": None, "NodeNames": batches[k % len(batches)]}
                body = _compact(args)
                t0 = time.perf_counter()
                r = client.post("/filter", content=body, headers={"Content-Type": "application/json"})
                t1 = time.perf_counter()
                ok = r.json()["NodeNames"]
                pbody = _compact({"Pod": args["Pod"], "Nodes": None, "NodeNames": ok})
                t2 = time.perf_counter()
                r2 = client.post("/prioritize", content=pbody, headers={"Content-Type": "application/json"})
                t3 = time.perf_counter()
                assert r.status_code == 200 and r2.status_code == 200
                if k >= 50:  # warm-up excluded
                    filt.append((t1 - t0) * 1e3)
                    prio.append((t3 - t2) * 1e3)
                    pair.append((t1 - t0 + t3 - t2) * 1e3)
        rss = _rss_mb(server.pid)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(10)

    def stats(xs: list[float]) -> dict[str, float]:
        a = np.array(xs)
        return {
            "p50_ms": round(float(np.percentile(a, 50)), 3),
            "p90_ms": round(float(np.percentile(a, 90)), 3),
            "p99_ms": round(float(np.percentile(a, 99)), 3),
            "mean_ms": round(float(a.mean()), 3),
        }

    return {
        "cluster": {"nodes": NODES, "gpus_per_node": GPUS, "pods_in_cache": pods, "candidates": CANDIDATES},
        "reps": reps,
        "filter_request_bytes": body_bytes,
        "mean_feasible_nodes": float(np.mean(feasible)),
        "filter_plus_prioritize": stats(raw_pair),
        "targets": {"pair_p50_ms": 1.0, "pair_p99_ms": 3.0, "rss_mb": 300},
        "client": "raw keep-alive HTTP/1.1 socket (like Go net/http); httpx rows for reference",
        "filter": stats(raw_filt),
        "prioritize": stats(raw_prio),
        "server_side_handler_mean_ms": server_side,
        "httpx_client": {
            "filter": stats(filt),
            "prioritize": stats(prio),
            "filter_plus_prioritize": stats(pair),
        },
        "load_average_1m": round(os.getloadavg()[0], 2),
        "server_startup_s": round(startup_s, 2),
        "server_rss_mb": round(rss, 1),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }


# ----------------------------------------------------------------------------- (b) throughput


async def _create_pods(kube: Any, ns: str, n: int, scheduler: str) -> None:
    sem = asyncio.Semaphore(16)

    async def one(k: int) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"tp-{k:05d}", "namespace": ns},
            "spec": {
                "schedulerName": scheduler,
                "containers": [
                    {"name": "c", "image": "pause", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ],
            },
        }
        async with sem:
            await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body=body)

    await asyncio.gather(*(one(k) for k in range(n)))


def _cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) of this process and every descendant, by command name."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    info: dict[int, tuple[str, float]] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        ppid, utime, stime = int(fields[1]), int(fields[11]), int(fields[12])
        children.setdefault(ppid, []).append(int(entry.name))
        info[int(entry.name)] = (comm, (utime + stime) / tick)
    out: dict[str, float] = {}
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        if pid in info:
            comm, cpu = info[pid]
            name = "bench (nodesim)" if pid == os.getpid() else comm
            out[name] = out.get(name, 0.0) + cpu
        todo.extend(children.get(pid, []))
    return out


async def _measure(
    cp: Any, kubeconfig: pathlib.Path, ns: str, n: int, scheduler: str, config_yaml: str, sim: Any
) -> dict[str, Any]:
    """Create n pods with no scheduler running, start it, time the binds.

    Bind times come from the node simulator's pod watch (it sees every pod as it gets its node, in
    both modes), so the harness adds no watch stream of its own to the measured CPU.
    """
    from gpuslice.kube import client as kclient

    kube = kclient.KubeClient.from_kubeconfig(kubeconfig, qps=1000, burst=1000)
    bound: dict[str, float] = {}

    def on_bound(pod: Any) -> None:  # called on the simulator's thread; a dict update is atomic
        if pod.metadata.namespace == ns:
            bound.setdefault(pod.metadata.name, time.perf_counter())

    for one in sim.sims:
        one.on_bound = on_bound
    try:
        await _create_pods(kube, ns, n, scheduler)
        cpu_before = _cpu_seconds()
        t_start = time.perf_counter()
        await asyncio.to_thread(cp.start_scheduler, config_yaml)
        deadline = time.perf_counter() + 600
        while len(bound) < n and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
        times = sorted(bound.values())
        cpu_after = _cpu_seconds()
    finally:
        await asyncio.to_thread(cp.stop_scheduler)
        for one in sim.sims:
            one.on_bound = None
        await kube.aclose()
    if len(times) < 2:
        return {"pods": n, "bound": len(times), "pods_per_s": 0.0}
    span = times[-1] - times[0]
    return {
        "pods": n,
        "bound": len(times),
        "first_bind_after_start_s": round(times[0] - t_start, 3),
        "bind_span_s": round(span, 3),
        "pods_per_s": round((len(times) - 1) / span, 1) if span > 0 else float("inf"),
        "cpu_seconds_by_process": {  # processes started during the run (kube-scheduler) count from 0
            k: round(v - cpu_before.get(k, 0.0), 2)
            for k, v in cpu_after.items()
            if v - cpu_before.get(k, 0.0) >= 0.05
        },
    }


def _settle(cp: Any, ns: str, timeout_s: float = 20.0) -> None:
    """Wait until the namespace has no pods and this process tree is nearly idle (< 15 % of a core)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status, body = cp.api_request("GET", f"/api/v1/namespaces/{ns}/pods?limit=1")
        if status == 200 and not body.get("items"):
            break
        time.sleep(0.2)
    time.sleep(1.0)  # informers see the deletions
    while time.monotonic() < deadline:
        before = sum(_cpu_seconds().values())
        time.sleep(0.5)
        if sum(_cpu_seconds().values()) - before < 0.075:
            return


def throughput(pods: int, nodes: int, rounds: int = 3) -> dict[str, Any]:
    """(b): the same pods on the same nodes, kube-scheduler alone vs with gpuslice."""
    import yaml

    from gpuslice.devcluster import devcluster
    from gpuslice.devcluster.controlplane import ControlPlane

    cp = ControlPlane()
    cp.start()
    sim = ext = None
    try:
        specs = {f"tp-node-{i:03d}": {"count": 8, "numa_nodes": 2} for i in range(nodes)}
        sim = devcluster.NodeSimThread(cp.kubeconfig, specs).start()
        ext = devcluster.Extender(cp.kubeconfig, cp.workdir / "gpuslice.log", extra_args=["-v", "0"]).start()
        with_ext = devcluster.render_scheduler_config(ext.url, cp.kubeconfig, "gpuslice-scheduler")
        plain = yaml.safe_load(with_ext)
        plain.pop("extenders")
        plain["profiles"] = [{"schedulerName": "plain-scheduler"}]
        plain_yaml = yaml.safe_dump(plain)
        results: dict[str, Any] = {
            "nodes": nodes,
            "gpus_per_node": 8,
            "pods": pods,
            "rounds": rounds,
            "warmup_rounds_excluded": 1,
            "kube_scheduler_client": "defaults in both modes (clientConnection qps 50, burst 100)",
        }
        runs: dict[str, list[dict[str, Any]]] = {
            "kube_scheduler_alone": [],
            "kube_scheduler_with_gpuslice": [],
        }
        # Round 0 of each mode is a warm-up (caches, connections, the apiserver's watch cache) and
        # is not counted; then the modes alternate. Between runs the pods are deleted and the
        # machine left to settle, so one run's clean-up does not eat into the next run's CPU.
        for r in range(rounds + 1):
            for label, sched, conf in (
                ("kube_scheduler_alone", "plain-scheduler", plain_yaml),
                ("kube_scheduler_with_gpuslice", "gpuslice-scheduler", with_ext),
            ):
                ns = f"tp-{label.rsplit('_', 1)[-1]}-{r}"
                status, body = cp.api_request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
                assert status == 201, body
                one = asyncio.run(_measure(cp, cp.kubeconfig, ns, pods, sched, conf, sim))
                if r > 0:
                    runs[label].append(one)
                cp.api_request("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0")
                _settle(cp, ns)
        for label, measured in runs.items():
            rates = sorted(m["pods_per_s"] for m in measured)
            results[label] = {
                "median_pods_per_s": rates[len(rates) // 2],
                "pods_per_s_each": rates,
                "runs": measured,
            }
        a = results["kube_scheduler_alone"]["median_pods_per_s"]
        b = results["kube_scheduler_with_gpuslice"]["median_pods_per_s"]
        results["ratio_with_over_alone"] = round(b / a, 3) if a else None
        results["target_ratio"] = 0.6
        text = _get(ext.url + "/metrics")
        results["gpuslice_server_side_handler_mean_ms"] = _server_side(text)
        results["gpuslice_counters"] = {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(
                ("gpuslice_bind_total", "gpuslice_bind_node_lock_waits_total", "gpuslice_api_errors_total")
            )
        }
        sched_log = (cp.workdir / "kube-scheduler.log").read_text(errors="replace")
        results["kube_scheduler_log_counts"] = {
            k: sched_log.count(k)
            for k in ("FailedScheduling", "Error scheduling pod", "failed bind", "Unschedulable")
        }
        results["load_average_1m"] = round(os.getloadavg()[0], 2)
        return results
    finally:
        if ext is not None:
            ext.stop()
        if sim is not None:
            sim.stop()
        cp.stop()


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["latency", "throughput", "all", "_serve"])
    ap.add_argument("--reps", type=int, default=500)
    ap.add_argument(
        "--pods", type=int, default=None, help="latency: pods in the cache (50000); throughput: pods (200)"
    )
    ap.add_argument("--nodes", type=int, default=25, help="throughput: fake nodes of 8 GPUs")
    ap.add_argument("--rounds", type=int, default=3, help="throughput: alternating runs of each (median)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    if args.what == "_serve":
        serve_memory(args.port, args.pods if args.pods is not None else 50_000, args.seed)
        return
    OUT.mkdir(exist_ok=True)
    if args.what in ("latency", "all"):
        res = latency(
            args.reps, args.pods if args.pods is not None and args.what == "latency" else 50_000, args.seed
        )
        (OUT / "bench_extender_latency.json").write_text(json.dumps(res, indent=2) + "\n")
        print(json.dumps(res, indent=2))
    if args.what in ("throughput", "all"):
        n = args.pods if args.pods is not None and args.what == "throughput" else 200
        res = throughput(n, args.nodes, args.rounds)
        (OUT / "bench_extender_throughput.json").write_text(json.dumps(res, indent=2) + "\n")
        print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
