"""The simulator's lock-window model (``sim.lockwindow``) and the lock-aware choice in ``engine``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuslice.framework import registry
from gpuslice.model import nodes
from gpuslice.policy import api, lockchoice
from gpuslice.sim import engine, lockwindow, trace, workload
from tests.unit.sim.test_engine import _tiny

pytestmark = pytest.mark.unit

WINDOW = lockwindow.WINDOW_S  # 2 s
GAP = lockwindow.GAP_S  # 0.02 s


def _nodes(n: int = 4) -> list[nodes.NodeInventory]:
    return [trace.node_inventory(f"n{i}", 64000, 262144, 8, "G2") for i in range(n)]


def _whole(n: int) -> list[trace.TracePod]:
    return [trace.make_pod(f"p{k}", 1000, 1024, 1, 1000) for k in range(n)]


def test_arrivals_come_in_bursts() -> None:
    model = lockwindow.LockModel(burst=3, gap_s=0.5, period_s=10.0)
    # pods 0-2: 0, 0.5, 1.0; pods 3-5: 10, 10.5, 11.0; pod 6: 20
    assert [model.arrival(k) for k in range(7)] == [0.0, 0.5, 1.0, 10.0, 10.5, 11.0, 20.0]


@pytest.mark.parametrize(
    ("model", "problem"),
    [
        (lockwindow.LockModel(margin=1.5), "margin"),
        (lockwindow.LockModel(margin=math.nan), "margin"),
        (lockwindow.LockModel(window_s=0.0), "window"),
        (lockwindow.LockModel(burst=0), "burst"),
        (lockwindow.LockModel(gap_s=-1.0), "gap"),
        (lockwindow.LockModel(burst=40, gap_s=1.0, period_s=30.0), "period"),
    ],
    ids=["margin-above-1", "margin-nan", "window-0", "burst-0", "gap-negative", "bursts-overlap"],
)
def test_invalid_models_are_refused(model: lockwindow.LockModel, problem: str) -> None:
    assert any(problem in p for p in model.problems())
    with pytest.raises(ValueError, match=problem):
        lockwindow.NodeLocks(2, model)
    assert lockwindow.LockModel().problems() == []


def test_a_busy_lock_queues_the_next_placement_fifo() -> None:
    locks = lockwindow.NodeLocks(2, lockwindow.LockModel(burst=10, gap_s=0.5, period_s=60.0))
    locks.arrive(0)  # t = 0
    assert locks.take(0, moved=False) == 0.0  # free: held until 2.0
    locks.arrive(1)  # t = 0.5
    assert locks.locked(np.array([0, 1])).tolist() == [True, False]
    assert locks.take(0, moved=False) == 1.5  # queued behind the first: gets it at 2.0, until 4.0
    locks.arrive(2)  # t = 1.0
    assert locks.take(1, moved=True) == 0.0  # the other node is free
    locks.arrive(10)  # t = 60: a new burst; every lock is free again
    assert not locks.locked(np.array([0, 1])).any()
    locks.finish()
    s = locks.stats
    assert (s.placements, s.moved, s.waited) == (3, 1, 1)
    assert s.wait_s == 1.5 and s.max_wait_s == 1.5
    # one burst with placements, from 0 to the last release at 4.0 (the second burst placed nothing)
    assert (s.bursts, s.burst_s, s.max_burst_s) == (1, 4.0, 4.0)


def test_choose_is_the_plain_argmax_at_margin_0_and_lock_aware_above() -> None:
    cand = np.array([3, 5, 7])
    scores = np.array([90, 88, 70], np.int64)
    plain = lockwindow.NodeLocks(8, lockwindow.LockModel(margin=0.0))
    plain.free_at[3] = 5.0  # node 3 (the best) is busy
    assert plain.choose(scores, cand) == (0, False)
    aware = lockwindow.NodeLocks(8, lockwindow.LockModel(margin=0.05))
    aware.free_at[3] = 5.0
    assert aware.choose(scores, cand) == (1, True)  # 88 is within 5 points and node 5 is free
    aware.free_at[5] = 5.0
    assert aware.choose(scores, cand) == (0, False)  # every node in the band busy: the best


def test_burst_on_binpack_serialises_at_margin_0() -> None:
    # Binpack puts four whole-card pods on n0 (2/8 used after the first scores 25, an empty node
    # 13). Arrivals 0, 0.02, 0.04, 0.06; each waits for the one before: locks from 0, 2, 4, 6.
    out = engine.run(
        _nodes(),
        _whole(4),
        np.arange(4),
        registry.get("binpack"),
        api.EMPTY_CONTEXT,
        lock=lockwindow.LockModel(margin=0.0),
    )
    assert out.locks is not None
    s = out.locks
    assert (s.placements, s.moved, s.waited) == (4, 0, 3)
    assert s.wait_s == pytest.approx((2 - GAP) + (4 - 2 * GAP) + (6 - 3 * GAP))
    assert s.burst_s == pytest.approx(4 * WINDOW)
    assert out.used.tolist() == [1000, 2000, 3000, 4000]


def test_burst_on_binpack_spreads_when_the_margin_reaches_the_free_nodes() -> None:
    # 25 vs 13: a margin of 0.12 (12 points) reaches the empty nodes, so each pod takes a free lock;
    # 0.1 (10 points) does not, and the pods queue on n0 as at margin 0.
    spread = engine.run(
        _nodes(),
        _whole(4),
        np.arange(4),
        registry.get("binpack"),
        api.EMPTY_CONTEXT,
        lock=lockwindow.LockModel(margin=0.12),
    )
    assert spread.locks is not None
    assert (spread.locks.moved, spread.locks.waited) == (3, 0)
    assert spread.locks.burst_s == pytest.approx(3 * GAP + WINDOW)
    narrow = engine.run(
        _nodes(),
        _whole(4),
        np.arange(4),
        registry.get("binpack"),
        api.EMPTY_CONTEXT,
        lock=lockwindow.LockModel(margin=0.1),
    )
    assert narrow.locks is not None
    assert (narrow.locks.moved, narrow.locks.waited) == (0, 3)


def test_pods_without_gpus_take_no_lock() -> None:
    pods = [trace.make_pod("cpu", 1000, 1024, 0, 0), *_whole(1)]
    out = engine.run(
        _nodes(2),
        pods,
        np.arange(2),
        registry.get("binpack"),
        api.EMPTY_CONTEXT,
        lock=lockwindow.LockModel(),
    )
    assert out.locks is not None and out.locks.placements == 1


@pytest.mark.parametrize("name", ["binpack", "spread", "bestfit", "fgd-lookahead"])
@pytest.mark.parametrize("seed", [1, 2])
def test_margin_0_places_exactly_as_without_locks(name: str, seed: int) -> None:
    inventories, pods = _tiny(seed)
    ctx = api.Context(workload=workload.target_workload(pods))
    seq = np.arange(len(pods))
    plain = engine.run(inventories, pods, seq, registry.get(name), ctx)
    locked = engine.run(
        inventories, pods, seq, registry.get(name), ctx, lock=lockwindow.LockModel(margin=0.0, burst=8)
    )
    assert locked.used.tolist() == plain.used.tolist() and locked.failed == plain.failed
    assert locked.locks is not None and locked.locks.moved == 0 and locked.locks.waited > 0
    moved = engine.run(
        inventories, pods, seq, registry.get(name), ctx, lock=lockwindow.LockModel(margin=1.0, burst=8)
    )
    assert moved.locks is not None and moved.locks.moved > 0  # the model can move pods at all


def test_the_simulator_chooses_through_the_extenders_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    # The engine's choice goes through policy.lockchoice.prefer_free, the function the extender's
    # filter and prioritize call (extender.scheduling.lock_aware).
    calls: list[float] = []
    real = lockchoice.prefer_free

    def spy(scores: np.ndarray, locked: np.ndarray, margin: float) -> np.ndarray:
        calls.append(margin)
        return real(scores, locked, margin)

    monkeypatch.setattr(lockchoice, "prefer_free", spy)
    engine.run(
        _nodes(),
        _whole(3),
        np.arange(3),
        registry.get("binpack"),
        api.EMPTY_CONTEXT,
        lock=lockwindow.LockModel(margin=0.3),
    )
    assert calls == [0.3, 0.3, 0.3]
