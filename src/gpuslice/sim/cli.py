"""``gpuslice simulate``: the FGD benchmark (or a time replay) over one or more policies and seeds."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
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

from gpuslice.framework import registry  # noqa: E402
from gpuslice.model import config as model_config  # noqa: E402
from gpuslice.sim import experiment, gangsim, loadscale, migsim, replay, report, trace  # noqa: E402


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


def parse_loads(text: str) -> list[float]:
    """Comma-separated target offered loads for ``--replay``, each in (0, ``loadscale.MAX_LOAD``]."""
    out: list[float] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            out.append(loadscale.check_load(float(part)))
        except (ValueError, loadscale.ReplayError) as exc:
            raise argparse.ArgumentTypeError(f"bad load {part!r}: {exc}") from None
    if not out:
        raise argparse.ArgumentTypeError("no load")
    return out


def parse_names(known: tuple[str, ...], what: str) -> Callable[[str], list[str]]:
    """A parser of comma-separated names among ``known``."""

    def parse(text: str) -> list[str]:
        out = list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
        bad = [p for p in out if p not in known]
        if bad or not out:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(bad) or '(none)'}; known: {', '.join(known)}"
            )
        return out

    return parse


def parse_gang_sizes(text: str) -> tuple[int, int]:
    """``LO-HI`` or ``N``: generated gang sizes (``gangsim.parse_sizes``)."""
    try:
        return gangsim.parse_sizes(text)
    except gangsim.GangError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_passes(text: str) -> float:
    """A positive window length in trace passes."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad number {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


_WORKLOAD_HELP = {
    "workload_decay": (float, "a request seen k requests ago weighs decay**k, in (0, 1]"),
    "workload_window": (int, "only this many most recent requests count (0: all)"),
    "workload_min_count": (int, "requests seen before the learned workload is trusted"),
    "workload_fallback": (str, "policy standing in for fgd/fgd-lookahead until then (or 'pod')"),
    "workload_drift": (
        float,
        "re-take the workload the policy sees at this total-variation drift (0: always)",
    ),
}


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """``--workload-decay`` ... : ``gpuslice serve``'s learned-workload settings, same names and defaults."""
    for setting, (kind, text) in _WORKLOAD_HELP.items():
        field = model_config.WORKLOAD_SETTINGS[setting]
        default = getattr(model_config.DEFAULT_WORKLOAD, field)
        parser.add_argument(
            "--" + setting.replace("_", "-"),
            dest=setting,
            type=kind,
            default=None,
            help=f"--workload online: {text} (default {default})",
        )


def workload_settings(args: argparse.Namespace) -> model_config.WorkloadSettings:
    """The learned-workload settings the flags give (unset ones keep the defaults), checked.

    Raises:
        model_config.WorkloadSettingError: an invalid value, naming its setting.
    """
    given = {
        s: getattr(args, s) for s in model_config.WORKLOAD_SETTINGS if getattr(args, s, None) is not None
    }
    return registry.checked(model_config.workload_settings(given))


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
        "a decayed histogram of the pods seen so far (online; the --workload-* settings, docs/workload.md)",
    )
    add_workload_arguments(parser)
    parser.add_argument(
        "--replay",
        action="store_true",
        help="only the replay with departures: stationary arrivals drawn from the trace at --load, each pod "
        "running for its traced duration; unplaced pods wait in a FIFO queue (docs/replay.md)",
    )
    parser.add_argument(
        "--replay-policy",
        type=parse_policies,
        default=None,
        help="run the replay for these policies after the benchmark (second table, plot panels); "
        "with --replay they replace --policy",
    )
    parser.add_argument(
        "--replay-seeds", type=parse_seeds, default=None, help="the replay's seeds (default: --seeds)"
    )
    parser.add_argument(
        "--load",
        type=parse_loads,
        default=[0.9],
        help=f"replay: target offered GPU load(s), fractions of capacity in (0, {loadscale.MAX_LOAD:g}], "
        "comma-separated (default 0.9)",
    )
    parser.add_argument(
        "--replay-passes",
        type=parse_passes,
        default=1.0,
        help="replay: measured window length, in trace pod counts of arrivals (default 1)",
    )
    parser.add_argument(
        "--gangs",
        choices=gangsim.MODES,
        default="off",
        help="place gangs all-or-nothing: pods sharing the pod list's job column (trace) or "
        "consecutive GPU arrivals grouped into gangs of --gang-sizes (generated, the only kind with "
        "--replay, where a gang that does not fit waits); off: every pod alone",
    )
    parser.add_argument(
        "--gang-sizes",
        type=parse_gang_sizes,
        default=gangsim.DEFAULT_SIZES,
        help="--gangs generated: gang sizes LO-HI drawn uniformly (or N), seeded by --seeds (default 2-16)",
    )
    parser.add_argument(
        "--gang-planner",
        choices=gangsim.PLANNERS,
        default="place_all",
        help="how a gang is placed: the extender's planner (place_all, node by node) or the simulator's "
        "placer member by member, undone when one does not fit (trial: the same placements, faster)",
    )
    parser.add_argument(
        "--mig",
        type=parse_names(migsim.MIXES, "MIG mix"),
        default=None,
        help="only the MIG simulation on these request mixes (alibaba, synthetic): cards in MIG mode, "
        "Poisson arrivals with exponential lifetimes above capacity, HAMi's first fit against the "
        "fragmentation rule (docs/mig-simulation.md); --seeds, --jobs and --json apply",
    )
    parser.add_argument(
        "--mig-variants",
        type=parse_names(tuple(migsim.VARIANTS), "MIG variant"),
        default=list(migsim.VARIANTS),
        help="--mig: node policy, card policy and MIG rule combinations, the first the baseline "
        f"(default {','.join(migsim.VARIANTS)})",
    )
    parser.add_argument(
        "--mig-table",
        choices=tuple(migsim.TABLES),
        default=migsim.A100_40GB.name,
        help="--mig: the card model",
    )
    parser.add_argument("--mig-nodes", type=int, default=migsim.Spec.nodes, help="--mig: nodes of 8 cards")
    parser.add_argument(
        "--mig-load",
        type=float,
        default=migsim.Spec.load,
        help="--mig: offered memory slices over the cluster's slices (default %(default)s)",
    )
    parser.add_argument(
        "--mig-warmup", type=int, default=migsim.Spec.warmup, help="--mig: arrivals before measuring"
    )
    parser.add_argument(
        "--mig-arrivals", type=int, default=migsim.Spec.measured, help="--mig: measured arrivals per run"
    )


def main(args: argparse.Namespace) -> int:
    """Run the jobs and print JSON or a table."""
    if args.mig:
        return _mig(args)
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
    try:
        settings = workload_settings(args)
    except model_config.WorkloadSettingError as exc:
        print(f"gpuslice simulate: {exc}", file=sys.stderr)
        return 2
    gangs = None if args.gangs == "off" else gangsim.GangSpec(args.gangs, args.gang_sizes, args.gang_planner)
    if gangs is not None and gangs.mode == "trace" and (args.replay or args.replay_policy):
        print("gpuslice simulate: the replay draws its arrivals: --gangs generated only", file=sys.stderr)
        return 2
    if gangs is not None and gangs.mode == "trace" and not any(p.job for p in trace.load_pods(pods)):
        print(
            f"gpuslice simulate: --gangs trace: {pods} has no job column (or every job is empty)",
            file=sys.stderr,
        )
        return 2
    if args.replay or args.replay_policy:
        try:
            replay.check(pods)
        except replay.ReplayError as exc:
            print(f"gpuslice simulate: {exc}", file=sys.stderr)
            return 2
    if args.replay:
        replays = _replay(args, nodes, pods, console)
        if args.json:
            print(json.dumps([r.as_json() for r in replays]))
        else:
            console.print(report.replay_table(report.summarize_replay(replays)))
        if args.plot is not None:
            report.plot([], args.plot, report.summarize_replay(replays))
        return 0
    jobs = [
        experiment.Job(p, s, nodes, pods, args.tune, args.workload, settings, gangs=gangs)
        for p in args.policy
        for s in args.seeds
    ]
    workers = max(1, min(args.jobs, len(jobs)))
    if args.json:
        results = experiment.run_all(jobs, workers)
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
        report.show(report.summarize(results), console, args.workload)
    replays = _replay(args, nodes, pods, console) if args.replay_policy else []
    if args.json:
        print(json.dumps([r.as_json() for r in results] + [r.as_json() for r in replays]))
    elif replays:
        console.print(report.replay_table(report.summarize_replay(replays)))
    if args.plot is not None:
        report.plot(report.summarize(results), args.plot, report.summarize_replay(replays))
    return 0


def _replay(args: argparse.Namespace, nodes: Path, pods: Path, console: Console) -> list[replay.ReplayResult]:
    """The replay jobs of ``--replay`` / ``--replay-policy``, one per (policy, load, seed), run in a pool."""
    policies: list[str] = args.replay_policy or args.policy
    seeds: list[int] = args.replay_seeds or args.seeds
    gangs = None if args.gangs == "off" else gangsim.GangSpec(args.gangs, args.gang_sizes, args.gang_planner)
    jobs = [
        replay.ReplayJob(
            p,
            s,
            nodes,
            pods,
            load,
            args.replay_passes,
            args.workload,
            settings=workload_settings(args),
            gangs=gangs,
        )
        for p in policies
        for load in args.load
        for s in seeds
    ]
    workers = max(1, min(args.jobs, len(jobs)))
    if args.json:
        return replay.run_all(jobs, workers)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("replaying", total=len(jobs))

        def done(r: replay.ReplayResult) -> None:
            progress.update(
                task,
                advance=1,
                description=f"replay {r.policy} load {r.load:g} seed {r.seed}: "
                f"unallocated {r.figures.unallocated_pct:.2f}%",
            )

        return replay.run_all(jobs, workers, done)


def _mig(args: argparse.Namespace) -> int:
    """``--mig``: every (mix, variant, seed) run, then a markdown table or JSON records."""
    if args.mig_nodes < 1 or args.mig_arrivals < 1 or args.mig_warmup < 0 or not args.mig_load > 0:
        print(
            "gpuslice simulate: --mig-nodes and --mig-arrivals must be positive, --mig-load > 0",
            file=sys.stderr,
        )
        return 2
    specs = [
        migsim.Spec(
            v,
            m,
            s,
            nodes=args.mig_nodes,
            load=args.mig_load,
            warmup=args.mig_warmup,
            measured=args.mig_arrivals,
            table=args.mig_table,
        )
        for m in args.mig
        for v in args.mig_variants
        for s in args.seeds
    ]
    results = migsim.run_all(specs, max(1, min(args.jobs, len(specs))))
    if args.json:
        print(json.dumps([r.as_json() for r in results]))
    else:
        print(migsim.markdown(migsim.summarize(results, args.mig_variants[0]), args.mig_variants[0]))
    return 0
