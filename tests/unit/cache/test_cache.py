"""ClusterCache: the pod state machine, accounting, snapshots, orphans, quota usage, concurrency."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from gpuslice.cache import cache as cache_mod
from gpuslice.cache import shapes
from gpuslice.framework import nominations
from gpuslice.model import allocations, nodes, status
from gpuslice.model import config as model_config
from gpuslice.policy import api, quota
from tests.unit.builders import alloc, node, uuid

pytestmark = pytest.mark.unit

A = cache_mod.PodState.ASSUMED
D = cache_mod.PodState.ADDED
KEY = "ns/p"
ALLOC = alloc("n", ((uuid("n", 0), 1000, 10),))


IMMEDIATE = model_config.WorkloadSettings(min_count=1, drift=0.0)
"""Learned-workload settings that trust the first request and snapshot after every one."""


def fresh() -> cache_mod.ClusterCache:
    c = cache_mod.ClusterCache(shapes.ShapeHistogram(IMMEDIATE), nominator=nominations.Nominator())
    c.upsert_node(node("n").gpus(2, memory=10000).inventory())
    return c


Step = Callable[[cache_mod.ClusterCache], object]

TRANSITIONS: list[tuple[str, list[Step], cache_mod.PodState | None, int]] = [
    # (id, steps, final state, memory used on card 0)
    ("assume", [lambda c: c.assume(KEY, "u", ALLOC, 0.0)], A, 1000),
    ("assume-add", [lambda c: c.assume(KEY, "u", ALLOC, 0.0), lambda c: c.add_pod(KEY, "u", ALLOC)], D, 1000),
    ("add-without-assume", [lambda c: c.add_pod(KEY, "u", ALLOC)], D, 1000),
    ("assume-forget", [lambda c: c.assume(KEY, "u", ALLOC, 0.0), lambda c: c.forget(KEY)], None, 0),
    (
        # binding finished at t=10, ttl 30: at t=39 it stays, at t=40 it expires
        "expire",
        [
            lambda c: c.assume(KEY, "u", ALLOC, 0.0),
            lambda c: c.finish_binding(KEY, 10.0),
            lambda c: c.expire(39.0, 30.0),
            lambda c: c.expire(40.0, 30.0),
        ],
        None,
        0,
    ),
    (
        # never expires while binding has not finished
        "no-expire-while-binding",
        [lambda c: c.assume(KEY, "u", ALLOC, 0.0), lambda c: c.expire(1e9, 30.0)],
        A,
        1000,
    ),
    (
        # confirmed pods never expire
        "added-never-expires",
        [
            lambda c: c.assume(KEY, "u", ALLOC, 0.0),
            lambda c: c.finish_binding(KEY, 0.0),
            lambda c: c.add_pod(KEY, "u", ALLOC),
            lambda c: c.expire(1e9, 1.0),
        ],
        D,
        1000,
    ),
    ("forget-added-is-noop", [lambda c: c.add_pod(KEY, "u", ALLOC), lambda c: c.forget(KEY)], D, 1000),
    ("remove-added", [lambda c: c.add_pod(KEY, "u", ALLOC), lambda c: c.remove_pod(KEY)], None, 0),
    ("remove-assumed", [lambda c: c.assume(KEY, "u", ALLOC, 0.0), lambda c: c.remove_pod(KEY)], None, 0),
    (
        # the watch says the pod got other cards: 2000 on card 1 instead of 1000 on card 0
        "add-with-other-allocation",
        [
            lambda c: c.assume(KEY, "u", ALLOC, 0.0),
            lambda c: c.add_pod(KEY, "u", alloc("n", ((uuid("n", 1), 2000, 0),))),
        ],
        D,
        0,
    ),
    (
        # same name, new uid: the old pod is replaced, not added twice (1000, not 2000)
        "add-new-uid",
        [lambda c: c.add_pod(KEY, "u1", ALLOC), lambda c: c.add_pod(KEY, "u2", ALLOC)],
        D,
        1000,
    ),
]


@pytest.mark.parametrize(
    ("steps", "final", "mem0"), [t[1:] for t in TRANSITIONS], ids=[t[0] for t in TRANSITIONS]
)
def test_state_machine(steps: list[Step], final: cache_mod.PodState | None, mem0: int) -> None:
    c = fresh()
    for step in steps:
        step(c)
    assert c.pod_state(KEY) == final
    assert c.snapshot().nodes["n"].usage[0].memory_mib == mem0


def test_assume_twice_is_refused() -> None:
    c = fresh()
    assert c.assume(KEY, "u", ALLOC, 0.0).ok
    before = c.snapshot()
    again = c.assume(KEY, "u", ALLOC, 0.0)
    assert again == status.Status(status.Code.UNRESOLVABLE, (status.ALREADY_CACHED,))
    assert c.snapshot() is before  # nothing charged twice
    assert c.pod_state(KEY) is cache_mod.PodState.ASSUMED


def test_expire_returns_keys() -> None:
    c = fresh()
    c.assume("ns/a", "a", ALLOC, 0.0)
    c.assume("ns/b", "b", alloc("n", ((uuid("n", 1), 1, 0),)), 0.0)
    c.finish_binding("ns/a", 0.0)
    c.finish_binding("ns/b", 5.0)
    # ttl 10 at t=12: a (bound at 0) expired, b (bound at 5) not yet
    assert c.expire(12.0, 10.0) == ("ns/a",)


REJECTS = [
    # (id, allocation, expected status)
    (
        "unknown-node",
        alloc("x", ((uuid("x", 0), 1, 0),)),
        status.Status(status.Code.UNRESOLVABLE, (status.NODE_UNREGISTERED,)),
    ),
    (
        "unknown-uuid",
        alloc("n", (("GPU-nope", 1, 0),)),
        status.Status(status.Code.UNRESOLVABLE, (status.INVALID_REQUEST,)),
    ),
    # 10000 - 9500 used = 500 free < 1000
    (
        "memory",
        alloc("n", ((uuid("n", 0), 1000, 0),)),
        status.Status(status.Code.UNSCHEDULABLE, (status.INSUFFICIENT_GPU_MEMORY,)),
    ),
    (
        "exclusive",
        alloc("n", ((uuid("n", 0), 1, 100),)),
        status.Status(status.Code.UNSCHEDULABLE, (status.EXCLUSIVE_CONFLICT,)),
    ),
]


@pytest.mark.parametrize(("a", "expected"), [r[1:] for r in REJECTS], ids=[r[0] for r in REJECTS])
def test_assume_rejects_what_no_longer_fits(a: allocations.PodAllocation, expected: status.Status) -> None:
    c = fresh()
    c.add_pod("ns/other", "o", alloc("n", ((uuid("n", 0), 9500, 0),)))
    assert c.assume(KEY, "u", a, 0.0) == expected
    assert c.pod_state(KEY) is None


def test_assume_judges_exclusivity_per_grant() -> None:
    # a 0-core task holds card 0; a pod whose two containers take 50 cores each there is not
    # exclusive (no single grant asks 100 cores), so it joins; a 100-core grant would not
    c = fresh()
    c.add_pod("ns/other", "o", alloc("n", ((uuid("n", 0), 100, 0),)))
    two = alloc("n", ((uuid("n", 0), 100, 50),), ((uuid("n", 0), 100, 50),))
    assert c.assume(KEY, "u", two, 0.0).ok
    assert c.snapshot().nodes["n"].usage[0] == nodes.CardUsage(3, 300, 100)
    whole = alloc("n", ((uuid("n", 1), 100, 100),))
    assert c.assume("ns/w", "w", whole, 0.0).ok  # card 1 is idle
    again = alloc("n", ((uuid("n", 1), 1, 0),))
    assert c.assume("ns/x", "x", again, 0.0) == status.Status(
        status.Code.UNSCHEDULABLE, (status.EXCLUSIVE_CONFLICT,)
    )


def test_snapshot_rebuilds_only_changed_nodes_and_is_immutable() -> None:
    c = fresh()
    c.upsert_node(node("m").gpus(1).inventory())
    s1 = c.snapshot()
    assert c.snapshot() is s1  # nothing changed: the same snapshot
    c.add_pod(KEY, "u", ALLOC)
    s2 = c.snapshot()
    assert s2.generation > s1.generation
    assert s2.nodes["m"] is s1.nodes["m"]  # unchanged node: not rebuilt
    assert s2.nodes["n"] is not s1.nodes["n"]
    assert s1.nodes["n"].usage[0].memory_mib == 0  # the old snapshot is untouched
    assert s2.nodes["n"].usage[0].memory_mib == 1000
    assert s2.columns.card("used_mem")[s2.columns.row_of["n"], 0] == 1000
    assert s1.columns.card("used_mem")[s1.columns.row_of["n"], 0] == 0
    with pytest.raises(TypeError):
        s2.nodes["x"] = s2.nodes["n"]  # type: ignore[index]
    with pytest.raises(ValueError):
        s2.columns.card("used_mem")[0, 0] = 5
    assert c.node_generation("m") is not None
    assert c.node_generation("n") > c.node_generation("m")  # type: ignore[operator]


def test_workload_or_quota_change_shares_node_views() -> None:
    c = fresh()
    s1 = c.snapshot()
    c.observe_request(api.Shape(0, 500, 1))
    c.set_quota("ns", quota.QuotaView(count_limit=1))
    s2 = c.snapshot()
    assert s2.generation > s1.generation
    assert s2.nodes is s1.nodes
    assert s2.columns is s1.columns
    assert s2.workload is not None


def test_remove_node_keeps_pods_as_orphans_until_it_returns() -> None:
    c = fresh()
    c.add_pod(KEY, "u", ALLOC)
    c.remove_node("n")
    s = c.snapshot()
    assert "n" not in s.nodes
    assert [(o.node, o.uuid, o.pod) for o in s.orphans] == [("n", uuid("n", 0), KEY)]
    c.upsert_node(node("n").gpus(2, memory=10000).inventory())
    s = c.snapshot()
    assert s.orphans == ()
    assert s.nodes["n"].usage[0] == nodes.CardUsage(1, 1000, 10)


def test_pod_before_node_and_unknown_uuid_are_orphans() -> None:
    c = cache_mod.ClusterCache(nominator=nominations.Nominator())
    c.add_pod(KEY, "u", alloc("n", ((uuid("n", 0), 1000, 10), ("GPU-gone", 5, 0))))
    assert len(c.snapshot().orphans) == 2
    c.upsert_node(node("n").gpus(1, memory=10000).inventory())
    s = c.snapshot()
    assert [o.uuid for o in s.orphans] == ["GPU-gone"]
    assert s.nodes["n"].usage[0].memory_mib == 1000
    c.remove_pod(KEY)
    s = c.snapshot()
    assert s.orphans == ()
    assert s.nodes["n"].usage[0] == nodes.EMPTY_CARD


def test_inventory_change_recharges_pods() -> None:
    c = fresh()
    c.add_pod(KEY, "u", ALLOC)
    # card 0 moves to position 1 (new card in front): the pod's usage follows the UUID
    c.upsert_node(node("n").card(uuid_="GPU-new").card(uuid_=uuid("n", 0), memory=10000).inventory())
    s = c.snapshot()
    assert s.nodes["n"].usage == (nodes.EMPTY_CARD, nodes.CardUsage(1, 1000, 10))


def test_namespace_quota_usage() -> None:
    c = fresh()
    c.set_quota("ns", quota.QuotaView(memory_limit=5000))
    # two app containers on cards 0 and 1: count 2, memory 1000 + 2000, cores 10 + 0
    c.add_pod("ns/a", "a", alloc("n", ((uuid("n", 0), 1000, 10),), ((uuid("n", 1), 2000, 0),)))
    c.assume("ns/b", "b", alloc("n", ((uuid("n", 0), 500, 0),)), 0.0)
    c.add_pod("other/c", "c", ALLOC)
    s = c.snapshot()
    assert s.quota("ns") == quota.QuotaView(memory_limit=5000, used_count=3, used_memory=3500, used_cores=10)
    assert s.quota("other") is None
    c.forget("ns/b")
    got = c.snapshot().quota("ns")
    assert got is not None
    assert got.used_memory == 3000
    c.set_quota("ns", None)
    assert c.snapshot().quota("ns") is None


def test_workload_histogram_decays_and_normalises() -> None:
    c = cache_mod.ClusterCache(
        shapes.ShapeHistogram(model_config.WorkloadSettings(decay=0.5, min_count=1, drift=0.0)),
        nominator=nominations.Nominator(),
    )
    assert c.snapshot().workload is None
    small = api.Shape(0, 500, 1)
    whole = api.Shape(0, 1000, 1)
    c.observe_request(small)
    c.observe_request(whole)
    # small: 1 * 0.5 = 0.5, whole: 1 -> weights 1/3, 2/3
    w = c.snapshot().workload
    assert w is not None
    assert w.shapes == (small, whole)
    assert w.weights == pytest.approx((1 / 3, 2 / 3))


def test_histogram_is_bounded() -> None:
    h = shapes.ShapeHistogram(model_config.WorkloadSettings(decay=1.0, min_count=1), max_shapes=3)
    for k in range(10):
        h.observe(api.Shape(0, k, 1))
    w = h.workload()
    assert w is not None
    assert len(w.shapes) == 3


def test_concurrent_assumes_never_overlap() -> None:
    # one card of 10000 MiB with 10 slots; 40 threads try to assume 3000 MiB each: exactly 3 succeed
    c = cache_mod.ClusterCache(nominator=nominations.Nominator())
    c.upsert_node(node("n").gpus(1, memory=10000).inventory())
    barrier = threading.Barrier(40)
    results: list[bool] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        barrier.wait()
        ok = c.assume(f"ns/p{k}", str(k), alloc("n", ((uuid("n", 0), 3000, 0),)), 0.0).ok
        with lock:
            results.append(ok)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(results) == 3
    assert c.snapshot().nodes["n"].usage[0] == nodes.CardUsage(3, 9000, 0)


def test_pods_with_equal_grants_share_them_and_keep_equal_allocations() -> None:
    c = fresh()
    card = "".join(uuid("n", 0))  # a fresh string, equal to the inventory's UUID
    a = alloc("n", ((card, 1000, 10),))
    b = alloc("n", (("".join(card), 1000, 10),))
    c.add_pod("".join("ns/a"), "ua", a)
    c.assume("ns/b", "ub", b, 0.0)
    got_a, got_b = c.pod_allocation("ns/a"), c.pod_allocation("ns/b")
    assert got_a == a and got_b == b
    assert got_a is not None and got_b is not None
    assert got_a.containers[0][0] is got_b.containers[0][0]
    usage = c.snapshot().nodes["n"].usage[0]
    assert (usage.slots, usage.memory_mib, usage.cores) == (2, 2000, 20)
    c.add_pod("ns/b", "ub", b)  # confirms the assumed pod: equal allocation, nothing recharged
    assert c.pod_state("ns/b") is D and c.snapshot().nodes["n"].usage[0] == usage
    c.remove_pod("ns/a")
    c.remove_pod("ns/b")
    assert c.snapshot().nodes["n"].usage[0] == nodes.EMPTY_CARD


@pytest.mark.parametrize(
    "containers,init_count",
    [
        ((((uuid("n", 0), 1000, 10),),), 0),  # the one-card fast path
        ((((uuid("n", 0), 0, 0),),), 0),
        ((((uuid("n", 0), 1000, 10), (uuid("n", 1), 2000, 0)),), 0),
        ((((uuid("n", 0), 1000, 10),), ((uuid("n", 0), 500, 5),)), 0),
        ((((uuid("n", 0), 3000, 10),), ((uuid("n", 0), 1000, 10),)), 1),
    ],
)
def test_reservations_are_card_reservation_sorted(
    containers: tuple[tuple[tuple[str, int, int], ...], ...], init_count: int
) -> None:
    c = fresh()
    a = alloc("n", *containers, init_count=init_count)
    for done in (False, True):
        want = tuple(sorted(allocations.card_reservation(a, done).items()))
        assert c._reservation(a, done) == want


def test_snapshot_counts_cards_per_model_and_follows_inventory_changes() -> None:
    c = cache_mod.ClusterCache(nominator=nominations.Nominator())
    c.upsert_node(node("a").gpus(4, model="T4").inventory())
    c.upsert_node(node("b").gpus(8, model="G2").inventory())
    assert c.snapshot().capacity == (("G2", 8), ("T4", 4))
    # a node whose cards change model moves its count; a removed node takes its cards away
    c.upsert_node(node("a").gpus(2, model="G2").inventory())
    assert c.snapshot().capacity == (("G2", 10),)
    c.remove_node("b")
    assert c.snapshot().capacity == (("G2", 2),)
    c.remove_node("a")
    assert c.snapshot().capacity == ()
