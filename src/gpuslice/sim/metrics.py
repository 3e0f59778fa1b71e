"""The allocation curve a(x) and unallocated GPU % U(x) of the FGD benchmark (section 5)."""

from __future__ import annotations

import numpy as np

X_MAX = 130
"""Last arrived-demand percentage of the curve."""


def go_round(values: np.ndarray, decimals: int = 0) -> np.ndarray:
    """Round half away from zero (Go's ``math.Round``), unlike numpy's half-to-even."""
    scale = 10.0**decimals
    out: np.ndarray = np.sign(values) * np.floor(np.abs(values) * scale + 0.5) / scale
    return out


def allocation_curve(
    arrived: np.ndarray, used: np.ndarray, capacity_milli: int, x_max: int = X_MAX
) -> np.ndarray:
    """a(x) for x = 0..x_max, in percent of capacity, from per-event arrived and used milli-GPU.

    Event x is ``round(100 * arrived / capacity)``; a(x) is the mean of ``round(100 * used /
    capacity, 2)`` over events with that x, or over events at x - 1 and x + 1 when none has x.
    A tiny trace can skip further; then the last event below x carries forward (NaN before any).
    """
    x = go_round(100.0 * np.asarray(arrived, dtype=np.float64) / capacity_milli).astype(np.int64)
    pct = go_round(100.0 * np.asarray(used, dtype=np.float64) / capacity_milli, 2)
    keep = (x >= 0) & (x <= x_max + 1)
    sums = np.bincount(x[keep], weights=pct[keep], minlength=x_max + 2)
    counts = np.bincount(x[keep], minlength=x_max + 2).astype(np.float64)
    out = np.full(x_max + 1, np.nan)
    for k in range(x_max + 1):
        if counts[k] > 0:
            out[k] = sums[k] / counts[k]
            continue
        lo, hi = max(k - 1, 0), k + 1
        n = (counts[lo] if lo != k else 0.0) + counts[hi]
        if n > 0:
            out[k] = ((sums[lo] if lo != k else 0.0) + sums[hi]) / n
            continue
        before = int(np.searchsorted(x, k, side="left"))  # x never decreases: events with x < k
        if before > 0:
            out[k] = pct[before - 1]
    return out


def unallocated(curve: np.ndarray, x: int) -> float:
    """U(x) = 100 - a(x)."""
    return float(100.0 - curve[x])
