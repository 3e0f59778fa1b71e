"""FGD's exact arithmetic: integer weights and the score as a table of integer thresholds.

FGD (Weng et al., USENIX ATC 2023) scores a node ``int(100 * sigmoid(dF / 1000))`` where ``dF`` is
the decrease of the fragmentation ``F = sum_m p_m F_n(m)`` in milli-GPU. Summed in floating point,
F depends on the order of the terms in its last bits, and so can the score at a boundary: ``dF == 0``
gives exactly 50 only if both sums agree bit for bit. Two paths compute F here (node by node in
``fragmentation``, vectorised in ``fragcolumns``), so both use this module instead:

* each weight is quantised once, ``round(p * UNIT)`` (``quantize``), so F is an exact integer in
  milli-GPU / ``UNIT`` whatever order it is summed in, and so is ``dF``;
* the score is the number of thresholds ``dF`` reaches (``score``, ``scores``): threshold k is the
  least integer ``dF`` whose floating-point ``sigmoid_score(dF / UNIT)`` is at least k, found once
  by bisection at import;
* except that a decrease within ``TIE`` below zero scores 50 like zero does. Rounding the weights
  moves F by up to half a unit per shape and milli-GPU, so two states of equal F as rationals (2/7
  of 600 milli against 2/7 of 500 plus 1/7 of 200) can differ by a few hundred units; in floating
  point such differences (1e-13 milli-GPU) vanish in ``sigmoid``'s rounding, and ``TIE`` keeps that.

``UNIT`` is ``2**40``: F of a node of up to 31 cards (31000 milli) stays below ``2**56``, inside int64
with room for the prefix sums of ``fragcolumns``; ``TIE`` (``2**24`` units, ``2**-16`` milli-GPU) is
far above the rounding (at most 0.5 * 64 shapes * 31000 milli = ``2**20`` units) and far below any
decrease a real weight can make (a weight of 1e-4 on one milli-GPU is ``2**26`` units).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

MAX_SCORE = 100
UNIT = 1 << 40
"""Integer weight units per 1.0 of probability: F is an integer in milli-GPU / ``UNIT``."""
TIE = 1 << 24
"""A decrease in ``(-TIE, 0)`` units is rounding, not a change: it scores 50 like zero."""


def quantize(weights: Sequence[float]) -> tuple[int, ...]:
    """The weights as integers ``round(p * UNIT)`` (0.25 -> 2**30): the only rounding F sees."""
    return tuple(round(p * UNIT) for p in weights)


def sigmoid_score(delta: float) -> int:
    """``int(100 * sigmoid(delta / 1000))`` in floating point, for a decrease of ``delta`` milli-GPU.

    The reference formula that ``SCORE_THRESHOLDS`` is derived from; scoring reads the table.
    """
    z = delta / 1000.0
    if z < -700:
        return 0
    return int(100.0 * (1.0 / (1.0 + math.exp(-z))))


def _threshold(k: int) -> int:
    """The least integer ``x`` (milli-GPU / UNIT) with ``sigmoid_score(x / UNIT) >= k``."""

    def reaches(x: int) -> bool:
        return sigmoid_score(x / UNIT) >= k  # int / int: the correctly rounded quotient

    # 100 * sigmoid(z) >= k  <=>  z >= ln(k / (100 - k)); the float formula reaches 100 near z = 36.7.
    z = math.log(k / (MAX_SCORE - k)) if k < MAX_SCORE else 37.0
    guess = round(z * 1000 * UNIT)
    step = 1 << 16
    lo, hi = guess - step, guess + step
    while reaches(lo):
        lo -= step
        step *= 2
    while not reaches(hi):
        hi += step
        step *= 2
    while hi - lo > 1:  # reaches(hi), not reaches(lo); sigmoid_score never decreases
        mid = (lo + hi) // 2
        if reaches(mid):
            hi = mid
        else:
            lo = mid
    return hi


SCORE_THRESHOLDS: tuple[int, ...] = tuple(
    -TIE + 1 if k == MAX_SCORE // 2 else _threshold(k) for k in range(1, MAX_SCORE + 1)
)
"""``SCORE_THRESHOLDS[k - 1]``: the least F decrease (milli-GPU / UNIT) that scores at least k."""
_TABLE = np.array(SCORE_THRESHOLDS, np.int64)


def score(delta: int) -> int:
    """FGD's node score 0..100 for an exact F decrease ``delta`` (milli-GPU / UNIT)."""
    return bisect.bisect_right(SCORE_THRESHOLDS, delta)


def scores(delta: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``score`` of every element."""
    return np.searchsorted(_TABLE, delta, side="right").astype(np.int64)
