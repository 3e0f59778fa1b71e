"""Summarise bench/ab/latency.sh: per row, the median over rounds of each side's p50, and new/base.

Run: .venv/bin/python bench/ab/summary.py [OUT_DIR]   (default out/ab-latency)
"""

from __future__ import annotations

import glob
import json
import statistics
import sys
from collections.abc import Callable

Rows = dict[tuple[str, str], list[float]]


def load_filter(out: str, side: str) -> Rows:
    """(policy, pod) -> the p50 of every round of bench_filter.py."""
    rows: Rows = {}
    for path in sorted(glob.glob(f"{out}/{side}-filter-*.json")):
        with open(path) as f:
            for r in json.load(f):
                if r.get("measure") == "filter+score":
                    rows.setdefault((r["policy"], r["pod"]), []).append(r["p50_ms"])
    return rows


def load_extender(out: str, side: str) -> Rows:
    """(policy, verb) -> the p50 of every round of bench_extender.py latency."""
    rows: Rows = {}
    for path in sorted(glob.glob(f"{out}/{side}-ext-*.json")):
        with open(path) as f:
            doc = json.load(f)
        for policy, r in doc["rows"].items():
            for verb in ("filter_plus_prioritize", "filter", "prioritize"):
                rows.setdefault((policy, verb), []).append(r[verb]["p50_ms"])
    return rows


def spread(values: list[float]) -> str:
    """``min-max`` of the rounds."""
    return f"{min(values):.3f}-{max(values):.3f}"


def table(title: str, loader: Callable[[str, str], Rows], out: str) -> None:
    """One table: base, new, new/base per row, then the median ratio."""
    base, new = loader(out, "base"), loader(out, "new")
    if not base:
        return
    print(f"\n{title}  (median of {len(next(iter(base.values())))} rounds)")
    print(f"{'row':58s} {'base':>8s} {'new':>8s} {'new/base':>8s}  rounds base / new")
    ratios = []
    for key in sorted(base):
        if key not in new:
            continue
        b, n = statistics.median(base[key]), statistics.median(new[key])
        ratios.append(n / b)
        rounds = f"{spread(base[key])} / {spread(new[key])}"
        print(f"{' / '.join(key):58s} {b:8.3f} {n:8.3f} {n / b:8.2f}  {rounds}")
    med = statistics.median(ratios)
    print(f"median ratio new/base over rows: {med:.3f} (min {min(ratios):.2f}, max {max(ratios):.2f})")


def main() -> None:
    """Print both tables."""
    out = sys.argv[1] if len(sys.argv) > 1 else "out/ab-latency"
    table("bench_filter.py: filter+score p50 ms", load_filter, out)
    table("bench_extender.py latency: p50 ms", load_extender, out)


if __name__ == "__main__":
    main()
