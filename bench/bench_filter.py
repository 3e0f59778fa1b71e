"""Filter + score latency of every registered policy for one pod over a 500-node batch of 5000 nodes x 8 GPUs.

Run: .venv/bin/python bench/bench_filter.py [--reps 300] [--seed 7] [--policies binpack,fgd]
[--pods 1gpu,2gpu] [--max-row-s 5]

One row per (policy, pod): the policy serves as node and card policy, and the row times one
``batch.evaluate`` over a 500-name batch (the vectorised filter plus the node scores, what the
extender's Filter/Prioritize pay per pod); ``choose`` is timed apart (``batch.choose``: ``fit.place``
on the best node, once per bind, not per node). A row meets the target when p50 <= 0.5 ms and
p99 <= 1.5 ms. ``--max-row-s`` caps the time one row may take (slow rows then get fewer reps; the
record says how many).

Target workload: FGD-style policies score against ``api.Context(workload=...)``. The bench
builds it from the shape histogram of the bundled openb pod list (``sim.workload.histogram``), and
every call gets a FRESH ``Workload`` whose weights moved by one observed request drawn from that
histogram (``w * 0.995 + 0.005`` on the drawn shape), as the extender's decayed histogram
(``cache.shapes``) moves with every pod it sees. So a policy's cross-call memo of its
per-workload measure (fgd, fgd-lookahead) is rebuilt on every call, and the row shows the cold
cost a serving extender pays rather than a cache hit. Policies that ignore the workload are
unaffected by this. ``--fresh-every N`` moves the workload every N calls instead: the extender
hands new shapes to its histogram once per ``workload_period_s`` (1 s by default), so at N pods
per second N-1 of N calls find the measure built (the rows say which).

Also measured: the exact per-node path for the 1-GPU pod under binpack (``fit.place`` + ``score_node``
on every node, the reference the fast path replaces) and assume + snapshot after one change.

Writes out/bench_filter.json: a list with one record per printed row.
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import statistics
import time
from collections.abc import Callable

import numpy as np
from rich.console import Console
from rich.table import Table

from gpuslice.cache import cache as cache_mod
from gpuslice.framework import nominations, registry
from gpuslice.model import allocations, devices, nodes, requests, topology
from gpuslice.policy import api, batch, fit
from gpuslice.sim import trace, workload

NODES = 5000
GPUS = 8
BATCH = 500
MEM = 81920
TARGET_P50_MS = 0.5
TARGET_P99_MS = 1.5
DECAY = 0.995  # how far the bench's workload moves per call (--fresh-every): each call adds 0.5 %

PODS = {
    "1gpu": requests.PodRequest(
        name="bench-1", containers=(requests.ContainerRequest(count=1, memory_mib=8000, cores=30),)
    ),
    "2gpu": requests.PodRequest(
        name="bench-2", containers=(requests.ContainerRequest(count=2, memory_mib=20000),)
    ),
    "4gpu": requests.PodRequest(
        name="bench-4", containers=(requests.ContainerRequest(count=4, memory_mib=40960, cores=50),)
    ),
    "8gpu": requests.PodRequest(
        name="bench-8", containers=(requests.ContainerRequest(count=8, memory_mib=4000),)
    ),
}
POD_LABELS = {
    "1gpu": "1 GPU 8000 MiB 30 cores",
    "2gpu": "2 GPU 20000 MiB",
    "4gpu": "4 GPU 40960 MiB 50 cores",
    "8gpu": "8 GPU 4000 MiB",
}


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
    """NODES nodes of GPUS A100-80GB (NUMA by halves, DGX-like topology) with mixed usage."""
    rng = np.random.default_rng(seed)
    c = cache_mod.ClusterCache(nominator=nominations.Nominator())
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


def workloads(seed: int) -> Callable[[], api.Workload]:
    """A source of fresh target workloads: the openb histogram after one more observed request."""
    base = workload.histogram(trace.load_pods(trace.data_path(trace.DEFAULT_PODS)))
    probs = np.array(base.weights) / sum(base.weights)
    kept = np.array(base.weights) * DECAY
    rng = np.random.default_rng(seed)

    def fresh() -> api.Workload:
        j = int(rng.choice(len(probs), p=probs))
        w = kept.copy()
        w[j] += 1.0 - DECAY
        return api.Workload(base.shapes, tuple(float(x) for x in w))

    return fresh


def pct(xs: list[float], q: float) -> float:
    """The q-th percentile."""
    return float(np.percentile(np.array(xs), q))


def main() -> None:
    """Build the cluster, time every (policy, pod) row, print the table, write the records."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=300, help="timed calls per row (fewer if --max-row-s is hit)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed calls per row first")
    ap.add_argument("--max-row-s", type=float, default=5.0, help="stop a row's reps after this many seconds")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--policies", default="", help="comma list of registered policies (default: all)")
    ap.add_argument("--pods", default="1gpu,2gpu", help=f"comma list of pod shapes: {', '.join(PODS)}")
    ap.add_argument("--slow-reps", type=int, default=20, help="reps of the exact per-node reference")
    ap.add_argument(
        "--fresh-every", type=int, default=1, help="a new target workload every N calls (1: every call, cold)"
    )
    ap.add_argument("--no-gc-freeze", action="store_true", help="leave the cache's objects to the cyclic GC")
    ap.add_argument("--out", default="out/bench_filter.json")
    args = ap.parse_args()
    known = registry.names()
    chosen = [p.strip() for p in args.policies.split(",") if p.strip()] or list(known)
    unknown = [p for p in chosen if p not in known]
    if unknown:
        ap.error(f"unknown policies {unknown}; known: {', '.join(known)}")
    shapes = [p.strip() for p in args.pods.split(",") if p.strip()]
    if any(p not in PODS for p in shapes):
        ap.error(f"--pods takes {', '.join(PODS)}")

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
    fresh = workloads(args.seed + 2)
    cluster = {"nodes": NODES, "gpus_per_node": GPUS, "batch": BATCH, "seed": args.seed}

    records: list[dict[str, object]] = []
    for name in chosen:
        policy = registry.get(name)
        for shape in shapes:
            pod = PODS[shape]
            times: list[float] = []
            picks: list[float] = []
            oks: list[int] = []
            started = time.perf_counter()
            ctx = api.Context(workload=fresh())
            for k in range(args.warmup + args.reps):
                names = batches[k % len(batches)]
                s = c.snapshot()
                if k % args.fresh_every == 0:
                    ctx = api.Context(workload=fresh())
                t0 = time.perf_counter()
                ev = batch.evaluate(s.nodes, s.columns, names, pod, policy, policy, ctx)
                t1 = time.perf_counter()
                batch.choose(s.nodes, ev, pod, policy, ctx)
                t2 = time.perf_counter()
                if k >= args.warmup:
                    times.append((t1 - t0) * 1e3)
                    picks.append((t2 - t1) * 1e3)
                    oks.append(int(ev.feasible.sum()))
                    if time.perf_counter() - started > args.max_row_s and len(times) >= 5:
                        break
            p50, p99 = pct(times, 50), pct(times, 99)
            records.append(
                {
                    "measure": "filter+score",
                    "policy": name,
                    "pod": POD_LABELS[shape],
                    "reps": len(times),
                    "p50_ms": p50,
                    "p99_ms": p99,
                    "max_ms": max(times),
                    "choose_p50_ms": pct(picks, 50),
                    "choose_p99_ms": pct(picks, 99),
                    "feasible_mean": statistics.mean(oks),
                    "meets_target": p50 <= TARGET_P50_MS and p99 <= TARGET_P99_MS,
                    "target_ms": {"p50": TARGET_P50_MS, "p99": TARGET_P99_MS},
                    "workload": f"openb histogram, fresh every {args.fresh_every} call(s)",
                    "cluster": cluster,
                }
            )

    # reference: the exact per-node path (fit.place + score_node on every node of the batch)
    binpack = registry.get("binpack")
    pod = PODS["1gpu"]
    slow: list[float] = []
    for k in range(args.slow_reps):
        names = batches[k % len(batches)]
        s = c.snapshot()
        t0 = time.perf_counter()
        for name in names:
            if fit.place(s.nodes[name], pod, binpack).status.ok:
                binpack.score_node(s.nodes[name], pod, api.EMPTY_CONTEXT)
        slow.append((time.perf_counter() - t0) * 1e3)
    records.append(
        {
            "measure": "per-node fit.place + score_node (reference)",
            "policy": "binpack",
            "pod": POD_LABELS["1gpu"],
            "reps": len(slow),
            "p50_ms": pct(slow, 50),
            "p99_ms": pct(slow, 99),
            "max_ms": max(slow),
            "cluster": cluster,
        }
    )

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
    records.append(
        {
            "measure": "assume + snapshot after one change",
            "reps": len(refresh),
            "p50_ms": pct(refresh, 50),
            "p99_ms": pct(refresh, 99),
            "max_ms": max(refresh),
            "first_full_snapshot_ms": first_snapshot_ms,
            "build_s": round(build_s, 2),
            "gc_freeze": not args.no_gc_freeze,
            "cluster": cluster,
        }
    )

    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=2) + "\n")

    table = Table(
        title=f"batch.evaluate of {BATCH} of {NODES} nodes x {GPUS} GPUs "
        f"(target p50 <= {TARGET_P50_MS} ms, p99 <= {TARGET_P99_MS} ms)"
    )
    for col in ("policy", "pod", "reps", "feasible", "p50 ms", "p99 ms", "max ms", "choose p50", "meets"):
        table.add_column(col, justify="left" if col in ("policy", "pod") else "right")
    for r in records:
        if r["measure"] != "filter+score":
            continue
        table.add_row(
            str(r["policy"]),
            str(r["pod"]),
            str(r["reps"]),
            f"{r['feasible_mean']:.1f}",
            f"{r['p50_ms']:.3f}",
            f"{r['p99_ms']:.3f}",
            f"{r['max_ms']:.3f}",
            f"{r['choose_p50_ms']:.3f}",
            "[green]yes[/]" if r["meets_target"] else "[red]no[/]",
        )
    console = Console(width=max(Console().width, 150))
    console.print(table)
    for r in records[-2:]:
        console.print(f"{r['measure']}: p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms")
    console.print(
        f"first full snapshot of {NODES} nodes: {first_snapshot_ms:.1f} ms; cluster build {build_s:.1f} s"
    )
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
