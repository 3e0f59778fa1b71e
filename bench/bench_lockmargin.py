"""What the lock margin costs in placement quality, and what it buys in bind time, in the FGD benchmark.

Run: .venv/bin/python bench/bench_lockmargin.py [--policies binpack,spread,fgd-lookahead]
        [--margins 0,0.05,0.1,0.2] [--seeds 42-51] [--workload oracle|online] [--window 2]
        [--burst 40] [--gap 0.02] [--period 120] [--jobs 2]

The FGD benchmark on the bundled default trace (``gpuslice simulate``'s runs: same pods, order,
nodes and metrics), with HAMi's node lock modelled (``sim.lockwindow``): pods arrive in bursts, each
GPU placement holds its node's lock for the window, and the choice is the extender's lock-aware
rule (``policy.lockchoice``) at each margin; margin 0 places exactly as the benchmark does. Prints
one markdown row per policy and margin: U(100) (mean ± sd over the seeds), its change against
margin 0 (mean of the per-seed differences), the GPUs allocated when the first pod failed, the
share of GPU placements the locks moved off the policy's best node, the share that had to queue
for a busy lock, the mean wait per GPU placement, and the mean and largest burst span (first
arrival to the last ``Allocate``). Writes out/bench_lockmargin.json with every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import statistics
import sys
import time
from collections.abc import Sequence

from gpuslice.sim import experiment, lockwindow, trace


def parse_seeds(text: str) -> list[int]:
    """``42-51`` or ``42,45``."""
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return out


@dataclasses.dataclass(frozen=True)
class Row:
    """One policy at one margin, over the seeds (see the module docstring)."""

    policy: str
    margin: float
    u100_mean: float
    u100_sd: float
    u130_mean: float
    delta_u100_pp: float
    gpus_at_first_failure: float
    gpus_at_first_failure_sd: float
    gpu_placements: int
    moved_pct: float
    waited_pct: float
    mean_wait_s: float
    mean_burst_s: float
    max_burst_s: float
    loop_seconds_mean: float
    seeds: int


def rows(jobs: Sequence[experiment.Job], results: Sequence[experiment.Result]) -> list[Row]:
    """One row per (policy, margin), in job order; deltas against the policy's margin-0 runs by seed."""
    by: dict[tuple[str, float], list[experiment.Result]] = {}
    for job, res in zip(jobs, results, strict=True):
        by.setdefault((job.policy, job.lock.margin if job.lock else 0.0), []).append(res)
    out: list[Row] = []
    for (policy, margin), rs in by.items():
        base = {r.seed: r.unallocated(100) for r in by.get((policy, 0.0), [])}
        u100 = [r.unallocated(100) for r in rs]
        deltas = [r.unallocated(100) - base[r.seed] for r in rs if r.seed in base]
        stats = [r.locks for r in rs if r.locks is not None]
        placed = max(1, sum(s.placements for s in stats))
        bursts = max(1, sum(s.bursts for s in stats))
        firsts = [r.first_failure_milli / 1000 for r in rs if r.first_failure_milli is not None]
        out.append(
            Row(
                policy=policy,
                margin=margin,
                u100_mean=statistics.fmean(u100),
                u100_sd=statistics.stdev(u100) if len(u100) > 1 else 0.0,
                u130_mean=statistics.fmean(r.unallocated(130) for r in rs),
                delta_u100_pp=statistics.fmean(deltas) if deltas else math.nan,
                gpus_at_first_failure=statistics.fmean(firsts) if firsts else math.nan,
                gpus_at_first_failure_sd=statistics.stdev(firsts) if len(firsts) > 1 else 0.0,
                gpu_placements=placed,
                moved_pct=100 * sum(s.moved for s in stats) / placed,
                waited_pct=100 * sum(s.waited for s in stats) / placed,
                mean_wait_s=sum(s.wait_s for s in stats) / placed,
                mean_burst_s=sum(s.burst_s for s in stats) / bursts,
                max_burst_s=max((s.max_burst_s for s in stats), default=0.0),
                loop_seconds_mean=statistics.fmean(r.wall_seconds for r in rs),
                seeds=len(rs),
            )
        )
    return out


def table(rows_: Sequence[Row]) -> str:
    """The markdown table of docs/node-choice.md."""
    lines = [
        "| policy | margin | U(100) % | Δ U(100) pp | GPUs at first failure | moved % | waited % "
        "| mean wait s | mean / max burst s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows_:
        delta = "–" if r.margin == 0 else f"{r.delta_u100_pp:+.3f}"
        lines.append(
            f"| {r.policy} | {r.margin:g} | {r.u100_mean:.3f} ± {r.u100_sd:.3f} | {delta} "
            f"| {r.gpus_at_first_failure:.0f} ± {r.gpus_at_first_failure_sd:.0f} "
            f"| {r.moved_pct:.1f} | {r.waited_pct:.1f} | {r.mean_wait_s:.2f} "
            f"| {r.mean_burst_s:.1f} / {r.max_burst_s:.1f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the sweep, print the table, write the JSON."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--policies", default="binpack,spread,fgd-lookahead")
    parser.add_argument("--margins", default="0,0.05,0.1,0.2")
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-51"))
    parser.add_argument("--workload", choices=experiment.WORKLOADS, default="oracle")
    parser.add_argument("--tune", type=float, default=1.3)
    parser.add_argument("--window", type=float, default=lockwindow.WINDOW_S, help="lock window per pod, s")
    parser.add_argument("--burst", type=int, default=lockwindow.BURST, help="pods per burst")
    parser.add_argument("--gap", type=float, default=lockwindow.GAP_S, help="between pods of a burst, s")
    parser.add_argument("--period", type=float, default=lockwindow.PERIOD_S, help="between bursts, s")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/bench_lockmargin.json"))
    args = parser.parse_args(argv)
    margins = [float(m) for m in args.margins.split(",")]
    if 0.0 not in margins:
        margins.insert(0, 0.0)  # the baseline every delta is taken against
    models = [lockwindow.LockModel(m, args.window, args.burst, args.gap, args.period) for m in margins]
    for model in models:
        if model.problems():
            sys.exit(f"bench_lockmargin: {'; '.join(model.problems())}")
    nodes, pods = trace.data_path(trace.DEFAULT_NODES), trace.data_path(trace.DEFAULT_PODS)
    jobs = [
        experiment.Job(p, seed, nodes, pods, args.tune, args.workload, lock=model)
        for p in args.policies.split(",")
        for model in models
        for seed in args.seeds
    ]
    print(f"{len(jobs)} runs on {args.jobs} workers", file=sys.stderr, flush=True)
    start = time.perf_counter()
    done = [0]

    def progress(r: experiment.Result) -> None:
        done[0] += 1
        if done[0] % 10 == 0 or done[0] == len(jobs):
            print(
                f"  {done[0]}/{len(jobs)} runs, {time.perf_counter() - start:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    results = experiment.run_all(jobs, args.jobs, progress)
    out = rows(jobs, results)
    print(table(out))
    print(f"total {time.perf_counter() - start:.0f} s", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "command": " ".join(["bench/bench_lockmargin.py", *(argv if argv is not None else sys.argv[1:])]),
        "workload": args.workload,
        "seeds": args.seeds,
        "tune": args.tune,
        "lock_model": {
            "window_s": args.window,
            "burst": args.burst,
            "gap_s": args.gap,
            "period_s": args.period,
        },
        "rows": [dataclasses.asdict(r) for r in out],
        "runs": [
            {**r.as_json(), "margin": j.lock.margin if j.lock else 0.0}
            for j, r in zip(jobs, results, strict=True)
        ],
    }
    args.out.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
