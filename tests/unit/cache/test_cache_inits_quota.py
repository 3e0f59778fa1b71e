"""ClusterCache: init-container release on add_pod (flip recharges) and the quota check in assume."""

from __future__ import annotations

import threading

import pytest

from gpuslice.cache import cache as cache_mod
from gpuslice.framework import nominations
from gpuslice.model import nodes, status
from gpuslice.policy import quota
from tests.unit.builders import alloc, node, uuid

pytestmark = pytest.mark.unit

KEY = "ns/p"
A, B = uuid("n", 0), uuid("n", 1)
# init container: 5000 MiB / 0 cores on A and 2000 MiB / 30 cores on B; app: 1500 MiB / 10 cores on A
INIT = alloc("n", ((A, 5000, 0), (B, 2000, 30)), ((A, 1500, 10),), init_count=1)
FULL = (nodes.CardUsage(1, 5000, 10), nodes.CardUsage(1, 2000, 30))
APP = (nodes.CardUsage(1, 1500, 10), nodes.EMPTY_CARD)
QUOTA_EXCEEDED = status.Status(status.Code.UNSCHEDULABLE, (status.QUOTA_EXCEEDED,))


def fresh(limits: quota.QuotaView | None = None) -> cache_mod.ClusterCache:
    c = cache_mod.ClusterCache(nominator=nominations.Nominator())
    c.upsert_node(node("n").gpus(2, memory=10000).inventory())
    c.upsert_node(node("m").gpus(1, memory=10000).inventory())
    if limits is not None:
        c.set_quota("ns", limits)
    return c


def usage(c: cache_mod.ClusterCache) -> tuple[nodes.CardUsage, ...]:
    return c.snapshot().nodes["n"].usage


def ns_used(c: cache_mod.ClusterCache) -> tuple[int, int, int]:
    q = c.snapshot().quota("ns")
    assert q is not None
    return q.used_count, q.used_memory, q.used_cores


def test_added_with_inits_done_charges_the_app_only() -> None:
    c = fresh(quota.QuotaView(memory_limit=10**6))
    c.add_pod(KEY, "u", INIT, inits_done=True)
    assert usage(c) == APP
    assert ns_used(c) == (1, 1500, 10)


def test_flip_recharges_both_ways_and_rebuilds_only_the_node() -> None:
    c = fresh(quota.QuotaView(memory_limit=10**6))
    c.add_pod(KEY, "u", INIT)
    s1 = c.snapshot()
    assert s1.nodes["n"].usage == FULL
    assert ns_used(c) == (2, 7000, 40)
    gen = c.node_generation("n")

    c.add_pod(KEY, "u", INIT, inits_done=True)  # kubelet: the init container exited 0
    s2 = c.snapshot()
    assert s2.generation > s1.generation and c.node_generation("n") > gen  # type: ignore[operator]
    assert s2.nodes["n"].usage == APP
    assert s2.nodes["m"] is s1.nodes["m"]  # the other node is not rebuilt
    assert s1.nodes["n"].usage == FULL  # the old snapshot is untouched
    assert ns_used(c) == (1, 1500, 10)
    assert c.pod_state(KEY) is cache_mod.PodState.ADDED

    s3 = c.snapshot()
    c.add_pod(KEY, "u", INIT, inits_done=True)  # the same event again: nothing changes
    assert c.snapshot() is s3

    c.add_pod(KEY, "u", INIT, inits_done=False)  # kubelet re-runs the init container: grows back
    assert usage(c) == FULL
    assert ns_used(c) == (2, 7000, 40)
    c.remove_pod(KEY)
    assert usage(c) == (nodes.EMPTY_CARD, nodes.EMPTY_CARD)
    assert c.snapshot().quota("ns") == quota.QuotaView(memory_limit=10**6)


def test_assumed_pod_confirmed_with_inits_done_shrinks() -> None:
    c = fresh()
    assert c.assume(KEY, "u", INIT, 0.0).ok
    assert usage(c) == FULL
    c.finish_binding(KEY, 0.0)
    c.add_pod(KEY, "u", INIT, inits_done=True)
    assert c.pod_state(KEY) is cache_mod.PodState.ADDED
    assert usage(c) == APP
    assert c.expire(1e9, 1.0) == ()  # confirmed: never expires


def test_flip_keeps_orphans_in_step() -> None:
    # the init container's card B is unknown to the node: an orphan until the release drops it
    c = cache_mod.ClusterCache(nominator=nominations.Nominator())
    c.upsert_node(node("n").gpus(1, memory=10000).inventory())
    c.add_pod(KEY, "u", INIT)
    assert [o.uuid for o in c.snapshot().orphans] == [B]
    c.add_pod(KEY, "u", INIT, inits_done=True)
    s = c.snapshot()
    assert s.orphans == ()
    assert s.nodes["n"].usage == (nodes.CardUsage(1, 1500, 10),)
    c.remove_node("n")
    assert [o.uuid for o in c.snapshot().orphans] == [A]
    c.add_pod(KEY, "u", INIT, inits_done=False)  # node gone: both cards are orphans again
    assert sorted(o.uuid for o in c.snapshot().orphans) == [A, B]
    c.upsert_node(node("n").gpus(1, memory=10000).inventory())
    s = c.snapshot()
    assert [o.uuid for o in s.orphans] == [B]
    assert s.nodes["n"].usage == (nodes.CardUsage(1, 5000, 10),)


QUOTA_CASES = [
    # (id, limits, already charged in ns (memory on A), pod memory on B, admitted)
    # memory: 3000 used + 2000 = 5000 <= 5000 admitted; + 2001 refused
    ("memory-at-limit", quota.QuotaView(memory_limit=5000), 3000, 2000, True),
    ("memory-over", quota.QuotaView(memory_limit=5000), 3000, 2001, False),
    # count: slots summed over cards, 1 used + 1 = 2
    ("count-at-limit", quota.QuotaView(count_limit=2), 100, 100, True),
    ("count-over", quota.QuotaView(count_limit=1), 100, 100, False),
    ("unlimited", None, 9000, 9000, True),
]


@pytest.mark.parametrize(
    ("limits", "used", "mem", "ok"), [q[1:] for q in QUOTA_CASES], ids=[q[0] for q in QUOTA_CASES]
)
def test_assume_checks_the_namespace_quota(
    limits: quota.QuotaView | None, used: int, mem: int, ok: bool
) -> None:
    c = fresh(limits)
    c.add_pod("ns/other", "o", alloc("n", ((A, used, 0),)))
    got = c.assume(KEY, "u", alloc("n", ((B, mem, 0),)), 0.0)
    assert got == (status.SUCCESS if ok else QUOTA_EXCEEDED)
    assert c.pod_state(KEY) is (cache_mod.PodState.ASSUMED if ok else None)
    # another namespace is never limited by this one's quota
    assert c.assume("other/p", "u2", alloc("m", ((uuid("m", 0), mem, 0),)), 0.0).ok


def test_assume_charges_the_init_peak_against_the_quota() -> None:
    # full charge 7000 MiB; the app-only charge (1500) would fit 5000, but a pod being bound has not run
    c = fresh(quota.QuotaView(memory_limit=5000))
    assert c.assume(KEY, "u", INIT, 0.0) == QUOTA_EXCEEDED
    assert c.snapshot().quota("ns") == quota.QuotaView(memory_limit=5000)


def test_cores_quota_counts_every_card() -> None:
    c = fresh(quota.QuotaView(cores_limit=39))
    assert c.assume(KEY, "u", INIT, 0.0) == QUOTA_EXCEEDED  # 10 + 30 = 40 cores
    c.set_quota("ns", quota.QuotaView(cores_limit=40))
    assert c.assume(KEY, "u", INIT, 0.0).ok


def test_released_init_peak_frees_quota_for_the_next_assume() -> None:
    c = fresh(quota.QuotaView(memory_limit=8000))
    c.add_pod(KEY, "u", INIT)  # 7000 charged
    nxt = alloc("n", ((B, 2000, 0),))
    assert c.assume("ns/q", "q", nxt, 0.0) == QUOTA_EXCEEDED
    c.add_pod(KEY, "u", INIT, inits_done=True)  # 1500 charged
    assert c.assume("ns/q", "q", nxt, 0.0).ok
    assert ns_used(c) == (2, 3500, 10)


def test_add_pod_never_refuses() -> None:
    # over the quota and over the card: the watch reports what the cluster holds, and it is charged
    c = fresh(quota.QuotaView(memory_limit=1000, count_limit=1))
    c.add_pod("ns/a", "a", alloc("n", ((A, 9000, 0),)))
    c.add_pod("ns/b", "b", alloc("n", ((A, 9000, 100),)))
    assert usage(c)[0] == nodes.CardUsage(2, 18000, 100)
    assert ns_used(c) == (2, 18000, 100)
    assert c.pod_state("ns/b") is cache_mod.PodState.ADDED
    # and the namespace, now past its limits, admits nothing more
    assert c.assume(KEY, "u", alloc("n", ((B, 1, 0),)), 0.0) == QUOTA_EXCEEDED


def test_concurrent_assumes_never_overrun_the_quota() -> None:
    # ample cards (2 x 10000 MiB, 10 slots each); quota 9000 MiB; 40 threads assume 2000 MiB: exactly 4 win
    c = cache_mod.ClusterCache(nominator=nominations.Nominator())
    c.upsert_node(node("n").gpus(2, memory=10000).inventory())
    c.set_quota("ns", quota.QuotaView(memory_limit=9000))
    barrier = threading.Barrier(40)
    results: list[bool] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        barrier.wait()
        ok = c.assume(f"ns/p{k}", str(k), alloc("n", ((uuid("n", k % 2), 2000, 0),)), 0.0).ok
        with lock:
            results.append(ok)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(results) == 4
    assert ns_used(c) == (4, 8000, 0)
