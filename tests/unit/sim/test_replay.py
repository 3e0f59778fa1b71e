"""Replay with departures: waits, never-ran pods, the window's time averages, against hand arithmetic."""

from __future__ import annotations

import dataclasses
import heapq
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.cache import shapes
from gpuslice.framework import registry
from gpuslice.model import config as model_config
from gpuslice.model import nodes
from gpuslice.policy import api, paper
from gpuslice.sim import cluster, engine, loadscale, replay, trace

pytestmark = pytest.mark.unit

ONE_CARD = [trace.node_inventory("n0", 16000, 65536, 1, "T4")]


def schedule(rows: list[tuple[int, float, float]], window: tuple[float, float]) -> loadscale.Schedule:
    """A hand-made schedule from (pod index, arrival, duration) rows."""
    return loadscale.Schedule(
        pod=np.array([r[0] for r in rows], np.int64),
        arrival=np.array([r[1] for r in rows], float),
        duration=np.array([r[2] for r in rows], float),
        window=window,
    )


PODS = [
    trace.make_pod("a", 1000, 0, 1, 1000),  # 0: a whole card
    trace.make_pod("b", 1000, 0, 1, 1000),  # 1: a whole card
    trace.make_pod("c", 1000, 0, 1, 500),  # 2: half a card
    trace.make_pod("d", 1000, 0, 0, 0),  # 3: CPU only
    trace.make_pod("e", 1000, 0, 1, 1000),  # 4: a whole card
    trace.make_pod("big", 1000, 0, 2, 1000),  # 5: two cards: never fits one card
]


def test_hand_computed_waits_and_time_averages() -> None:
    rows = [
        (0, 0.0, 10.0),  # a runs 0..10 (arrives before the window: not counted)
        (1, 4.0, 5.0),  # b waits 4..10 (a leaves), runs 10..15
        (2, 8.0, 22.0),  # c waits 8..15 (b leaves), runs 15..37
        (3, 20.0, 1.0),  # d (CPU only) starts at once
        (4, 16.0, 5.0),  # e waits from 16; c holds half the card until 37: still waiting at 30
    ]
    rows.sort(key=lambda r: r[1])
    r = replay.run(ONE_CARD, PODS, schedule(rows, (2.0, 30.0)), paper.BestFit(), api.EMPTY_CONTEXT, samples=4)
    # window [2, 30) = 28 s on 1000 milli: 1000 in use over [2, 15), 500 over [15, 30)
    # allocated = (13 * 1000 + 15 * 500) / (28 * 1000) = 20500 / 28000 = 73.214 % -> unallocated 26.786 %
    assert r.unallocated_pct == pytest.approx(100 * (1 - 20500 / 28000))
    # someone waits over [4, 15) and [16, 30): 11 + 14 = 25 s of 28
    assert r.queued_time_pct == pytest.approx(100 * 25 / 28)
    # idle while someone waits: 0 over [4, 15) (the card is full), 500 over [16, 30) -> 7000 / 28000 = 25 %
    assert r.stranded_pct == pytest.approx(25.0)
    # waiting demand: b 1000 over [4, 8), b + c 1500 over [8, 10), c 500 over [10, 15), e 1000 over [16, 30)
    # = 4000 + 3000 + 2500 + 14000 = 23500 -> 23500 / 28000
    assert r.queued_demand_pct == pytest.approx(100 * 23500 / 28000)
    # counted: b, c, d, e; waits of those that ran: b 6, c 7, d 0 -> mean 13 / 3; p99 = ceil(2.97) = 3rd = 7
    assert (r.arrived, r.waited, r.rejected, r.still_queued, r.never_ran) == (4, 2, 0, 1, 1)
    assert r.mean_wait == pytest.approx(13 / 3) and r.p99_wait == 7.0 and r.max_wait == 7.0
    assert r.peak_allocation_pct == pytest.approx(100.0)
    # samples at 0, 10, 20, 30 after that instant's events: a; b (a left at 10); c + d; c
    assert r.sample_times.tolist() == [0.0, 10.0, 20.0, 30.0]
    assert r.sample_alloc.tolist() == [100.0, 100.0, 50.0, 50.0]
    assert r.never_ran_shapes == {(1000, 1000, 1, ()): 1}


def test_departure_before_arrival_at_the_same_instant() -> None:
    rows = [(0, 0.0, 10.0), (1, 10.0, 5.0)]  # a leaves at 10 as b arrives: b starts at once
    r = replay.run(ONE_CARD, PODS, schedule(rows, (0.0, 20.0)), paper.BestFit(), api.EMPTY_CONTEXT)
    assert (r.arrived, r.waited, r.never_ran) == (2, 0, 0)
    # 1000 in use over [0, 15) of [0, 20): 75 % allocated
    assert r.unallocated_pct == pytest.approx(25.0) and r.queued_time_pct == 0.0


def test_full_queue_rejects_and_never_fitting_pod_waits_to_the_end() -> None:
    rows = [(0, 0.0, 10.0), (5, 1.0, 5.0), (1, 2.0, 5.0)]  # big queues; b finds the queue (limit 1) full
    r = replay.run(
        ONE_CARD, PODS, schedule(rows, (0.0, 20.0)), paper.BestFit(), api.EMPTY_CONTEXT, queue_limit=1
    )
    assert (r.arrived, r.rejected, r.still_queued, r.never_ran, r.waited) == (3, 1, 1, 2, 0)
    # a ran 0..10 -> 50 % allocated; big waited over [1, 20) -> 95 % of the time, 100 % idle after 10
    assert r.unallocated_pct == pytest.approx(50.0)
    assert r.queued_time_pct == pytest.approx(95.0)
    # stranded: 0 over [1, 10) (card full), 1000 over [10, 20) -> 10000 / 20000
    assert r.stranded_pct == pytest.approx(50.0)


def test_warmup_pods_are_not_counted() -> None:
    # a runs 0..10; b waits 1..10 (arrived in the warm-up: not counted), runs 10..15;
    # c (half a card) arrives at 12 while b holds the card: waits 12..15, runs 15..16
    rows = [(0, 0.0, 10.0), (1, 1.0, 5.0), (2, 12.0, 1.0)]
    r = replay.run(ONE_CARD, PODS, schedule(rows, (5.0, 20.0)), paper.BestFit(), api.EMPTY_CONTEXT)
    assert (r.arrived, r.waited, r.mean_wait, r.p99_wait) == (1, 1, 3.0, 3.0)
    # window [5, 20) = 15 s: 1000 over [5, 15), 500 over [15, 16) -> 10500 / 15000 = 70 % allocated
    assert r.unallocated_pct == pytest.approx(30.0)
    # waiting over [5, 10) (b) and [12, 15) (c): 8 of 15 s
    assert r.queued_time_pct == pytest.approx(100 * 8 / 15)


def test_time_zero_population_is_never_counted() -> None:
    # the first entry is the steady-state population (initial = 1): not counted even in a window from 0
    rows = [(0, 0.0, 10.0), (1, 0.0, 5.0)]  # b arrives at 0 too, waits 0..10
    sched = dataclasses.replace(schedule(rows, (0.0, 20.0)), initial=1)
    r = replay.run(ONE_CARD, PODS, sched, paper.BestFit(), api.EMPTY_CONTEXT)
    assert (r.arrived, r.waited, r.waits.tolist()) == (1, 1, [10.0])


def test_online_workload_observes_each_arrival_once() -> None:
    # a (1 card) runs 0..10; b and e wait for the card and are retried at 10 (b starts) and at 15 (e);
    # d is CPU only (observed once, as the extender's pod feed does): 4 arrivals, each observed once
    # however often it is retried
    rows = [(0, 0.0, 10.0), (1, 1.0, 5.0), (4, 2.0, 5.0), (3, 3.0, 1.0)]
    hist = shapes.ShapeHistogram(model_config.WorkloadSettings(min_count=1, fallback="bestfit"))
    ctx = api.Context(workload=None)
    r = replay.run(ONE_CARD, PODS, schedule(rows, (0.0, 30.0)), paper.BestFit(), ctx, hist)
    assert hist.count == 4
    assert (r.arrived, r.waited, r.never_ran) == (4, 2, 0)
    assert r.waits.tolist() == [0.0, 9.0, 13.0, 0.0]  # b 1..10, e 2..15


def test_host_less_arrival_is_observed_at_its_first_attempt_with_a_host() -> None:
    # "hog" takes all host CPU 0..10; "b" arrives at 1 with no node left for its CPU (the extender is not
    # asked), and is observed when it is retried at 10; a GPU pod only once, so count = 2 (hog, b)
    pods = [trace.make_pod("hog", 16000, 0, 1, 500), trace.make_pod("b", 1000, 0, 1, 500)]
    hist = shapes.ShapeHistogram(model_config.WorkloadSettings(min_count=1, fallback="bestfit"))
    rows = [(0, 0.0, 10.0), (1, 1.0, 5.0)]
    r = replay.run(ONE_CARD, pods, schedule(rows, (0.0, 30.0)), paper.BestFit(), api.Context(), hist)
    assert hist.count == 2 and r.waits.tolist() == [0.0, 9.0]


def test_nearest_rank() -> None:
    assert replay.nearest_rank(np.arange(1.0, 101.0), 0.99) == 99.0  # ceil(99.0) = 99th of 1..100
    assert replay.nearest_rank(np.arange(1.0, 201.0), 0.99) == 198.0  # ceil(198.0) = 198th
    assert replay.nearest_rank(np.array([0.0, 0.0, 7.0]), 0.99) == 7.0  # ceil(2.97) = 3rd
    assert replay.nearest_rank(np.array([5.0]), 0.99) == 5.0 and replay.nearest_rank(np.zeros(0), 0.99) == 0.0


def _naive(
    inventories: list[nodes.NodeInventory],
    pods: list[trace.TracePod],
    sched: loadscale.Schedule,
    policy: api.Policy,
    limit: int,
) -> list[float]:
    """Start times (NaN: never) when every waiting pod is retried, in order, after every departure.

    Departures at the same instant go in start order, as in ``replay.run``.
    """
    live = cluster.Cluster(inventories)
    placer = engine.Placer(live, policy, api.EMPTY_CONTEXT)
    started = [float("nan")] * len(sched.pod)
    waiting: list[int] = []
    deps: list[tuple[float, int, int, int, object]] = []
    ticks = itertools.count()

    def start(k: int, now: float) -> bool:
        got = placer.place(pods[int(sched.pod[k])])
        if got is None:
            return False
        started[k] = now
        heapq.heappush(deps, (now + float(sched.duration[k]), next(ticks), k, *got))
        return True

    def depart(t: float) -> None:
        while deps and deps[0][0] <= t:
            when, _, k, j, alloc = heapq.heappop(deps)
            placer.remove(j, pods[int(sched.pod[k])], alloc)  # type: ignore[arg-type]
            for q in list(waiting):
                if len(live.feasible(pods[int(sched.pod[q])])) and start(q, when):
                    waiting.remove(q)

    for k in range(len(sched.pod)):
        now = float(sched.arrival[k])
        depart(now)
        if not start(k, now) and len(waiting) < limit:
            waiting.append(k)
    depart(sched.window[1])
    return started


SHAPES = [
    trace.make_pod("w1", 4000, 0, 1, 1000),
    trace.make_pod("w2", 8000, 0, 2, 1000),
    trace.make_pod("s2", 2000, 0, 1, 200),
    trace.make_pod("s3", 2000, 0, 1, 300),
    trace.make_pod("s5", 2000, 0, 1, 500),
    trace.make_pod("t4", 2000, 0, 1, 700, "T4"),
    trace.make_pod("cpu", 30000, 0, 0, 0),
]
NODES = [
    trace.node_inventory("g0", 32000, 262144, 2, "G2"),
    trace.node_inventory("t0", 32000, 262144, 4, "T4"),
    trace.node_inventory("t1", 16000, 262144, 1, "T4"),
]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, len(SHAPES) - 1), st.integers(0, 40), st.sampled_from((0.0, 1.0, 3.0, 7.0, 20.0))
        ),
        min_size=20,
        max_size=60,
    ),
    limit=st.sampled_from((1, 3, 1000)),
    policy=st.sampled_from(("bestfit", "fgd", "dotprod")),
)
def test_retrying_node_j_only_equals_retrying_everyone(
    rows: list[tuple[int, int, float]], limit: int, policy: str
) -> None:
    timed = sorted(((k, float(t), d) for k, t, d in rows), key=lambda r: r[1])
    sched = schedule(timed, (5.0, 45.0))
    pol = registry.get(policy)
    r = replay.run(NODES, SHAPES, sched, pol, api.EMPTY_CONTEXT, queue_limit=limit)
    ref = np.array(_naive(NODES, SHAPES, sched, registry.get(policy), limit))
    counted = (sched.arrival >= 5.0) & (sched.arrival < 45.0)
    ran = counted & ~np.isnan(ref)
    waits = ref[ran] - sched.arrival[ran]
    assert r.arrived == int(counted.sum())
    assert r.waits.tolist() == waits.tolist()
    assert r.waited == int((waits > 0).sum())
    assert r.arrived == int(ran.sum()) + r.never_ran
    assert 0.0 <= r.stranded_pct <= r.unallocated_pct + 1e-9 <= 100.0 + 1e-9
    assert 0.0 <= r.queued_time_pct <= 100.0
