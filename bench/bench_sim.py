"""Wall time of one FGD-benchmark run per policy on the bundled default trace (one core).

Run: .venv/bin/python bench/bench_sim.py [--seeds 42,43,44] [--policies fgd,...] [--online fgd,...]
Writes out/bench_sim.json. Target: every run <= 3 s (the scheduling loop, after loading the trace),
the oracle runs of every policy and the online runs (``--workload online`` with the default
learned-workload settings) of the policies that learn the workload. A straightforward NumPy
implementation of FGD takes about 110 s.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

from gpuslice.sim import experiment, trace

TARGET = 3.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="42,43,44")
    parser.add_argument("--policies", default="random,dotprod,clustering,packing,bestfit,fgd,fgd-lookahead")
    parser.add_argument("--online", default="fgd,fgd-lookahead", help="also run these online ('': none)")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    nodes = trace.data_path(trace.DEFAULT_NODES)
    pods = trace.data_path(trace.DEFAULT_PODS)
    report: dict[str, dict[str, object]] = {}
    runs = [(p, "oracle") for p in args.policies.split(",")]
    runs += [(p, "online") for p in args.online.split(",") if p]
    for policy, mode in runs:
        walls = []
        totals = []
        for seed in seeds:
            start = time.perf_counter()
            result = experiment.run_job(experiment.Job(policy, seed, nodes, pods, workload=mode))
            totals.append(time.perf_counter() - start)
            walls.append(result.wall_seconds)
        target = TARGET
        median = statistics.median(walls)
        label = policy if mode == "oracle" else f"{policy} online"
        report[label] = {
            "median_loop_seconds": round(median, 3),
            "median_total_seconds": round(statistics.median(totals), 3),
            "runs": len(seeds),
            "slowest_loop_seconds": round(max(walls), 3),
            "target_seconds": target,
            "ok": max(walls) <= target,
        }
        print(
            f"{label:21s} loop median {median:6.2f} s  (with loading {statistics.median(totals):6.2f} s)"
            f"  target {target:4.1f} s  {'ok' if max(walls) <= target else 'SLOW'}"
        )
    out = pathlib.Path("out")
    out.mkdir(exist_ok=True)
    (out / "bench_sim.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
