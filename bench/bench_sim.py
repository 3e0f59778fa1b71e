"""Wall time of one FGD-benchmark run per policy on the bundled default trace (one core).

Run: .venv/bin/python bench/bench_sim.py [--seeds 42,43,44] [--policies fgd,...]
Writes out/bench_sim.json. Targets: FGD <= 15 s per run, every other policy <= 3 s (the scheduling
loop, after loading the trace; a straightforward NumPy implementation of FGD takes about 110 s).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

from gpuslice.sim import experiment, trace

TARGETS = {"fgd": 15.0, "fgd-lookahead": 15.0}
DEFAULT_TARGET = 3.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="42,43,44")
    parser.add_argument("--policies", default="random,dotprod,clustering,packing,bestfit,fgd,fgd-lookahead")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    nodes = trace.data_path(trace.DEFAULT_NODES)
    pods = trace.data_path(trace.DEFAULT_PODS)
    report: dict[str, dict[str, object]] = {}
    for policy in args.policies.split(","):
        walls = []
        totals = []
        for seed in seeds:
            start = time.perf_counter()
            result = experiment.run_job(experiment.Job(policy, seed, nodes, pods))
            totals.append(time.perf_counter() - start)
            walls.append(result.wall_seconds)
        target = TARGETS.get(policy, DEFAULT_TARGET)
        median = statistics.median(walls)
        report[policy] = {
            "median_loop_seconds": round(median, 3),
            "median_total_seconds": round(statistics.median(totals), 3),
            "runs": len(seeds),
            "target_seconds": target,
            "ok": median <= target,
        }
        print(
            f"{policy:14s} loop median {median:6.2f} s  (with loading {statistics.median(totals):6.2f} s)"
            f"  target {target:4.1f} s  {'ok' if median <= target else 'SLOW'}"
        )
    out = pathlib.Path("out")
    out.mkdir(exist_ok=True)
    (out / "bench_sim.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
