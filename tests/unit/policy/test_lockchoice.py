"""The lock-aware choice rule (``policy.lockchoice``): near the best score, a free node lock goes first.

Scores are on the 0..100 scale; margin m admits the nodes scoring at least ``best - 100 m``. The
choice is the first position of the highest key (``np.argmax``), as the simulator takes it; the
extender breaks ties by name instead, which these cases never need.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpuslice.policy import lockchoice

pytestmark = pytest.mark.unit

F, L = False, True  # lock free, lock busy


def _pick(scores: list[int], locked: list[bool], margin: float) -> int:
    keys = lockchoice.prefer_free(np.array(scores, np.int64), np.array(locked), margin)
    return int(np.argmax(keys))


@pytest.mark.parametrize(
    ("scores", "locked", "margin", "expected"),
    [
        # margin 0: the policy's best, whatever the locks
        ([90, 88, 70], [L, F, F], 0.0, 0),
        # the best (90) is busy; 88 is within 5 points (90 - 0.05 x 100 = 85) and free
        ([90, 88, 70], [L, F, F], 0.05, 1),
        # the band is inclusive: 85 = 90 - 5
        ([90, 85, 70], [L, F, F], 0.05, 1),
        # 84 is outside the band: the lock is ignored there, the busy best stays the choice
        ([90, 84, 70], [L, F, F], 0.05, 0),
        # every node within the band is busy: the best score, as without locks
        ([90, 88, 70], [L, L, F], 0.05, 0),
        # among the free nodes in the band the higher score wins (88 over 86), not the first free one
        ([90, 86, 88, 40], [L, F, F, F], 0.1, 2),
        # ties among the free nodes keep the caller's order (the first position)
        ([90, 88, 88], [L, F, F], 0.05, 1),
        # a free best needs no move
        ([90, 88, 70], [F, L, F], 0.2, 0),
        # margin 1: every node that fits is in the band
        ([90, 0, 70], [L, F, L], 1.0, 1),
    ],
    ids=[
        "margin-0-unchanged",
        "free-node-in-band-preferred",
        "band-inclusive",
        "outside-band-lock-ignored",
        "all-in-band-locked-best-score",
        "best-free-score-in-band",
        "ties-keep-order",
        "free-best-stays",
        "margin-1-everything",
    ],
)
def test_choice(scores: list[int], locked: list[bool], margin: float, expected: int) -> None:
    assert _pick(scores, locked, margin) == expected


@pytest.mark.parametrize(
    ("locked", "margin"),
    [([L, F, F], 0.0), ([F, F, F], 0.1), ([L, L, F], 0.1)],
    ids=["margin-0", "no-lock-busy", "every-node-in-band-busy"],
)
def test_nothing_to_change_returns_the_scores_themselves(locked: list[bool], margin: float) -> None:
    # 90 and 88 are in the band of 0.1 (80..90), 70 is not.
    scores = np.array([90, 88, 70], np.int64)
    assert lockchoice.prefer_free(scores, np.array(locked), margin) is scores
    assert lockchoice.demote_busy(scores, np.array(locked), margin) is scores


def test_busy_nodes_in_band_stay_ahead_of_the_nodes_outside() -> None:
    # 90 (busy) and 88 (free) are in the band of 0.05, 70 (free) is not: order 88, 90, 70.
    keys = lockchoice.prefer_free(np.array([90, 88, 70], np.int64), np.array([L, F, F]), 0.05)
    assert np.argsort(-keys, kind="stable").tolist() == [1, 0, 2]


def test_unfit_nodes_are_never_near_the_best() -> None:
    # -1 marks a node the pod does not fit: with margin 1 the band reaches down to 0, not to it.
    scores = np.array([3, -1, 0], np.int64)
    assert lockchoice.near_best(scores, 1.0).tolist() == [0, 2]
    assert lockchoice.near_best(np.array([-1, -1], np.int64), 1.0).tolist() == []
    assert _pick([3, -1, 0], [L, F, F], 1.0) == 2
    assert lockchoice.near_best(scores, 0.0).tolist() == []


def test_band_is_in_score_points_without_float_noise() -> None:
    # 0.07 x 100 is 7.000000000000001 in floats; 93 must still be within 7 of 100.
    assert lockchoice.band(0.07) == 7
    assert lockchoice.near_best(np.array([100, 93, 92], np.int64), 0.07).tolist() == [0, 1]


def test_demote_busy_lowers_busy_nodes_in_band_below_every_free_one() -> None:
    # margin 0.1: band 90..100. Busy 100 and 95 lose 10 + 1 points (89, 84), below the free 90; the
    # busy 60 is outside the band and keeps its score; the order among the busy ones is kept.
    scores = np.array([100, 95, 90, 60], np.int64)
    out = lockchoice.demote_busy(scores, np.array([L, L, F, L]), 0.1)
    assert out.tolist() == [89, 84, 90, 60]
    assert int(np.argmax(out)) == 2
    # floored at 0
    low = lockchoice.demote_busy(np.array([5, 3], np.int64), np.array([L, F]), 0.1)
    assert low.tolist() == [0, 3]
    assert scores.tolist() == [100, 95, 90, 60]  # the input is not modified
