"""Placement fidelity: a slice of the Alibaba trace through the real kube-scheduler vs the simulator.

The same pods, in the same order, on the same nodes: once in the simulator (``sim.fidelity``:
``engine.Placer`` with the extender's online target workload) and once through etcd +
kube-apiserver + kube-scheduler + ``gpuslice serve`` + the device-plugin stand-in
(``devcluster.fidelity``), one pod at a time. Per policy and node-choice mode: unallocated GPU %
after all pods arrived (sim, e2e, difference in percentage points), pods that did not fit, and the
share of pods on the simulator's node (and cards), with the first divergence.

Slice (``sim.fidelity`` module docstring): ``--nodes`` trace nodes with >= 4 GPUs drawn by
``--seed`` (their draw order is the simulator's rank and the name order), the trace's GPU pods
shuffled and cut to ``--tune`` x capacity as the FGD experiment does (1.0: the experiment's
U(100) point, the cluster near full), then to at most ``--pods``. Default: 60 nodes (468 GPUs,
seed 42), 560 pods.

Targets: |delta| <= 0.3 pp and >= 95 % of pods on the simulator's node, for binpack,
fgd and fgd-lookahead.

Run (needs the control plane binaries:
``export GPUSLICE_CONTROL_PLANE_BIN=$(bash hack/control-plane/build.sh | tail -1)``):
    .venv/bin/python bench/bench_fidelity.py [--policies binpack,fgd,fgd-lookahead] [--nodes 60]
        [--pods N] [--seed 42] [--tune 1.0] [--node-choice auto|extender,rank,blend|default]
        [--workload-period auto|0|default]  (serve's --workload-period-s)
Writes out/bench_fidelity.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

from rich.console import Console
from rich.table import Table

from gpuslice.sim import fidelity
from gpuslice_dev import fidelity as cluster_fidelity

OUT = pathlib.Path("out")
TARGET_DELTA_PP = 0.3
TARGET_AGREEMENT = 0.95
DEFAULT = "default"
"""``--node-choice`` / ``--workload-period`` value that passes no flag (the extender's default)."""


def node_choices(text: str) -> list[str | None]:
    """``auto``: ``extender`` when ``gpuslice serve`` has ``--node-choice``, else its default (None)."""
    out: list[str | None] = []
    for part in (p.strip() for p in text.split(",")):
        if part == "auto":
            out.append("extender" if cluster_fidelity.serve_supports("--node-choice") else None)
        elif part == DEFAULT:
            out.append(None)
        elif part in cluster_fidelity.NODE_CHOICES:
            out.append(part)
        else:
            raise SystemExit(f"unknown node choice {part!r}")
    return out


def workload_period(text: str) -> float | None:
    """``auto``: 0 when ``gpuslice serve`` has ``--workload-period-s``, else its default (None)."""
    if text == "auto":
        return 0.0 if cluster_fidelity.serve_supports("--workload-period-s") else None
    return None if text == DEFAULT else float(text)


def _plain(p: fidelity.Placement | None) -> list[object] | None:
    return None if p is None else [p.node, list(p.cards)]


def main() -> int:
    """Run the slice per (node choice, policy), print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="binpack,fgd,fgd-lookahead")
    parser.add_argument("--nodes", type=int, default=60)
    parser.add_argument("--pods", type=int, default=None, help="at most this many pods of the arrivals")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--tune", type=float, default=1.0, help="arrived GPU demand / capacity")
    parser.add_argument("--min-gpus", type=int, default=4, help="draw nodes with at least this many GPUs")
    parser.add_argument(
        "--node-choice", default="auto", help="comma list of extender,rank,blend,default,auto"
    )
    parser.add_argument("--workload-period", default="auto", help="seconds, 'default' or 'auto'")
    parser.add_argument("--sim-workload", default="online", choices=("online", "oracle"))
    parser.add_argument("--timeout", type=float, default=30.0, help="per-pod wait, seconds")
    parser.add_argument("--workdir", type=pathlib.Path, default=None, help="keep logs here")
    parser.add_argument(
        "--placements", action="store_true", help="also write every pod's sim and e2e placement to the JSON"
    )
    args = parser.parse_args()

    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 160)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    choices = node_choices(args.node_choice)
    period = workload_period(args.workload_period)
    sl = fidelity.make_slice(
        args.nodes, args.seed, pod_limit=args.pods, tune=args.tune, min_gpus=args.min_gpus
    )
    console.print(f"slice: {sl.describe()}")
    sims = {p: fidelity.simulate(sl, p, args.sim_workload) for p in policies}
    manifests = fidelity.pod_manifests(sl, cluster_fidelity.SCHEDULER)
    workdir = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="bench-fidelity-"))
    records: list[dict[str, object]] = []
    table = Table(title=f"placement fidelity: {len(sl.pods)} pods on {len(sl.nodes)} nodes, seed {args.seed}")
    for col in (
        "node choice",
        "policy",
        "U sim %",
        "U e2e %",
        "Δ pp",
        "failed sim/e2e",
        "same node %",
        "same cards %",
        "first divergence (pod: sim → e2e)",
        "e2e s",
        "ok",
    ):
        table.add_column(
            col, justify="left" if col in ("policy", "node choice") or "diverg" in col else "right"
        )
    with cluster_fidelity.FidelityCluster(fidelity.node_specs(sl), workdir=workdir) as cl:
        for choice in choices:
            for policy in policies:
                serve = cluster_fidelity.serve_flags(policy, choice, period)
                got = cl.run(manifests, serve, cluster_fidelity.render_flags(choice), args.timeout)
                e2e = fidelity.tally(sl, policy, fidelity.placements_from(got.placements), got.seconds)
                cmp = fidelity.compare(sims[policy], e2e)
                ok = abs(cmp.delta_pp) <= TARGET_DELTA_PP and cmp.node_agreement >= TARGET_AGREEMENT
                div = cmp.first_divergence
                record = {
                    **cmp.as_json(),
                    "node_choice": choice or DEFAULT,
                    "workload_period": DEFAULT if period is None else period,
                    "sim_workload": args.sim_workload,
                    "e2e_timeouts": got.timeouts,
                    "e2e_errors": got.errors,
                    "ok": ok,
                    "serve_args": serve,
                    "extender_log": str(got.log),
                }
                if args.placements:
                    record["placements"] = [
                        [_plain(a), _plain(b)]
                        for a, b in zip(cmp.sim.placements, cmp.e2e.placements, strict=True)
                    ]
                records.append(record)
                table.add_row(
                    choice or DEFAULT,
                    policy,
                    f"{cmp.sim.unallocated_pct:.3f}",
                    f"{cmp.e2e.unallocated_pct:.3f}",
                    f"{cmp.delta_pp:+.3f}",
                    f"{cmp.sim.failed}/{cmp.e2e.failed}",
                    f"{100 * cmp.node_agreement:.1f}",
                    f"{100 * cmp.card_agreement:.1f}",
                    "-" if div is None else f"{div[0]}: {div[1]} → {div[2]}",
                    f"{got.seconds:.1f}",
                    "ok" if ok else "MISS",
                )
                console.print(
                    f"{choice or DEFAULT} {policy}: Δ {cmp.delta_pp:+.3f} pp, "
                    f"same node {100 * cmp.node_agreement:.1f} %, {got.seconds:.1f} s "
                    f"({got.timeouts} timeouts, {got.errors} errors)"
                )
    console.print(table)
    OUT.mkdir(exist_ok=True)
    report = {
        "slice": sl.describe(),
        "targets": {"abs_delta_pp": TARGET_DELTA_PP, "node_agreement": TARGET_AGREEMENT},
        "runs": records,
        "workdir": str(workdir),
    }
    (OUT / "bench_fidelity.json").write_text(json.dumps(report, indent=2))
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
