"""``gpuslice simulate``: the FGD benchmark (or a time replay) over one or more policies and seeds."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gpuslice.sim import extra

# Ahead of rich and of the sim modules that import it: a server-only install (`pip install gpuslice`,
# the container image) gets one line and exit 2 here, for `--help` too, rather than a traceback.
extra.require("gpuslice simulate")

from rich.console import Console  # noqa: E402
from rich.progress import (  # noqa: E402
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from gpuslice.policy import registry  # noqa: E402
from gpuslice.sim import experiment, replay, report, trace  # noqa: E402


def parse_seeds(text: str) -> list[int]:
    """``42-51``, ``42,45`` or a mix (``1-3,7``) as a list of seeds."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                first, last = int(lo), int(hi)
                if last < first:
                    raise argparse.ArgumentTypeError(f"empty seed range {part!r}")
                out.extend(range(first, last + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad seed {part!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("no seeds")
    return out


def parse_policies(text: str) -> list[str]:
    """A comma-separated list of registered policy names."""
    out = [p.strip() for p in text.split(",") if p.strip()]
    known = registry.names()
    unknown = [p for p in out if p not in known]
    if unknown or not out:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(unknown) or '(none)'}; known: {', '.join(known)}"
        )
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``gpuslice simulate``."""
    parser.add_argument(
        "--nodes", type=Path, default=None, help="node list CSV (default: bundled openb GPU nodes)"
    )
    parser.add_argument(
        "--pods", type=Path, default=None, help="pod list CSV (default: bundled openb default pods)"
    )
    parser.add_argument(
        "--policy", type=parse_policies, default=["fgd"], help="policy name(s), comma-separated"
    )
    parser.add_argument("--seeds", type=parse_seeds, default=[42], help="seeds, e.g. 42-51 or 42,43")
    parser.add_argument(
        "--tune", type=float, default=1.3, help="inflate GPU demand to this multiple of capacity"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON array of per-run records")
    parser.add_argument("--plot", type=Path, default=None, help="write the median a(x) curves to this PNG")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel worker processes")
    parser.add_argument(
        "--workload",
        choices=experiment.WORKLOADS,
        default="oracle",
        help="FGD's target workload: the whole trace (oracle, the paper's) or, as gpuslice serve builds it, "
        "a decayed histogram of the pods seen so far (online; slow on the full trace: every pod rescores)",
    )
    parser.add_argument(
        "--replay",
        action="store_true",
        help="replay creation/deletion times (pods leave; unplaced pods wait in a FIFO queue)",
    )


def main(args: argparse.Namespace) -> int:
    """Run the jobs and print JSON or a table."""
    nodes: Path = args.nodes or trace.data_path(trace.DEFAULT_NODES)
    pods: Path = args.pods or trace.data_path(trace.DEFAULT_PODS)
    console = Console(stderr=args.json)
    if not console.is_terminal:
        console.width = max(console.width, 100)  # keep the table's columns whole in logs and pipes
    try:
        trace.load_nodes(nodes)
        trace.load_pods(pods)
    except trace.TraceError as exc:
        print(f"gpuslice simulate: {exc}", file=sys.stderr)
        return 2
    if args.replay:
        if args.workload != "oracle":
            print("gpuslice simulate: --workload online is not supported with --replay", file=sys.stderr)
            return 2
        return _replay(args, nodes, pods, console)
    jobs = [
        experiment.Job(p, s, nodes, pods, args.tune, args.workload) for p in args.policy for s in args.seeds
    ]
    workers = max(1, min(args.jobs, len(jobs)))
    if args.json:
        results = experiment.run_all(jobs, workers)
        print(json.dumps([r.as_json() for r in results]))
    else:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            task = progress.add_task("simulating", total=len(jobs))

            def done(r: experiment.Result) -> None:
                progress.update(
                    task, advance=1, description=f"{r.policy} seed {r.seed}: U(100) {r.unallocated(100):.2f}%"
                )

            results = experiment.run_all(jobs, workers, done)
        report.show(report.summarize(results), console)
    if args.plot is not None:
        report.plot(report.summarize(results), args.plot)
    return 0


def _replay(args: argparse.Namespace, nodes: Path, pods: Path, console: Console) -> int:
    jobs = [replay.ReplayJob(p, s, nodes, pods) for p in args.policy for s in args.seeds]
    results = [replay.run_job(j) for j in jobs]
    if args.json:
        print(json.dumps([r.as_json() for r in results]))
    else:
        console.print(replay.table(results))
    return 0
