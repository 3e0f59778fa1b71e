"""Lock-aware node choice: near the best score, prefer a node whose HAMi node lock is free.

HAMi's node lock (``hami.io/mutex.lock``) lets one GPU pod per node sit between its Binding and
the device plugin's ``Allocate``; a bind to a node whose lock is busy waits for it. A burst of
pods that all score best on one node (binpack) therefore binds one pod per ``Allocate`` on that
node, while nodes that score nearly as well sit idle. The rule here trades a little of the
policy's preference for parallel binds: among the nodes whose score is within ``margin`` of the
best, a node with a free lock goes first.

Pure: the scores (after the policy's candidate step), which nodes' locks are busy and the margin
are all passed in. Callers decide what "busy" means and where the time comes from: the extender
from the node watch and its own binds in flight (``extender.lockview``), the simulator from its
lock-window model (``sim.lockwindow``). Both call these functions, so they choose alike.

The margin is a fraction of the score scale ``api.MAX_SCORE``: 0.1 admits every node within
10 points of the best. Scores below 0 mark nodes the pod does not fit (the extender's ``UNFIT``);
they are never near the best. Margin 0, no busy node near the best, or every node near the best
busy: the scores come back unchanged (the same array), so the choice is exactly the policy's.
"""

from __future__ import annotations

import math

import numpy as np

from gpuslice.policy import api

LIFT = 10 * api.MAX_SCORE
"""Added to the free nodes near the best (``prefer_free``): more than any score range, so they lead."""


def band(margin: float) -> float:
    """The margin in score points: ``margin`` x ``api.MAX_SCORE``, float noise rounded off."""
    return round(margin * api.MAX_SCORE, 9)


def near_best(scores: np.ndarray, margin: float) -> np.ndarray:
    """Positions whose score is within the margin of the best (the best included), ascending.

    Empty when the margin is 0 or no node fits (every score below 0).
    """
    if not margin > 0 or not len(scores):
        return np.empty(0, np.intp)
    top = scores.max()
    if top < 0:
        return np.empty(0, np.intp)
    return np.flatnonzero(scores >= max(top - band(margin), 0))


def _split(scores: np.ndarray, locked: np.ndarray, margin: float) -> tuple[np.ndarray, np.ndarray] | None:
    """(free, busy) positions near the best, or None when the locks change nothing there."""
    near = near_best(scores, margin)
    if not len(near):
        return None
    busy = locked[near]
    if not busy.any() or busy.all():
        return None
    return near[~busy], near[busy]


def prefer_free(scores: np.ndarray, locked: np.ndarray, margin: float) -> np.ndarray:
    """Ordering keys: the free nodes near the best lifted above every other node.

    The best key is then the best-scoring free node within the margin; the callers' tie-breaks
    (lower node name, lower rank) apply among equal keys as among equal scores. The nodes near the
    best whose lock is busy keep their scores, and so stay ahead of the nodes outside the margin;
    outside it the locks are ignored. Unchanged (the same array) when the locks change nothing
    (module docstring).

    Args:
        scores: the policy's scores of the candidates (after its candidate step); below 0: unfit.
        locked: True where the candidate's node lock is busy (same length).
        margin: fraction of ``api.MAX_SCORE`` (0 = the policy's choice exactly).
    """
    split = _split(scores, locked, margin)
    if split is None:
        return scores
    out = scores.copy()
    out[split[0]] += LIFT
    return out


def demote_busy(scores: np.ndarray, locked: np.ndarray, margin: float) -> np.ndarray:
    """Scores with every busy node near the best lowered below every free node near the best.

    For a wire that carries the scores themselves (``node_choice: blend``): each busy node near
    the best loses the margin and one point more (rounded up), floored at 0, so a free node within
    the margin outscores it while the busy nodes keep their order. Unchanged (the same array) when
    the locks change nothing.
    """
    split = _split(scores, locked, margin)
    if split is None:
        return scores
    out = scores.copy()
    busy = split[1]
    out[busy] = np.maximum(out[busy] - (math.ceil(band(margin)) + 1), 0)
    return out
