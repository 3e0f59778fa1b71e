"""Sweep of the learned-workload settings: FGD-style policies online, against the oracle, on every trace.

Run: .venv/bin/python bench/bench_workload.py [--traces DIR] [--seeds 42-46] [--jobs 2]
        [--policies fgd,fgd-lookahead] [--vary decay=0.99,1 --vary drift=0.05 ...] [--product]

For each trace (default: the bundled default trace; with ``--traces DIR``, every
``openb_pod_list_*.csv`` there against the directory's ``openb_node_list_gpu_node.csv``), each
policy and each setting, runs ``gpuslice simulate --workload online`` over the seeds and prints the
mean unallocated GPU % at 100 % arrived demand, U(100), next to the oracle's (the whole trace's
histogram given in advance, the paper's protocol). The settings are ``model.config.DEFAULT_WORKLOAD``
and, by default, that base with one setting changed at a time (``--vary NAME=V1,V2`` replaces the
default grid; ``--product`` takes every combination instead). Writes out/bench_workload.json with
every figure, the mean loop seconds and the mean number of snapshots and fallback-placed pods.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import statistics
import sys
import time
from collections.abc import Sequence

import msgspec

from gpuslice.model import config as model_config
from gpuslice.sim import experiment, trace

DEFAULT_GRID: dict[str, list[str]] = {
    "decay": ["0.99", "0.9999", "1"],
    "window": ["1000:decay=1"],  # a plain sliding window of 1000 requests
    "min_count": ["0", "200"],
    "fallback": ["pod", "binpack"],
    "drift": ["0.02", "0.1"],
}
"""Variations of the base settings, one at a time; ``V:other=W`` also sets another field."""

NODE_LIST = "openb_node_list_gpu_node.csv"
POD_PREFIX = "openb_pod_list_"


def parse_seeds(text: str) -> list[int]:
    """``42-46`` or ``42,45``."""
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return out


def traces(directory: pathlib.Path | None) -> list[tuple[str, pathlib.Path, pathlib.Path]]:
    """``(name, nodes, pods)`` per trace: the bundled default, or every pod list in ``directory``."""
    if directory is None:
        return [("default", trace.data_path(trace.DEFAULT_NODES), trace.data_path(trace.DEFAULT_PODS))]
    nodes = directory / NODE_LIST
    pods = sorted(directory.glob(POD_PREFIX + "*.csv"))
    if not nodes.is_file() or not pods:
        sys.exit(f"bench_workload: {directory} needs {NODE_LIST} and {POD_PREFIX}*.csv")
    return [(p.stem.removeprefix(POD_PREFIX), nodes, p) for p in pods]


def _variant(base: model_config.WorkloadSettings, field: str, text: str) -> model_config.WorkloadSettings:
    """``base`` with ``field`` set from ``text`` (``V`` or ``V:other=W:...``)."""
    value, *extra = text.split(":")
    fields = {field: value, **dict(e.split("=", 1) for e in extra)}
    return model_config.workload_settings({"workload_" + k: v for k, v in fields.items()}, base)


def grid(vary: dict[str, list[str]], product: bool) -> list[model_config.WorkloadSettings]:
    """The settings to run: the base, then each variation alone (or every combination)."""
    base = model_config.DEFAULT_WORKLOAD
    if product:
        out = []
        for combo in itertools.product(*[[(f, v) for v in vs] for f, vs in vary.items()]):
            s = base
            for f, v in combo:
                s = _variant(s, f, v)
            out.append(s)
        return out
    out = [base]
    for field, values in vary.items():
        out.extend(_variant(base, field, v) for v in values)
    return list(dict.fromkeys(out))  # without repeats, in order


def label(s: model_config.WorkloadSettings | None) -> str:
    """A short name of the settings (``oracle`` for none)."""
    if s is None:
        return "oracle"
    return f"decay={s.decay:g} window={s.window} min={s.min_count} fallback={s.fallback} drift={s.drift:g}"


def main(argv: Sequence[str] | None = None) -> None:
    """Run the sweep and print the table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--traces", type=pathlib.Path, default=None, help="directory of openb_*.csv traces")
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-46"))
    parser.add_argument("--policies", default="fgd,fgd-lookahead")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--tune", type=float, default=1.3)
    parser.add_argument(
        "--vary", action="append", default=[], help="FIELD=V1,V2 (decay, window, min_count, fallback, drift)"
    )
    parser.add_argument("--product", action="store_true", help="every combination of the --vary values")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/bench_workload.json"))
    args = parser.parse_args(argv)
    vary = DEFAULT_GRID
    if args.vary:
        vary = {}
        for item in args.vary:
            field, _, values = item.partition("=")
            vary[field.replace("-", "_")] = values.split(",")
    settings = grid(vary, args.product)
    policies = args.policies.split(",")
    runs = traces(args.traces)
    modes: list[model_config.WorkloadSettings | None] = [None, *settings]
    jobs = [
        experiment.Job(
            p,
            seed,
            nodes,
            pods,
            args.tune,
            "oracle" if s is None else "online",
            model_config.DEFAULT_WORKLOAD if s is None else s,
        )
        for s in modes
        for _, nodes, pods in runs
        for p in policies
        for seed in args.seeds
    ]
    print(
        f"{len(jobs)} runs ({len(modes)} settings with the oracle, {len(runs)} traces, "
        f"{len(policies)} policies, {len(args.seeds)} seeds) on {args.jobs} workers",
        flush=True,
    )
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
    elapsed = time.perf_counter() - start
    by: dict[tuple[str, str, str], list[experiment.Result]] = {}
    for job, res in zip(jobs, results, strict=True):
        name = next(n for n, _, p in runs if p == job.pods)
        by.setdefault(
            (label(None if job.workload == "oracle" else job.settings), name, job.policy), []
        ).append(res)
    rows = []
    for (lab, name, policy), rs in by.items():
        u100 = [r.unallocated(100) for r in rs]
        rows.append(
            {
                "setting": lab,
                "trace": name,
                "policy": policy,
                "u100_mean": round(statistics.fmean(u100), 4),
                "u100_sd": round(statistics.stdev(u100), 4) if len(u100) > 1 else 0.0,
                "u130_mean": round(statistics.fmean(r.unallocated(130) for r in rs), 4),
                "loop_seconds_mean": round(statistics.fmean(r.wall_seconds for r in rs), 3),
                "snapshots_mean": statistics.fmean(r.snapshots for r in rs),
                "fallback_pods_mean": statistics.fmean(r.fallback_pods for r in rs),
                "seeds": [r.seed for r in rs],
            }
        )
    _print(rows, [label(s) for s in modes], [n for n, _, _ in runs], policies)
    print(f"total {elapsed:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "seeds": args.seeds,
        "tune": args.tune,
        "settings": {label(s): msgspec.to_builtins(s) for s in settings},
        "rows": rows,
    }
    args.out.write_text(json.dumps(record, indent=2))


def _print(rows: list[dict[str, object]], labels: list[str], names: list[str], policies: list[str]) -> None:
    """One line per setting: mean U(100) per trace and policy, their mean over traces, loop seconds."""
    cell = {(r["setting"], r["trace"], r["policy"]): r for r in rows}
    for policy in policies:
        print(f"\n{policy}: mean U(100) % over the seeds (oracle first); loop s = mean per run")
        print(f"{'setting':64s} " + " ".join(f"{n[:11]:>11s}" for n in names) + "        mean   loop s")
        for lab in labels:
            got = [cell[(lab, n, policy)] for n in names]
            u = [float(g["u100_mean"]) for g in got]  # type: ignore[arg-type]
            loop = statistics.fmean(float(g["loop_seconds_mean"]) for g in got)  # type: ignore[arg-type]
            print(
                f"{lab:64s} "
                + " ".join(f"{x:11.3f}" for x in u)
                + f" {statistics.fmean(u):11.3f} {loop:8.2f}"
            )


if __name__ == "__main__":
    main()
