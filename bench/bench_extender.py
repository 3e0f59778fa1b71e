"""Extender benchmarks: HTTP latency per policy, end-to-end throughput against a real kube-scheduler.

(a) latency: filter + prioritize over HTTP for one-GPU pods with 500 candidate node names, served
    by real uvicorn on 127.0.0.1 from an in-memory 5000-node x 8-GPU cache holding ``--pods`` pods,
    one server per registered policy (``--policies``, default every ``registry.names()``), the
    policy being the server's ``--node-policy``. The client is a raw keep-alive HTTP/1.1 socket
    (kube-scheduler's Go net/http costs about as little); bodies are encoded outside the timed
    region. Before timing, each server gets at least ``WARMUP`` requests *and* more than its
    ``workload_period_s`` of traffic of a mix of pod shapes, so the workload histogram that
    FGD-style policies score against is filled by filter requests exactly as real traffic fills it
    (and keeps being refreshed during the timed requests, as in production). Targets, per row:
    p50 <= 1 ms, p99 <= 3 ms for the pair. (c) rss: each server's VmRSS after its run.
(b) throughput: at each size (``--sizes``, default 200 pods / 25 nodes and 2000 pods / 200 nodes;
    ``--pods N --nodes M`` for one), in one control plane per size, the same pods are scheduled by
    kube-scheduler alone (a twin of each pod asking ``nvidia.com/gpu: 1`` as a plain extended
    resource, which the fake nodes advertise as HAMi's plugin does: cards x split count) and by
    kube-scheduler + ``gpuslice serve`` for each ``--node-choice`` (each extender started for its
    run only, scheduler config from ``gpuslice render scheduler-config`` with the same choice),
    alternating, after one warm-up round of each. The GPU pods ask 1 GPU and ``--gpumem`` MiB.
    Bind times come from the node simulator's pod watch (the harness adds no watch of its own).
    Rate = (N - 1) / (last bind - first bind); the median of ``--rounds`` rounds per mode and its
    ratio to kube-scheduler alone (target >= 0.8). API requests per bound pod, by verb and
    resource, come from the apiserver's own ``apiserver_request_total`` (every client: kube-scheduler,
    gpuslice, the device-plugin stand-in), counted from the scheduler's start until the last pod's
    device-plugin handshake is done. ``--baseline-src DIR`` adds a ``gpuslice_baseline`` mode: the
    extender (and its ``render``) run from another source tree (e.g. ``git archive HEAD``
    extracted there), for an A/B in the same run.

Run:
    .venv/bin/python bench/bench_extender.py latency [--policies binpack,fgd] [--pods 50000] [--reps 500]
    .venv/bin/python bench/bench_extender.py throughput [--sizes 200x25,2000x200] [--rounds 3]
        [--node-choice extender,rank] [--baseline-src /tmp/base/src]     # needs the control plane
    .venv/bin/python bench/bench_extender.py all
Writes out/bench_extender_latency.json, out/bench_extender_throughput.json.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

OUT = pathlib.Path("out")
NODES = 5000
GPUS = 8
MEM = 81920
CANDIDATES = 500
WARMUP = 50
"""Requests per latency server before timing (at least; see ``_warm``)."""
SHAPES = (  # (gpumem MiB, gpucores): the warm-up mix; every timed pod asks 8000 MiB / 30 cores
    (2000, 0),
    (4000, 10),
    (8000, 30),
    (16000, 50),
    (40000, 100),
)


# ----------------------------------------------------------------------------- (a) + (c) server


def build_cache(pods: int, seed: int) -> Any:
    """5000 nodes x 8 A100 and ``pods`` one-card pods of 2..16 GiB / 0..30 cores, spread randomly.

    Pods are added while they fit (a card holds at most 10 pods and its 80 GiB), as a cluster
    holding them would; 150 000 pods fill about half the slots.
    """
    from gpuslice.cache import cache as caches
    from gpuslice.framework import nominations
    from gpuslice.model import allocations, devices, nodes

    rng = np.random.default_rng(seed)
    c = caches.ClusterCache(nominator=nominations.Nominator())
    for n in range(NODES):
        devs = tuple(
            devices.GpuDevice(
                uuid=f"GPU-{n}-{i}", index=i, type="NVIDIA A100-SXM4-80GB", memory_mib=MEM, numa=i // 4
            )
            for i in range(GPUS)
        )
        c.upsert_node(nodes.NodeInventory(name=f"node-{n:05d}", devices=devs))
    slots = np.zeros(NODES * GPUS, dtype=np.int64)
    mem = np.zeros(NODES * GPUS, dtype=np.int64)
    added = k = 0
    while added < pods and k < 4 * pods + 1000:
        card = int(rng.integers(0, NODES * GPUS))
        m = int(rng.integers(2, 17)) * 1024
        cores = int(rng.choice([0, 10, 20, 30]))
        k += 1
        if slots[card] >= 10 or mem[card] + m > MEM:
            continue
        slots[card] += 1
        mem[card] += m
        n, i = divmod(card, GPUS)
        grant = allocations.DeviceGrant(f"GPU-{n}-{i}", m, cores)
        alloc = allocations.PodAllocation(node=f"node-{n:05d}", containers=((grant,),))
        c.add_pod(f"bench/p-{added}", f"uid-{added}", alloc)
        added += 1
    return c


class _NoBinder:
    """A ``Binder`` for a server that is never asked to bind (filter and prioritize only)."""

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def lock_node(self, node: str, namespace: str, name: str) -> str:
        raise RuntimeError("no binds in this benchmark")

    async def unlock_node(self, node: str, namespace: str, name: str) -> None:
        return None

    async def bind(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        annotations: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> bool:
        return True

    async def label(self, namespace: str, name: str, uid: str, node: str) -> None:
        return None

    async def touch_node(self, node: str, annotations: Mapping[str, str]) -> None:
        return None


def serve_memory(port: int, pods: int, seed: int, node_policy: str, node_choice: str | None) -> None:
    """The benchmark server: the real app on an in-memory cache (no apiserver)."""
    import uvicorn

    from gpuslice.extender import config, metrics
    from gpuslice.extender.binding import bind as binds
    from gpuslice.extender.http import app as apps
    from gpuslice.framework import logs, profile, view

    cache = build_cache(pods, seed)
    cache.snapshot()
    gc.collect()
    gc.freeze()
    overrides: dict[str, Any] = {"events": False, "node_policy": node_policy}
    if node_choice:
        overrides["node_choice"] = node_choice
    settings = config.validate(overrides)
    log = logs.Log(0)
    m = metrics.Metrics(lambda: view.states(cache.snapshot()))
    policies = profile.Profile.build(settings.node_policy, settings.card_policy, choice=settings.node_choice)
    flow = binds.BindFlow(
        cache=cache,
        binder=_NoBinder(),
        profile=policies,
        request_config=settings.request_config,
        clock=time.time,
        log=log,
        metrics=m,
        # The only writer, always leading and synced: no truth check, no exclusions, no HAMi lock.
        truth=binds.Trusting(),
        leading=lambda: True,
        synced=lambda: True,
        excluded={},
        lock_owner=lambda node: None,
        lock_wait_s=settings.lock_wait_s,
        bind_timeout_s=settings.bind_timeout_s,
        commit_deadline_s=settings.commit_deadline_s,
        sync_wait_s=settings.sync_wait_s,
    )
    deps = apps.Deps(
        settings=settings,
        cache=cache,
        flow=flow,
        profile=policies,
        log=log,
        metrics=m,
        events=binds.NoEvents(),
        follower=lambda: False,
        follower_ready=True,
        synced=lambda: True,
        excluded={},
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


def _pod(k: int, gpumem: int = 8000, cores: int = 30) -> dict[str, Any]:
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
                            "nvidia.com/gpumem": str(gpumem),
                            "nvidia.com/gpucores": str(cores),
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
    """A minimal keep-alive HTTP/1.1 client on a socket, to separate a Python client's own cost from
    the server's; kube-scheduler's Go client is closer to this one."""

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


def _stats(xs: Sequence[float]) -> dict[str, float]:
    a = np.array(xs)
    return {
        "p50_ms": round(float(np.percentile(a, 50)), 3),
        "p90_ms": round(float(np.percentile(a, 90)), 3),
        "p99_ms": round(float(np.percentile(a, 99)), 3),
        "mean_ms": round(float(a.mean()), 3),
    }


def _pair(raw: RawClient, pod: dict[str, Any], names: list[str]) -> tuple[float, float, int]:
    """One filter + prioritize round trip: (filter ms, prioritize ms, feasible nodes)."""
    body = _compact({"Pod": pod, "Nodes": None, "NodeNames": names})
    t0 = time.perf_counter()
    answer = raw.post("/filter", body)
    t1 = time.perf_counter()
    ok = json.loads(answer)["NodeNames"] or []
    pbody = _compact({"Pod": pod, "Nodes": None, "NodeNames": ok})
    t2 = time.perf_counter()
    raw.post("/prioritize", pbody)
    t3 = time.perf_counter()
    return (t1 - t0) * 1e3, (t3 - t2) * 1e3, len(ok)


def _warm(raw: RawClient, batches: list[list[str]], workload_period_s: float) -> int:
    """Requests of the shape mix until ``WARMUP`` were sent and the workload period passed twice.

    The extender hands the shapes of newly filtered pods to its workload histogram once per
    ``workload_period_s`` (on a filter request after the period); two periods guarantee at least
    one hand-over, so FGD-style policies are timed against a filled histogram.
    """
    start = time.monotonic()
    k = 0
    while k < WARMUP or time.monotonic() - start < 2 * workload_period_s + 0.1:
        mem, cores = SHAPES[k % len(SHAPES)]
        _pair(raw, _pod(10_000_000 + k, mem, cores), batches[k % len(batches)])
        k += 1
    return k


def latency_one(policy: str, reps: int, pods: int, seed: int, node_choice: str | None) -> dict[str, Any]:
    """(a) and (c) for one node policy: start its server, warm it, time filter + prioritize."""
    from gpuslice.extender import config
    from gpuslice_dev import devcluster

    port = devcluster.free_port()
    cmd = [sys.executable, __file__, "_serve", "--port", str(port), "--pods", str(pods), "--seed", str(seed)]
    cmd += ["--policy", policy] + (["--node-choice", node_choice] if node_choice else [])
    server = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)  # noqa: S603 - this script
    try:
        url = f"http://127.0.0.1:{port}"
        t0 = time.perf_counter()
        while devcluster.http_status(url + "/healthz") != 200:
            if server.poll() is not None:
                raise RuntimeError(f"benchmark server for {policy} exited")
            time.sleep(0.2)
        startup_s = time.perf_counter() - t0
        rng = np.random.default_rng(seed + 1)
        all_names = [f"node-{n:05d}" for n in range(NODES)]
        batches = [[all_names[j] for j in rng.choice(NODES, CANDIDATES, replace=False)] for _ in range(16)]
        raw = RawClient(port)
        warmed = _warm(raw, batches, config.Settings().workload_period_s)
        filt: list[float] = []
        prio: list[float] = []
        feasible: list[int] = []
        for k in range(reps):
            f_ms, p_ms, n_ok = _pair(raw, _pod(100_000 + k), batches[k % len(batches)])
            filt.append(f_ms)
            prio.append(p_ms)
            feasible.append(n_ok)
        raw.close()
        server_side = _server_side(_get(url + "/metrics"))
        rss = _rss_mb(server.pid)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    pair = [a + b for a, b in zip(filt, prio, strict=True)]
    return {
        "filter_plus_prioritize": _stats(pair),
        "filter": _stats(filt),
        "prioritize": _stats(prio),
        "mean_feasible_nodes": round(float(np.mean(feasible)), 1),
        "warmup_requests": warmed,
        "server_side_handler_mean_ms": server_side,
        "server_startup_s": round(startup_s, 2),
        "server_rss_mb": round(rss, 1),
    }


def latency(
    policies: Sequence[str], reps: int, pods: int, seed: int, node_choice: str | None
) -> dict[str, Any]:
    """(a) + (c): a row per node policy."""
    rows = {p: latency_one(p, reps, pods, seed, node_choice) for p in policies}
    return {
        "cluster": {"nodes": NODES, "gpus_per_node": GPUS, "pods_in_cache": pods, "candidates": CANDIDATES},
        "node_choice": node_choice or "default",
        "reps": reps,
        "timed_pod": "1 GPU, 8000 MiB, 30 cores",
        "warmup_shapes": [f"1 GPU, {m} MiB, {c} cores" for m, c in SHAPES],
        "client": "raw keep-alive HTTP/1.1 socket (like Go net/http)",
        "targets": {"pair_p50_ms": 1.0, "pair_p99_ms": 3.0},
        "rows": rows,
        "summary": {
            p: (
                r["filter_plus_prioritize"]["p50_ms"],
                r["filter_plus_prioritize"]["p99_ms"],
                r["server_rss_mb"],
            )
            for p, r in rows.items()
        },
        "summary_columns": ["pair_p50_ms", "pair_p99_ms", "rss_mb"],
        "load_average_1m": round(os.getloadavg()[0], 2),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }


# ----------------------------------------------------------------------------- (b) throughput


async def _create_pods(kube: Any, ns: str, n: int, scheduler: str, limits: Mapping[str, str]) -> None:
    sem = asyncio.Semaphore(16)

    async def one(k: int) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"tp-{k:05d}", "namespace": ns},
            "spec": {
                "schedulerName": scheduler,
                "containers": [{"name": "c", "image": "pause", "resources": {"limits": dict(limits)}}],
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


def _api_requests(cp: Any) -> collections.Counter[str]:
    """``apiserver_request_total`` summed by ``VERB resource[/subresource]`` (WATCH and LIST too)."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body = cp.api_request("GET", "/metrics")
    if status != 200:
        raise RuntimeError(f"apiserver /metrics: {status}")
    out: collections.Counter[str] = collections.Counter()
    for family in text_string_to_metric_families(body["text"]):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            lab = sample.labels
            res = lab.get("resource", "") + (f"/{lab['subresource']}" if lab.get("subresource") else "")
            out[f"{lab.get('verb', '')} {res}"] += int(sample.value)
    return out


WRITES = ("POST", "PUT", "PATCH", "DELETE", "APPLY")
HANDSHAKE_REQUESTED = 'gpuslice_recovery_actions_total{action="handshake_requested"}'


def _per_pod(diff: Mapping[str, int], n: int, handshakes: int) -> dict[str, Any]:
    """Requests per bound pod; ``handshakes`` node writes of HAMi's liveness handshake (periodic per
    node, not per pod: the plugin's ``Reported`` and the leader's ``Requesting_``) are also shown
    apart, and taken out of ``writes_per_pod_work``."""
    by_kind = {k: round(v / n, 3) for k, v in sorted(diff.items()) if v > 0}
    writes = sum(v for k, v in diff.items() if k.split(" ", 1)[0] in WRITES)
    reads = sum(v for k, v in diff.items() if k.split(" ", 1)[0] in ("GET", "LIST"))
    return {
        "writes": round(writes / n, 3),
        "writes_per_pod_work": round((writes - handshakes) / n, 3),
        "handshake_node_writes": round(handshakes / n, 3),
        "reads": round(reads / n, 3),
        "by_request": by_kind,
    }


def _extender_counters(url: str) -> dict[str, float]:
    """The extender's own bind-path counters (outcomes, lock waits, truth reads, API errors)."""
    text = _get(url + "/metrics")
    prefixes = (
        "gpuslice_bind_total",
        "gpuslice_bind_node_lock_waits_total",
        "gpuslice_api_errors_total",
        "gpuslice_bind_truth_reads_total",
        "gpuslice_bind_truth_corrections_total",
        "gpuslice_bind_ambiguous_total",
        "gpuslice_recovery_actions_total",
    )
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefixes)
    }


class _Mode:
    """One way of scheduling the pods: kube-scheduler alone, or with one gpuslice extender."""

    def __init__(
        self,
        label: str,
        scheduler: str,
        config_yaml: str,
        limits: Mapping[str, str],
        extender: Any = None,
        node_choice: str | None = None,
    ) -> None:
        self.label = label
        self.scheduler = scheduler
        self.config_yaml = config_yaml
        self.limits = dict(limits)
        self.extender = extender
        self.node_choice = node_choice


async def _measure(cp: Any, ns: str, n: int, mode: _Mode, sim: Any) -> dict[str, Any]:
    """Create n pods with no scheduler running, start it, time the binds, count API requests.

    Bind times come from the node simulator's pod watch (it sees every pod as it gets its node, in
    both modes), so the harness adds no watch stream of its own to the measured CPU. With gpuslice
    the count runs on until the device-plugin stand-in finished every pod's handshake.
    """
    from gpuslice.kube import client as kclient

    kube = kclient.KubeClient.from_kubeconfig(cp.kubeconfig, qps=1000, burst=1000)
    bound: dict[str, float] = {}

    def on_bound(pod: Any) -> None:  # called on the simulator's thread; a dict update is atomic
        if pod.metadata.namespace == ns:
            bound.setdefault(pod.metadata.name, time.perf_counter())

    for one in sim.sims:
        one.on_bound = on_bound
    done_before = sum(len(one.completed) for one in sim.sims)
    extra: dict[str, Any] = {}
    try:
        await _create_pods(kube, ns, n, mode.scheduler, mode.limits)
        api_before = await asyncio.to_thread(_api_requests, cp)
        reports_before = sum(one.reports for one in sim.sims)
        requested_before = 0.0
        if mode.extender is not None:
            counters = await asyncio.to_thread(_extender_counters, mode.extender.url)
            requested_before = counters.get(HANDSHAKE_REQUESTED, 0.0)
        cpu_before = _cpu_seconds()
        t_start = time.perf_counter()
        await asyncio.to_thread(cp.start_scheduler, mode.config_yaml)
        deadline = time.perf_counter() + 600
        while len(bound) < n and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
        times = sorted(bound.values())
        cpu_after = _cpu_seconds()
        if mode.extender is not None:  # the handshakes of the last pods, then the counters
            until = time.perf_counter() + 30
            while sum(len(one.completed) for one in sim.sims) - done_before < len(times):
                if time.perf_counter() > until:
                    break
                await asyncio.sleep(0.05)
            extra["handshakes_done"] = sum(len(one.completed) for one in sim.sims) - done_before
            extra["gpuslice_counters"] = await asyncio.to_thread(_extender_counters, mode.extender.url)
        await asyncio.sleep(0.5)
        api_after = await asyncio.to_thread(_api_requests, cp)
        handshakes = sum(one.reports for one in sim.sims) - reports_before
        if mode.extender is not None:
            handshakes += int(extra["gpuslice_counters"].get(HANDSHAKE_REQUESTED, 0.0) - requested_before)
    finally:
        await asyncio.to_thread(cp.stop_scheduler)
        for one in sim.sims:
            one.on_bound = None
        await kube.aclose()
    if len(times) < 2:
        return {"pods": n, "bound": len(times), "pods_per_s": 0.0}
    span = times[-1] - times[0]
    diff = {k: api_after[k] - api_before.get(k, 0) for k in api_after}
    return {
        "pods": n,
        "bound": len(times),
        "first_bind_after_start_s": round(times[0] - t_start, 3),
        "bind_span_s": round(span, 3),
        "pods_per_s": round((len(times) - 1) / span, 1) if span > 0 else float("inf"),
        "api_requests_per_bound_pod": _per_pod(diff, len(times), handshakes),
        "cpu_seconds_by_process": {  # processes started during the run (kube-scheduler) count from 0
            k: round(v - cpu_before.get(k, 0.0), 2)
            for k, v in cpu_after.items()
            if v - cpu_before.get(k, 0.0) >= 0.05
        },
        **extra,
    }


def _settle(cp: Any, ns: str, timeout_s: float = 30.0) -> None:
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


def _render(url: str, kubeconfig: pathlib.Path, name: str, args: Sequence[str], src: str | None) -> str:
    """``gpuslice render scheduler-config`` (from the source tree ``src`` when given)."""
    env = {**os.environ, "PYTHONPATH": src} if src else None
    cmd = [sys.executable, "-m", "gpuslice", "render", "scheduler-config", "--url", url]
    cmd += ["--kubeconfig", str(kubeconfig), "--scheduler-name", name, *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout  # noqa: S603


def throughput_size(
    pods: int,
    nodes: int,
    rounds: int,
    choices: Sequence[str | None],
    gpumem: int,
    baseline_src: str | None,
) -> dict[str, Any]:
    """(b) at one size: kube-scheduler alone vs with gpuslice, alternating, in one control plane."""
    import yaml

    from gpuslice_dev import devcluster
    from gpuslice_dev.controlplane import ControlPlane

    cp = ControlPlane()
    cp.start()
    sim = None
    extenders: list[Any] = []
    try:
        specs = {f"tp-node-{i:03d}": {"count": 8, "numa_nodes": 2} for i in range(nodes)}
        sim = devcluster.NodeSimThread(cp.kubeconfig, specs).start()
        gpu_limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(gpumem)}
        modes: list[_Mode] = []
        serve_args = ["-v", "0", "--leader-elect", "none"]
        variants: list[tuple[str, str | None, str | None]] = [
            ("gpuslice" if c is None else f"gpuslice_{c}", c, None) for c in choices
        ]
        if baseline_src:
            variants.append(("gpuslice_baseline", None, baseline_src))
        for label, choice, src in variants:
            flag = ["--node-choice", choice] if choice else []
            ext = devcluster.Extender(
                cp.kubeconfig,
                cp.workdir / f"{label}.log",
                extra_args=serve_args + flag,
                env={"PYTHONPATH": src} if src else None,
            )
            extenders.append(ext)
            conf = _render(ext.url, cp.kubeconfig, "gpuslice-scheduler", flag, src)
            modes.append(_Mode(label, "gpuslice-scheduler", conf, gpu_limits, ext, choice))
        plain = yaml.safe_load(modes[0].config_yaml)
        plain.pop("extenders")
        plain["profiles"] = [{"schedulerName": "plain-scheduler"}]
        modes.insert(
            0,
            _Mode("kube_scheduler_alone", "plain-scheduler", yaml.safe_dump(plain), {"nvidia.com/gpu": "1"}),
        )
        runs: dict[str, list[dict[str, Any]]] = {m.label: [] for m in modes}
        # Round 0 of each mode is a warm-up (caches, connections, the apiserver's watch cache) and
        # is not counted; then the modes alternate. Between runs the pods are deleted and the
        # machine left to settle, so one run's clean-up does not eat into the next run's CPU.
        for r in range(rounds + 1):
            for mode in modes:
                ns = f"tp-{mode.label.replace('_', '-')}-{r}"
                status, body = cp.api_request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
                assert status == 201, body
                if mode.extender is not None:
                    mode.extender.start()
                try:
                    one = asyncio.run(_measure(cp, ns, pods, mode, sim))
                finally:
                    if mode.extender is not None:
                        mode.extender.stop()
                if r > 0:
                    runs[mode.label].append(one)
                cp.api_request("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0")
                _settle(cp, ns)
        results: dict[str, Any] = {
            "pods": pods,
            "nodes": nodes,
            "gpus_per_node": 8,
            "gpu_pod": f"1 GPU, {gpumem} MiB (the twin for kube-scheduler alone: nvidia.com/gpu 1 only)",
            "rounds": rounds,
            "warmup_rounds_excluded": 1,
            "kube_scheduler_client": "defaults in every mode (clientConnection qps 50, burst 100)",
        }
        for label, measured in runs.items():
            rates = sorted(m["pods_per_s"] for m in measured)
            writes = sorted(
                m["api_requests_per_bound_pod"]["writes"]
                for m in measured
                if "api_requests_per_bound_pod" in m
            )
            results[label] = {
                "median_pods_per_s": rates[len(rates) // 2],
                "pods_per_s_each": rates,
                "median_api_writes_per_pod": writes[len(writes) // 2] if writes else None,
                "runs": measured,
            }
        alone = results["kube_scheduler_alone"]["median_pods_per_s"]
        results["ratio_to_kube_scheduler_alone"] = {
            m.label: round(results[m.label]["median_pods_per_s"] / alone, 3) if alone else None
            for m in modes[1:]
        }
        results["target_ratio"] = 0.8
        sched_log = (cp.workdir / "kube-scheduler.log").read_text(errors="replace")
        results["kube_scheduler_log_counts"] = {
            k: sched_log.count(k)
            for k in ("FailedScheduling", "Error scheduling pod", "failed bind", "Unschedulable")
        }
        results["load_average_1m"] = round(os.getloadavg()[0], 2)
        return results
    finally:
        for ext in extenders:
            ext.stop()
        if sim is not None:
            sim.stop()
        cp.stop()


def throughput(
    sizes: Sequence[tuple[int, int]],
    rounds: int,
    choices: Sequence[str | None],
    gpumem: int,
    baseline_src: str | None,
) -> dict[str, Any]:
    """(b) at every size."""
    out: dict[str, Any] = {}
    for pods, nodes in sizes:
        out[f"{pods}_pods_{nodes}_nodes"] = throughput_size(
            pods, nodes, rounds, choices, gpumem, baseline_src
        )
    out["summary"] = {
        size: {
            "ratio": res["ratio_to_kube_scheduler_alone"],
            "alone_pods_per_s": res["kube_scheduler_alone"]["median_pods_per_s"],
        }
        for size, res in out.items()
        if isinstance(res, dict) and "ratio_to_kube_scheduler_alone" in res
    }
    return out


# ----------------------------------------------------------------------------- main


def _sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        pods, _, nodes = part.strip().partition("x")
        out.append((int(pods), int(nodes)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["latency", "throughput", "all", "_serve"])
    ap.add_argument("--reps", type=int, default=500, help="latency: timed requests per policy")
    ap.add_argument(
        "--pods", type=int, default=None, help="latency: pods in the cache (50000); throughput: pods"
    )
    ap.add_argument("--nodes", type=int, default=None, help="throughput: fake nodes of 8 GPUs (with --pods)")
    ap.add_argument(
        "--sizes", default="200x25,2000x200", help="throughput: PODSxNODES,... (default %(default)s)"
    )
    ap.add_argument(
        "--rounds", type=int, default=3, help="throughput: alternating runs of each mode (median)"
    )
    ap.add_argument(
        "--gpumem", type=int, default=3000, help="throughput: MiB each GPU pod asks (default 3000)"
    )
    ap.add_argument(
        "--node-choice",
        default=None,
        help="throughput: comma-separated serve --node-choice values, one gpuslice mode each "
        "(default: serve's default); latency: the servers' node choice",
    )
    ap.add_argument(
        "--baseline-src", default=None, help="throughput: also run gpuslice from this source tree"
    )
    ap.add_argument("--policies", default=None, help="latency: comma-separated node policies (default: all)")
    ap.add_argument("--policy", default="binpack", help=argparse.SUPPRESS)  # _serve
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    if args.what == "_serve":
        serve_memory(
            args.port,
            args.pods if args.pods is not None else 50_000,
            args.seed,
            args.policy,
            args.node_choice,
        )
        return
    OUT.mkdir(exist_ok=True)
    if args.what in ("latency", "all"):
        from gpuslice.framework import registry

        policies = args.policies.split(",") if args.policies else list(registry.names())
        pods = args.pods if args.pods is not None and args.what == "latency" else 50_000
        res = latency(policies, args.reps, pods, args.seed, args.node_choice)
        (OUT / "bench_extender_latency.json").write_text(json.dumps(res, indent=2) + "\n")
        print(json.dumps(res, indent=2))
    if args.what in ("throughput", "all"):
        sizes = _sizes(args.sizes)
        if args.what == "throughput" and args.pods is not None:
            sizes = [(args.pods, args.nodes or max(1, args.pods // 8))]
        choices: list[str | None] = (
            [c.strip() for c in args.node_choice.split(",")] if args.node_choice else [None]
        )
        res = throughput(sizes, args.rounds, choices, args.gpumem, args.baseline_src)
        (OUT / "bench_extender_throughput.json").write_text(json.dumps(res, indent=2) + "\n")
        print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
