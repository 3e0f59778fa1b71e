"""Filter + score latency for one pod over a 500-node batch of a 5000-node x 8-GPU cluster.

Run: .venv/bin/python bench/bench_filter.py [--reps 300] [--seed 7]
Writes out/bench_filter.json. Targets: p50 <= 0.5 ms and p99 <= 1.5 ms for the whole batch.
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import statistics
import time

import numpy as np

from gpuslice.cache import cache as cache_mod
from gpuslice.model import allocations, devices, nodes, requests, topology
from gpuslice.policy import batch, fit, registry

NODES = 5000
GPUS = 8
BATCH = 500
MEM = 81920


def dgx_topology(uuids: tuple[str, ...]) -> topology.Topology:
    """NVLink (2 links) inside each half of the node, one PCIe switch per half, SYSTEM across."""
    n = len(uuids)
    same = [[(i < n // 2) == (j < n // 2) for j in range(n)] for i in range(n)]
    lv = topology.PcieLevel
    return topology.Topology(
        uuids=uuids,
        nvlinks=tuple(tuple(2 if same[i][j] and i != j else 0 for j in range(n)) for i in range(n)),
        pcie=tuple(
            tuple(lv.INTERNAL if i == j else lv.SINGLE if same[i][j] else lv.SYSTEM for j in range(n))
            for i in range(n)
        ),
        p2p=tuple(tuple(i != j and same[i][j] for j in range(n)) for i in range(n)),
    )


def build(seed: int) -> cache_mod.ClusterCache:
    rng = np.random.default_rng(seed)
    c = cache_mod.ClusterCache()
    for n in range(NODES):
        name = f"node-{n:05d}"
        devs = tuple(
            devices.GpuDevice(
                uuid=f"GPU-{n}-{i}", index=i, type="NVIDIA A100-SXM4-80GB", memory_mib=MEM, numa=i // 4
            )
            for i in range(GPUS)
        )
        c.upsert_node(
            nodes.NodeInventory(name=name, devices=devs, topology=dgx_topology(tuple(d.uuid for d in devs)))
        )
        # mixed usage: per card an idle card (20 %), a whole-card task (25 %) or 1..5 shared
        # tasks of 2..24 GiB and 0..50 cores, capped at the card's memory and cores
        for i in range(GPUS):
            r = rng.random()
            grants: list[tuple[int, int]] = []
            if r < 0.25:
                grants = [(MEM, 100)]
            elif r < 0.80:
                free_mem, free_cores = MEM, 100
                for _ in range(int(rng.integers(1, 6))):
                    mem = int(rng.integers(2, 25)) * 1024
                    cores = int(rng.choice([0, 10, 20, 30, 50]))
                    if mem <= free_mem and cores <= free_cores:
                        grants.append((mem, cores))
                        free_mem -= mem
                        free_cores -= cores
            for k, (mem, cores) in enumerate(grants):
                c.add_pod(
                    f"default/p-{n}-{i}-{k}",
                    f"u-{n}-{i}-{k}",
                    allocations.PodAllocation(
                        node=name, containers=((allocations.DeviceGrant(f"GPU-{n}-{i}", mem, cores),),)
                    ),
                )
    return c


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--slow-reps", type=int, default=20)
    ap.add_argument("--no-gc-freeze", action="store_true", help="leave the cache's objects to the cyclic GC")
    args = ap.parse_args()
    t0 = time.perf_counter()
    c = build(args.seed)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    snap = c.snapshot()
    if not args.no_gc_freeze:
        gc.collect()
        gc.freeze()  # long-lived cache objects leave the GC's generations (as a long-running extender should)
    first_snapshot_ms = (time.perf_counter() - t0) * 1e3
    names_all = sorted(snap.nodes)
    rng = np.random.default_rng(args.seed + 1)
    batches = [[names_all[j] for j in rng.choice(NODES, BATCH, replace=False)] for _ in range(16)]
    policy = registry.get("binpack")
    pods = {
        "1 GPU 8000 MiB 30 cores": requests.PodRequest(
            name="bench", containers=(requests.ContainerRequest(count=1, memory_mib=8000, cores=30),)
        ),
        "4 GPU 40960 MiB 50 cores": requests.PodRequest(
            name="bench-large", containers=(requests.ContainerRequest(count=4, memory_mib=40960, cores=50),)
        ),
        "2 GPU 20000 MiB, topology-aware": requests.PodRequest(
            name="bench-topo", containers=(requests.ContainerRequest(count=2, memory_mib=20000),)
        ),
    }
    topo_policy = registry.get("topology-aware")

    def once(pod: requests.PodRequest, names: list[str]) -> int:
        pol = topo_policy if pod.name == "bench-topo" else policy
        s = c.snapshot()
        ev = batch.evaluate(s.nodes, s.columns, names, pod, pol, pol)
        batch.choose(s.nodes, ev, pod, pol)
        return int(ev.feasible.sum())

    timings: dict[str, list[float]] = {}
    feasible: dict[str, float] = {}
    for label, pod in pods.items():
        for k in range(20):  # warm-up
            once(pod, batches[k % len(batches)])
        times: list[float] = []
        oks = []
        for k in range(args.reps if pod.name != "bench-topo" else min(args.reps, 50)):
            names = batches[k % len(batches)]
            t0 = time.perf_counter()
            oks.append(once(pod, names))
            times.append((time.perf_counter() - t0) * 1e3)
        timings[label] = times
        feasible[label] = statistics.mean(oks)
    pod = pods["1 GPU 8000 MiB 30 cores"]

    # reference: the exact per-node path (fit.place + score_node on every node of the batch)
    slow: list[float] = []
    for k in range(args.slow_reps):
        names = batches[k % len(batches)]
        s = c.snapshot()
        t0 = time.perf_counter()
        ok = 0
        for name in names:
            p = fit.place(s.nodes[name], pod, policy)
            if p.status.ok:
                ok += 1
                policy.score_node(s.nodes[name], pod, registry.EMPTY_CONTEXT)
        slow.append((time.perf_counter() - t0) * 1e3)

    # snapshot refresh after one pod changes (assume + snapshot: one node rebuilt, arrays copied)
    refresh: list[float] = []
    for k in range(50):
        key = f"default/bench-{k}"
        alloc = allocations.PodAllocation(
            node=names_all[k], containers=((allocations.DeviceGrant(f"GPU-{k}-0", 1, 0),),)
        )
        t0 = time.perf_counter()
        c.assume(key, key, alloc, 0.0)
        c.snapshot()
        refresh.append((time.perf_counter() - t0) * 1e3)
        c.forget(key)

    result = {
        "cluster": {
            "nodes": NODES,
            "gpus_per_node": GPUS,
            "batch": BATCH,
            "seed": args.seed,
            "build_s": round(build_s, 2),
        },
        "gc_freeze": not args.no_gc_freeze,
        "policy": "binpack (topology-aware for the topology row)",
        "filter_score_batch_ms": {
            label: {
                "reps": len(t),
                "p50": pct(t, 50),
                "p99": pct(t, 99),
                "max": max(t),
                "feasible_mean": feasible[label],
            }
            for label, t in timings.items()
        },
        "exact_per_node_batch_ms_1gpu": {"reps": args.slow_reps, "p50": pct(slow, 50), "p99": pct(slow, 99)},
        "snapshot_ms": {
            "first_full": first_snapshot_ms,
            "after_one_change_p50": pct(refresh, 50),
            "p99": pct(refresh, 99),
        },
        "targets_ms": {"p50": 0.5, "p99": 1.5},
    }
    out = pathlib.Path("out")
    out.mkdir(exist_ok=True)
    (out / "bench_filter.json").write_text(json.dumps(result, indent=2) + "\n")
    w = 58
    print(
        f"{'measure (500-node batch, binpack unless named)':<{w}}{'p50 ms':>9}{'p99 ms':>9}{'feasible':>10}"
    )
    for label, t in timings.items():
        row = f"filter+score+choose, {label}"
        print(f"{row:<{w}}{pct(t, 50):>9.3f}{pct(t, 99):>9.3f}{feasible[label]:>10.1f}")
    ref = "per-node fit.place + score_node, 1 GPU (reference)"
    print(f"{ref:<{w}}{pct(slow, 50):>9.3f}{pct(slow, 99):>9.3f}")
    print(f"{'assume + snapshot after one change':<{w}}{pct(refresh, 50):>9.3f}{pct(refresh, 99):>9.3f}")
    print(f"first full snapshot of {NODES} nodes: {first_snapshot_ms:.1f} ms; cluster build {build_s:.1f} s")
    print("wrote out/bench_filter.json")


if __name__ == "__main__":
    main()
