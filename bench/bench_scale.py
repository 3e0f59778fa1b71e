"""Scale benchmark: a 5000-node x 8-GPU cluster holding 150 000 bound GPU pods.

(a) relist: the pod informer's full relist through the real ``Feed`` (sync -> cluster cache, the
    nodes registered first), against a real kube-apiserver holding the pods, split into API time
    (inside the HTTP requests: the apiserver's work, the transfer, TLS and gzip on our side) and
    our decode + ingest (the rest of the relist's wall time), plus our CPU seconds (inside the
    HTTP requests, and the rest: decode + ingest) and the apiserver's. One row per list
    strategy: page size 500 (the old default) / 5000 / unpaged; consistent (no resourceVersion)
    / ``resourceVersionMatch=NotOlderThan`` (the watch cache) / ``resourceVersion=0`` (the watch
    cache; it ignores ``limit``); gzip on (httpx's default ``Accept-Encoding``) and off. The
    apiserver's metrics say where each list was served from.
(b) rss: ``gpuslice serve`` pointed at that apiserver; its VmRSS (and VmHWM, the peak) once
    ``/readyz`` says synced, and the time it took. Target VmRSS <= 600 MB.
(c) annotations: with that process still running, 200 more GPU pods without, then 200 with an
    unrelated annotation (``kubectl.kubernetes.io/last-applied-configuration``) that takes their
    annotations to the apiserver's limit, 256 KB; VmRSS growth of each batch. Target: the big
    ones cost no more than the plain ones.
(d) ingest: decode + ingest alone, in process, from list pages recorded from the apiserver
    (``record``) or generated from a real pod's JSON (``synth``, no apiserver needed); each round
    in a fresh subprocess (``--src`` runs another source tree, e.g. the previous commit's, for an
    A/B in the same run). Target <= 5 s for 150 000 pods on the 2-core development machine.

The pods are what bound GPU pods look like: created with ``spec.nodeName`` (as the Binding would
set it) and the annotations HAMi's scheduler and device plugin leave on them
(docs/hami-compat.md sections 5 and 6: ``vgpu-node``, ``vgpu-time``, both device lists, the
second blanked by the device plugin, ``bind-phase: success``, ``bind-time``), owned by a
ReplicaSet, with their status set Running through ``pods/status`` as kubelet would (about 5 KB of
JSON each). Populating 150 000 of them takes about 15 minutes on 2 cores; the control plane's
work directory (etcd's data) is kept in ``--workdir`` so later runs reuse it.

Run:
    .venv/bin/python bench/bench_scale.py populate [--nodes 5000] [--pods 150000]
    .venv/bin/python bench/bench_scale.py relist [--configs default]
    .venv/bin/python bench/bench_scale.py rss
    .venv/bin/python bench/bench_scale.py record --pages out/scale-pages.bin
    .venv/bin/python bench/bench_scale.py synth --pages out/scale-pages.bin [--pods 150000]
    .venv/bin/python bench/bench_scale.py ingest --pages out/scale-pages.bin [--src /tmp/before/src]
    .venv/bin/python bench/bench_scale.py all        # populate, relist, rss
Writes out/bench_scale.json (one key per section, merged with earlier runs).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

OUT = pathlib.Path("out")
RESULTS = OUT / "bench_scale.json"
NS = "scale"
NODES = 5000
PODS = 150_000
GPUS = 8
BIG_KEY = "kubectl.kubernetes.io/last-applied-configuration"
ANNOTATIONS_MAX = 256 * 1024
"""The apiserver's limit on a pod's annotations, keys and values together (262144 bytes)."""
DEFAULT_WORKDIR = pathlib.Path("/tmp/gpuslice-scale")
IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"


# ----------------------------------------------------------------------------- the objects


def node_name(n: int) -> str:
    return f"gpu-{n:05d}"


def pod_name(i: int) -> str:
    return f"train-{i // 1000:03d}-{i % 1000:03d}"


def bound_pod(i: int, nodes: int, card_uuids: Any, extra_annotations: dict[str, str] | None = None) -> Any:
    """Pod i: one card of 3000 MiB / 30 cores on node i % nodes, card (i // nodes) % 8, bound."""
    n = i % nodes
    node = node_name(n)
    uuid_ = card_uuids(node, GPUS)[(i // nodes) % GPUS]
    job = f"train-{i % 97}"
    annotations = {
        "hami.io/vgpu-node": node,
        "hami.io/vgpu-time": "1764460000",
        "hami.io/vgpu-devices-to-allocate": ";",
        "hami.io/vgpu-devices-allocated": f"{uuid_},NVIDIA,3000,30:;",
        "hami.io/bind-phase": "success",
        "hami.io/bind-time": "1764460001",
    }
    for key, value in (extra_annotations or {}).items():
        if not value:  # as large as the apiserver allows
            used = sum(len(k) + len(v) for k, v in annotations.items()) + len(key)
            value = "x" * (ANNOTATIONS_MAX - used)
        annotations[key] = value
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(i),
            "labels": {"app": job, "pod-template-hash": "7d9f8c6b5", "hami.io/vgpu-node": node},
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{job}-7d9f8c6b5",
                    "uid": str(uuid.UUID(int=i % 97 + 1)),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "nodeName": node,
            "schedulerName": "gpuslice-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": ["python", "train.py"],
                    "args": ["--epochs", "10"],
                    "env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "JOB", "value": job}],
                    "resources": {
                        "limits": {
                            "nvidia.com/gpu": "1",
                            "nvidia.com/gpumem": "3000",
                            "nvidia.com/gpucores": "30",
                        },
                        "requests": {"cpu": "2", "memory": "8Gi"},
                    },
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }


RUNNING_STATUS = {
    "status": {
        "phase": "Running",
        "hostIP": "10.0.0.1",
        "podIP": "10.1.0.5",
        "podIPs": [{"ip": "10.1.0.5"}],
        "startTime": "2025-11-30T00:00:00Z",
        "qosClass": "Burstable",
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": "2025-11-30T00:00:01Z"}
            for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "containerStatuses": [
            {
                "name": "main",
                "ready": True,
                "restartCount": 0,
                "started": True,
                "image": IMAGE,
                "imageID": "nvcr.io/nvidia/pytorch@sha256:" + "a" * 64,
                "containerID": "containerd://" + "b" * 64,
                "state": {"running": {"startedAt": "2025-11-30T00:00:02Z"}},
                "lastState": {},
            }
        ],
    }
}
"""What kubelet reports for a running pod (``pods/status``)."""


# ----------------------------------------------------------------------------- control plane


def control_plane(workdir: pathlib.Path) -> Any:
    """etcd + kube-apiserver on ``workdir`` (kept: a second start finds the pods again)."""
    from gpuslice_dev.controlplane import ControlPlane

    return ControlPlane(workdir=workdir, startup_timeout=300)


async def _count(kube: Any, path: str) -> int:
    body = json.loads((await kube.request("GET", path, params={"limit": 1})).content)
    return len(body["items"]) + int(body["metadata"].get("remainingItemCount") or 0)


async def _run_pool(n: int, concurrency: int, job: Any, label: str) -> float:
    """Run ``job(i)`` for i in range(n) on ``concurrency`` workers; returns the seconds taken."""
    todo = iter(range(n))
    done = 0
    start = time.perf_counter()

    async def worker() -> None:
        nonlocal done
        for i in todo:
            await job(i)
            done += 1
            if done % 10_000 == 0:
                took = time.perf_counter() - start
                print(f"  {label}: {done}/{n} ({done / took:.0f}/s)", flush=True)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


async def populate(kube: Any, nodes: int, pods: int, concurrency: int = 64) -> dict[str, Any]:
    """Create the namespace, ``nodes`` fake GPU nodes and ``pods`` bound running pods (idempotent)."""
    from gpuslice.kube import client as kclient
    from gpuslice.kube import errors
    from gpuslice_dev import nodesim

    with_ns = await kube.request("GET", "/api/v1/namespaces", params={"fieldSelector": f"metadata.name={NS}"})
    if not json.loads(with_ns.content)["items"]:
        await kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
    have_nodes = await _count(kube, "/api/v1/nodes")
    have_pods = await _count(kube, f"/api/v1/namespaces/{NS}/pods")
    out: dict[str, Any] = {"nodes": nodes, "pods": pods}

    async def node(i: int) -> None:
        try:
            await nodesim.make_node(kube, node_name(i))
        except errors.Conflict:
            pass

    async def pod(i: int) -> None:
        try:
            await kube.request(
                "POST", f"/api/v1/namespaces/{NS}/pods", body=bound_pod(i, nodes, nodesim.card_uuids)
            )
        except errors.Conflict:
            pass
        await kube.request(
            "PATCH",
            f"/api/v1/namespaces/{NS}/pods/{pod_name(i)}/status",
            body=RUNNING_STATUS,
            content_type=kclient.STRATEGIC_MERGE_PATCH,
        )

    if have_nodes < nodes:
        out["nodes_s"] = round(await _run_pool(nodes, concurrency, node, "nodes"), 1)
    if have_pods < pods:
        start = max(0, have_pods - 2 * concurrency)  # a previous run may have left a few without status

        async def from_start(i: int) -> None:
            await pod(start + i)

        took = await _run_pool(pods - start, concurrency, from_start, "pods")
        out["pods_s"] = round(took, 1)
        out["pods_per_s"] = round((pods - start) / took, 1)
    out["pods_found"] = await _count(kube, f"/api/v1/namespaces/{NS}/pods")
    return out


# ----------------------------------------------------------------------------- helpers


def _proc_status(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of a process, MB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = round(int(line.split()[1]) / 1024, 1)
    return out


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (its threads included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _metrics(text: str, prefixes: tuple[str, ...]) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(prefixes) and 'resource="pods"' in line:
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


_SERVED_FROM = (
    "apiserver_cache_list_total",
    "apiserver_storage_list_total",
    "apiserver_watch_cache_consistent_read_total",
    "etcd_requests_total",
)


def _save(section: str, data: Any) -> None:
    OUT.mkdir(exist_ok=True)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[section] = data
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


# ----------------------------------------------------------------------------- (a) relist

CONFIGS: dict[str, tuple[int, str, bool]] = {
    # name: (page size, list from, gzip)
    "consistent-500": (500, "consistent", True),
    "consistent-5000": (5000, "consistent", True),
    "consistent-unpaged": (0, "consistent", True),
    "cache-500": (500, "not-older-than", True),
    "cache-5000": (5000, "not-older-than", True),
    "cache-5000-nogzip": (5000, "not-older-than", False),
    "consistent-5000-nogzip": (5000, "consistent", False),
    "rv0": (500, "rv0", True),
}
"""``rv0``: ``resourceVersion=0`` with ``limit=500``, which the watch cache ignores."""


class _TimedKube:
    """A KubeClient whose ``request`` adds up the time spent inside it (the API share)."""

    def __init__(self, kube: Any, rv0: bool) -> None:
        self._kube = kube
        self._rv0 = rv0
        self.api_s = 0.0
        self.http_cpu_s = 0.0
        self.requests = 0
        self.bytes = 0

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        params = dict(kwargs.pop("params", None) or {})
        if self._rv0 and "continue" not in params:
            params["resourceVersion"] = "0"
        start, cpu = time.perf_counter(), time.process_time()
        resp = await self._kube.request(method, path, params=params, **kwargs)
        self.api_s += time.perf_counter() - start
        self.http_cpu_s += time.process_time() - cpu
        self.requests += 1
        self.bytes += len(resp.content)
        return resp

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kube, name)


async def _one_relist(kubeconfig: str, apiserver: int, name: str) -> dict[str, Any]:
    from gpuslice.cache import cache as caches
    from gpuslice.extender import config, feed, metrics
    from gpuslice.framework import logs, nominations
    from gpuslice.kube import client as kclient

    page, source, gzip = CONFIGS[name]
    kube = kclient.KubeClient.from_kubeconfig(kubeconfig, qps=0)
    if not gzip:
        kube.http.headers["Accept-Encoding"] = "identity"
    try:
        timed = _TimedKube(kube, source == "rv0")
        cache = caches.ClusterCache(nominator=nominations.Nominator())
        f = feed.Feed(timed, cache, config.Settings(), logs.Log(0), metrics.Metrics())  # type: ignore[arg-type]
        await f.sync.nodes.relist()
        pods = f.sync.pods
        pods.page_size = page
        if source == "not-older-than":
            rv = json.loads((await kube.request("GET", "/api/v1/namespaces", params={"limit": 1})).content)
            pods.seen_version = rv["metadata"]["resourceVersion"]
            pods.consistent_next = False
        else:
            pods.watch_cache = False
        timed.api_s, timed.http_cpu_s, timed.requests, timed.bytes = 0.0, 0.0, 0, 0
        before = _metrics((await kube.request("GET", "/metrics")).content.decode(), _SERVED_FROM)
        gc.collect()
        api_cpu0, cpu0, t0 = _cpu_s(apiserver), time.process_time(), time.perf_counter()
        await pods.relist()
        wall = time.perf_counter() - t0
        cpu, api_cpu = time.process_time() - cpu0, _cpu_s(apiserver) - api_cpu0
        after = _metrics((await kube.request("GET", "/metrics")).content.decode(), _SERVED_FROM)
        served = {
            k.split("{")[0]: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)
        }
        snap = f.cache.snapshot()
        return {
            "config": name,
            "pods": len(pods.store),
            "requests": timed.requests,
            "mb": round(timed.bytes / 1e6, 1),
            "wall_s": round(wall, 2),
            "api_s": round(timed.api_s, 2),
            "ours_s": round(wall - timed.api_s, 2),
            "our_cpu_s": round(cpu, 2),
            "our_http_cpu_s": round(timed.http_cpu_s, 2),
            "decode_ingest_cpu_s": round(cpu - timed.http_cpu_s, 2),
            "apiserver_cpu_s": round(api_cpu, 2),
            "rss_mb": _proc_status(os.getpid()),
            "nodes_in_cache": len(snap.nodes),
            "served": served,
        }
    finally:
        await kube.aclose()


def relist(cp: Any, configs: list[str], rounds: int) -> list[dict[str, Any]]:
    """(a): every config ``rounds`` times, interleaved, each in a fresh subprocess."""
    rows = []
    for r in range(rounds):
        for name in configs:
            argv = ["_relist1", "--kubeconfig", str(cp.kubeconfig), "--apiserver-pid", str(cp.apiserver_pid)]
            out = subprocess.run(  # noqa: S603 - this script
                [sys.executable, __file__, *argv, "--configs", name],
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode != 0:
                raise RuntimeError(f"relist {name} failed:\n{out.stdout}\n{out.stderr}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["round"] = r
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def _summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by.setdefault(row["config"], []).append(row)
    keys = (
        "wall_s",
        "api_s",
        "ours_s",
        "our_cpu_s",
        "our_http_cpu_s",
        "decode_ingest_cpu_s",
        "apiserver_cpu_s",
    )
    return {
        name: {k: round(statistics.median(r[k] for r in rs), 2) for k in keys}
        | {"requests": rs[0]["requests"], "mb": rs[0]["mb"], "pods": rs[0]["pods"]}
        for name, rs in by.items()
    }


# ----------------------------------------------------------------------------- (b) + (c) rss


async def _create_batch(
    kube: Any, first: int, n: int, nodes: int, annotations: dict[str, str] | None
) -> None:
    from gpuslice_dev import nodesim

    async def one(i: int) -> None:
        await kube.request(
            "POST",
            f"/api/v1/namespaces/{NS}/pods",
            body=bound_pod(first + i, nodes, nodesim.card_uuids, annotations),
        )

    await _run_pool(n, 16, one, "extra pods")


async def _delete_batch(kube: Any, first: int, n: int) -> None:
    from gpuslice.kube import errors

    async def one(i: int) -> None:
        path = f"/api/v1/namespaces/{NS}/pods/{pod_name(first + i)}"
        try:  # no kubelet confirms a graceful deletion here
            await kube.request("DELETE", path, params={"gracePeriodSeconds": 0})
        except errors.NotFound:
            pass

    await _run_pool(n, 16, one, "deleted pods")


def _settled_rss(pid: int, quiet_s: float = 3.0, timeout_s: float = 60.0) -> dict[str, float]:
    """VmRSS once it changed by under 1 MB over ``quiet_s`` (the watch events are applied)."""
    deadline = time.monotonic() + timeout_s
    last = _proc_status(pid)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = _proc_status(pid)
        if abs(now["VmRSS"] - last["VmRSS"]) < 1.0:
            return now
        last = now
    return last


async def rss(cp: Any, nodes: int, pods: int, src: str = "", extra: int = 200) -> dict[str, Any]:
    """(b) and (c): a ``gpuslice serve`` on the populated apiserver (``src``: from that tree)."""
    from gpuslice.kube import client as kclient
    from gpuslice_dev import devcluster

    log = OUT / "bench_scale_serve.log"
    OUT.mkdir(exist_ok=True)
    env = {"PYTHONPATH": src} if src else None
    ext = devcluster.Extender(cp.kubeconfig, log, extra_args=["--leader-elect", "none"], env=env)
    start = time.perf_counter()
    ext.start(timeout=900)
    ready_s = time.perf_counter() - start
    assert ext.pid is not None
    try:
        time.sleep(3.0)  # the housekeeping loop's gc.collect + gc.freeze after the first sync
        synced = _settled_rss(ext.pid)
        out: dict[str, Any] = {"src": src or "this tree", "pods": pods, "nodes": nodes}
        out |= {"ready_s": round(ready_s, 1), "synced": synced}
        async with kclient.KubeClient.from_kubeconfig(cp.kubeconfig, qps=0) as kube:
            base = pods + 10_000  # names past the populated ones
            await _delete_batch(kube, base, 2 * extra)  # left by an interrupted run
            synced = _settled_rss(ext.pid)
            out["synced"] = synced
            await _create_batch(kube, base, extra, nodes, None)
            plain = _settled_rss(ext.pid)
            await _create_batch(kube, base + extra, extra, nodes, {BIG_KEY: ""})
            big = _settled_rss(ext.pid)
            await _delete_batch(kube, base, 2 * extra)
        out["plain_200_growth_mb"] = round(plain["VmRSS"] - synced["VmRSS"], 1)
        out["big_200_growth_mb"] = round(big["VmRSS"] - plain["VmRSS"], 1)
        out["after_extra"] = big
        return out
    finally:
        ext.stop()


# ----------------------------------------------------------------------------- (d) ingest


def _write_pages(path: pathlib.Path, pages: list[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for p in pages:
            f.write(len(p).to_bytes(8, "little"))
            f.write(p)


def _read_pages(path: pathlib.Path) -> list[bytes]:
    pages = []
    with open(path, "rb") as f:
        while head := f.read(8):
            pages.append(f.read(int.from_bytes(head, "little")))
    return pages


async def record(cp: Any, path: pathlib.Path, page: int = 5000) -> dict[str, Any]:
    """The pods' list pages as the apiserver answers them, into ``path`` (for ``ingest``)."""
    from gpuslice.kube import client as kclient

    pages: list[bytes] = []
    async with kclient.KubeClient.from_kubeconfig(cp.kubeconfig, qps=0) as kube:
        nodes = (await kube.request("GET", "/api/v1/nodes")).content
        cont = ""
        while True:
            params: dict[str, Any] = {"limit": page} | ({"continue": cont} if cont else {})
            content = (await kube.request("GET", f"/api/v1/namespaces/{NS}/pods", params=params)).content
            pages.append(content)
            cont = json.loads(content)["metadata"].get("continue", "")
            if not cont:
                break
    _write_pages(path, [nodes, *pages])
    return {"pages": len(pages), "mb": round(sum(map(len, pages)) / 1e6, 1)}


def synth(path: pathlib.Path, template: pathlib.Path | None, nodes: int, pods: int, page: int = 5000) -> None:
    """List pages of ``pods`` pods made from one real pod's JSON (``template``) and the node list."""
    import msgspec

    from gpuslice.codec import keys, registrations
    from gpuslice_dev import nodesim

    if template is None:
        raise SystemExit("synth needs --template: one pod's JSON as the apiserver returns it")
    tmpl = json.loads(template.read_text())
    node_items = [
        {
            "metadata": {
                "name": node_name(n),
                "resourceVersion": "1",
                "labels": {"gpu": "on"},
                "annotations": {keys.NODE_REGISTER: registrations.encode_json(nodesim.cards(node_name(n)))},
            }
        }
        for n in range(nodes)
    ]
    pages = [
        msgspec.json.encode({"kind": "NodeList", "metadata": {"resourceVersion": "9"}, "items": node_items})
    ]
    for first in range(0, pods, page):
        items = []
        for i in range(first, min(pods, first + page)):
            p = copy.deepcopy(tmpl)
            want = bound_pod(i, nodes, nodesim.card_uuids)
            p["metadata"].update(
                name=want["metadata"]["name"],
                namespace=NS,
                uid=str(uuid.UUID(int=i + 1)),
                resourceVersion=str(1000 + i),
                labels=want["metadata"]["labels"],
                annotations=want["metadata"]["annotations"],
            )
            p["spec"]["nodeName"] = want["spec"]["nodeName"]
            items.append(p)
        cont = f"c{first + page}" if first + page < pods else ""
        meta = {"resourceVersion": "999999", "continue": cont}
        pages.append(msgspec.json.encode({"kind": "PodList", "metadata": meta, "items": items}))
    _write_pages(path, pages)


class _PagesKube:
    """Answers list requests from recorded pages: the first one the nodes, then the pods in order."""

    def __init__(self, pages: list[bytes]) -> None:
        self.nodes = pages[0]
        self.pages = pages[1:]
        self.index = 0

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        from gpuslice.kube import client as kclient

        if path.endswith("/nodes"):
            return kclient.Response(200, self.nodes)
        params = kwargs.get("params") or {}
        self.index = self.index + 1 if params.get("continue") else 0
        return kclient.Response(200, self.pages[self.index])


def _ingest1(path: pathlib.Path) -> dict[str, Any]:
    """One in-process relist of the recorded pods through ``Feed``: CPU, wall and RSS."""
    from gpuslice.cache import cache as caches
    from gpuslice.extender import config, feed, metrics
    from gpuslice.framework import logs, nominations

    pages = _read_pages(path)
    base = _proc_status(os.getpid())
    cache = caches.ClusterCache(nominator=nominations.Nominator())
    f = feed.Feed(_PagesKube(pages), cache, config.Settings(), logs.Log(0), metrics.Metrics())  # type: ignore[arg-type]
    asyncio.run(f.sync.nodes.relist())
    gc.collect()
    cpu0, t0 = time.process_time(), time.perf_counter()
    asyncio.run(f.sync.pods.relist())
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    t1 = time.perf_counter()
    snap = f.cache.snapshot()
    snapshot_s = time.perf_counter() - t1
    del pages
    gone: Any = None  # the pages go with the fake client
    for inf in f.informers:
        inf.kube = gone
    f.kube = gone
    gc.collect()
    return {
        "pods": len(f.sync.pods.store),
        "nodes": len(snap.nodes),
        "cpu_s": round(cpu, 2),
        "wall_s": round(wall, 2),
        "snapshot_s": round(snapshot_s, 2),
        "rss_before_mb": base["VmRSS"],
        "rss_after_mb": _proc_status(os.getpid())["VmRSS"],
    }


def ingest(path: pathlib.Path, rounds: int, srcs: list[str]) -> list[dict[str, Any]]:
    """(d): ``rounds`` rounds, each source tree once per round (interleaved), fresh processes."""
    rows = []
    for r in range(rounds):
        for src in srcs:
            env = dict(os.environ)
            if src:
                env["PYTHONPATH"] = src
            out = subprocess.run(  # noqa: S603 - this script
                [sys.executable, __file__, "_ingest1", "--pages", str(path)],
                capture_output=True,
                text=True,
                check=False,
                env=env,
            )
            if out.returncode != 0:
                raise RuntimeError(f"ingest ({src or 'this tree'}) failed:\n{out.stdout}\n{out.stderr}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row |= {"round": r, "src": src or "this tree"}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "what",
        choices=["populate", "relist", "rss", "record", "synth", "ingest", "all", "_relist1", "_ingest1"],
    )
    ap.add_argument("--workdir", type=pathlib.Path, default=DEFAULT_WORKDIR)
    ap.add_argument("--nodes", type=int, default=NODES)
    ap.add_argument("--pods", type=int, default=PODS)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--configs", default="all", help="relist: comma-separated names of CONFIGS, or all")
    ap.add_argument("--pages", type=pathlib.Path, default=OUT / "scale-pages.bin")
    ap.add_argument("--template", type=pathlib.Path, default=None, help="synth: one pod's JSON")
    ap.add_argument("--kubeconfig", default="", help=argparse.SUPPRESS)
    ap.add_argument("--apiserver-pid", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument(
        "--src", action="append", default=None, help="ingest, rss: a source tree (PYTHONPATH); repeat: A/B"
    )
    args = ap.parse_args()
    configs = list(CONFIGS) if args.configs == "all" else args.configs.split(",")

    if args.what == "synth":
        synth(args.pages, args.template, args.nodes, args.pods)
        return
    if args.what == "ingest":
        rows = ingest(args.pages, args.rounds, args.src or [""])
        by: dict[str, list[float]] = {}
        for row in rows:
            by.setdefault(row["src"], []).append(row["cpu_s"])
        _save("ingest", {"rows": rows, "median_cpu_s": {k: statistics.median(v) for k, v in by.items()}})
        return
    if args.what == "_ingest1":
        print(json.dumps(_ingest1(args.pages)))
        return
    if args.what == "_relist1":
        print(json.dumps(asyncio.run(_one_relist(args.kubeconfig, args.apiserver_pid, configs[0]))))
        return

    with control_plane(args.workdir) as cp:

        async def setup() -> dict[str, Any]:
            from gpuslice.kube import client as kclient

            async with kclient.KubeClient.from_kubeconfig(cp.kubeconfig, qps=0) as kube:
                return await populate(kube, args.nodes, args.pods)

        if args.what in ("populate", "all"):
            made = asyncio.run(setup())
            print(json.dumps(made), flush=True)
            _save("populate", made)
        if args.what == "record":
            print(json.dumps(asyncio.run(record(cp, args.pages))))
            return
        if args.what in ("relist", "all"):
            rows = relist(cp, configs, args.rounds)
            summary = _summary(rows)
            print(json.dumps(summary, indent=1))
            _save("relist", {"rows": rows, "median": summary})
        if args.what in ("rss", "all"):
            results = [asyncio.run(rss(cp, args.nodes, args.pods, src)) for src in args.src or [""]]
            print(json.dumps(results, indent=1))
            _save("rss", results)


if __name__ == "__main__":
    main()
