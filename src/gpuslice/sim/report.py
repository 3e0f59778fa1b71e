"""Summaries of simulation runs: per-policy statistics, a rich table next to the published figures, a plot."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from gpuslice.sim import experiment

CITATION = (
    "Published: Weng et al., 'Beware of Fragmentation: Scheduling GPU-Sharing Workloads with "
    "Fragmentation Gradient Descent', USENIX ATC 2023; artifact expected results "
    "(hkust-adsl/kubernetes-scheduler-simulator), default trace, seeds 42-51, tune 1.3."
)

PUBLISHED: dict[str, tuple[float, float, float, float]] = {
    "random": (13.697, 0.332, 12.530, 0.319),
    "dotprod": (9.378, 0.186, 9.151, 0.202),
    "clustering": (8.350, 0.610, 8.122, 0.625),
    "packing": (8.221, 0.532, 7.998, 0.545),
    "bestfit": (7.138, 0.144, 6.924, 0.134),
    "fgd": (4.773, 0.106, 4.609, 0.082),
}
"""Artifact U(100) mean, sd and U(130) mean, sd per paper policy (fgd-experiment.md section 7)."""


@dataclasses.dataclass(frozen=True)
class Stats:
    """Mean, sample sd (n - 1; 0 for one run) and median."""

    mean: float
    sd: float
    median: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        """Statistics of a non-empty sample."""
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return cls(statistics.fmean(values), sd, statistics.median(values))


@dataclasses.dataclass(frozen=True)
class Summary:
    """One policy over its seeds."""

    policy: str
    runs: int
    u100: Stats
    u130: Stats
    median_curve: np.ndarray


def summarize(results: Sequence[experiment.Result]) -> list[Summary]:
    """Per policy (in first-seen order): U(100), U(130) statistics and the median a(x) curve."""
    by_policy: dict[str, list[experiment.Result]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append(r)
    out = []
    for policy, runs in by_policy.items():
        curves = np.vstack([r.curve for r in runs])
        out.append(
            Summary(
                policy,
                len(runs),
                Stats.of([r.unallocated(100) for r in runs]),
                Stats.of([r.unallocated(130) for r in runs]),
                np.median(curves, axis=0),
            )
        )
    return out


def _fmt(s: Stats) -> str:
    return f"{s.mean:.3f}±{s.sd:.2f}"


def table(summaries: Sequence[Summary]) -> Table:
    """A rich table of U(100) and U(130) per policy with the published means beside them."""
    runs = sorted({s.runs for s in summaries})
    t = Table(
        title=f"Unallocated GPU % at 100 / 130 % arrived, {'/'.join(map(str, runs))} seeds (lower is better)",
        caption=CITATION,
    )
    for col in ("policy", "U100 mean±sd", "median", "paper", "U130 mean±sd", "paper"):
        t.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for s in summaries:
        pub = PUBLISHED.get(s.policy)
        t.add_row(
            s.policy,
            _fmt(s.u100),
            f"{s.u100.median:.2f}",
            f"{pub[0]:.2f}±{pub[1]:.2f}" if pub else "-",
            _fmt(s.u130),
            f"{pub[2]:.2f}±{pub[3]:.2f}" if pub else "-",
        )
    return t


def show(summaries: Sequence[Summary], console: Console) -> None:
    """Print the table."""
    console.print(table(summaries))


def plot(summaries: Sequence[Summary], path: Path) -> None:
    """Write the median a(x) curves (x = 0..130) to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s in summaries:
        x = np.arange(len(s.median_curve))
        ax.plot(x, s.median_curve, label=f"{s.policy} (U100 {s.u100.median:.2f}%)")
    ax.plot([0, 100], [0, 100], color="grey", linewidth=0.5, linestyle=":", label="all arrived demand placed")
    ax.set_xlim(80, 130)
    ax.set_ylim(80, 100)
    ax.set_xlabel("arrived GPU demand, % of capacity")
    ax.set_ylabel("allocated GPUs, % of capacity (median)")
    ax.set_title("Alibaba openb trace, FGD benchmark")
    ax.grid(True, linewidth=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
