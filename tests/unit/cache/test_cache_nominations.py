"""ClusterCache with a Nominator: cards held for a preemptor while its victims leave (docs/preemption.md)."""

from __future__ import annotations

import pytest

from gpuslice.cache import cache as cache_mod
from gpuslice.framework import nominations
from gpuslice.model import status
from tests.unit.builders import alloc, node, uuid

pytestmark = pytest.mark.unit

HP = "ns/hp"
VICTIM = alloc("n", ((uuid("n", 0), 30000, 50),))
WHOLE0 = alloc("n", ((uuid("n", 0), 80000, 100),))
OTHER0 = alloc("n", ((uuid("n", 0), 10000, 10),))


def fresh() -> cache_mod.ClusterCache:
    c = cache_mod.ClusterCache(nominator=nominations.Nominator())
    c.upsert_node(node("n").gpus(2, memory=80000).inventory())
    return c


def noms(c: cache_mod.ClusterCache) -> nominations.Nominator:
    """The cache's nominator (the framework's, given to it in ``fresh``)."""
    assert isinstance(c.nominator, nominations.Nominator)
    return c.nominator


def used0(c: cache_mod.ClusterCache, snap: object | None = None) -> int:
    s = c.snapshot() if snap is None else snap
    assert isinstance(s, type(c.snapshot()))
    return s.nodes["n"].usage[0].memory_mib


def nominated() -> cache_mod.ClusterCache:
    """Card 0 nominated for ``hp``; its victim already gone."""
    c = fresh()
    assert c.nominate(HP, "u-hp", WHOLE0, expires_at=100.0)
    return c


def test_a_nomination_counts_as_taken_for_everyone_but_its_preemptor() -> None:
    c = nominated()
    assert used0(c) == 80000
    assert used0(c, c.snapshot_for(HP)) == 0  # the preemptor's own view
    assert used0(c, c.snapshot_for("ns/other")) == 80000
    verdict = c.assume("ns/other", "u-o", OTHER0, 0.0)
    assert verdict.code is status.Code.UNSCHEDULABLE
    assert used0(c) == 80000  # the snapshot_for detour left the usage as it was


def test_the_preemptors_assume_converts_the_nomination() -> None:
    c = nominated()
    assert c.assume(HP, "u-hp", WHOLE0, 0.0).ok
    assert noms(c).nomination(HP) is None
    assert used0(c) == 80000  # charged once, as the assumed pod
    c.forget(HP)
    assert used0(c) == 0


def test_the_nomination_stays_when_the_preemptors_assume_fails() -> None:
    c = fresh()
    c.add_pod("ns/victim", "u-v", VICTIM)  # still terminating
    c.nominate(HP, "u-hp", WHOLE0, expires_at=100.0)
    assert used0(c) == 110000  # victim and nomination both charged
    assert not c.assume(HP, "u-hp", WHOLE0, 0.0).ok
    assert noms(c).nomination(HP) is not None and used0(c) == 110000
    c.remove_pod("ns/victim")  # evicted and deleted
    assert used0(c) == 80000
    assert c.assume(HP, "u-hp", WHOLE0, 0.0).ok and used0(c) == 80000


def test_another_pod_with_the_same_name_does_not_inherit_it() -> None:
    c = nominated()
    assert not c.assume(HP, "u-new", WHOLE0, 0.0).ok  # recreated pod: other UID
    assert noms(c).nomination(HP) is not None


def test_a_claimed_nomination_leaves_the_snapshot_but_is_still_refused_to_others() -> None:
    c = nominated()
    assert not noms(c).claim(HP, "u-wrong")
    assert noms(c).claim(HP, "u-hp")
    assert used0(c) == 0  # the bind path's plain snapshot sees the cards free
    assert c.assume("ns/other", "u-o", OTHER0, 0.0).code is status.Code.UNSCHEDULABLE
    assert c.assume(HP, "u-hp", WHOLE0, 0.0).ok
    assert used0(c) == 80000 and noms(c).nomination(HP) is None


def test_the_watch_confirming_the_preemptor_anywhere_drops_it() -> None:
    c = nominated()
    elsewhere = alloc("m", (("GPU-m-0", 1000, 0),))
    c.add_pod(HP, "u-hp", elsewhere)
    assert noms(c).nomination(HP) is None and used0(c) == 0


def test_a_pending_update_of_the_preemptor_keeps_it() -> None:
    c = nominated()
    c.remove_pod(HP)  # what the sync does on every update of a pod without a node
    assert noms(c).nomination(HP) is not None and used0(c) == 80000


def test_expiry_and_release() -> None:
    c = nominated()
    c.nominate("ns/hp2", "u2", alloc("n", ((uuid("n", 1), 80000, 100),)), expires_at=200.0)
    assert noms(c).expire(99.0) == ()
    assert noms(c).expire(100.0) == (HP,)
    assert used0(c) == 0
    assert [n.key for n in noms(c).nominations()] == ["ns/hp2"]
    assert noms(c).release("ns/hp2") and not noms(c).release("ns/hp2")
    assert c.snapshot().nodes["n"].usage[1].memory_mib == 0


def test_renominating_replaces_and_nodes_come_and_go() -> None:
    c = nominated()
    c.nominate(HP, "u-hp", alloc("n", ((uuid("n", 1), 80000, 100),)), expires_at=100.0)
    assert used0(c) == 0 and c.snapshot().nodes["n"].usage[1].memory_mib == 80000
    c.upsert_node(node("n").gpus(2, memory=81920).inventory())  # re-registered: charged again
    assert c.snapshot().nodes["n"].usage[1].memory_mib == 80000
    c.remove_node("n")
    assert noms(c).nomination(HP) is None
    assert not c.nominate(HP, "u-hp", WHOLE0, 100.0)  # unknown node


def test_pods_on_lists_what_each_pod_holds() -> None:
    c = fresh()
    c.add_pod("ns/b", "u-b", VICTIM)
    c.assume("ns/a", "u-a", alloc("n", ((uuid("n", 1), 1000, 0),)), 0.0)
    held = c.pods_on("n")
    assert [(h.key, h.state) for h in held] == [
        ("ns/a", cache_mod.PodState.ASSUMED),
        ("ns/b", cache_mod.PodState.ADDED),
    ]
    assert held[1].reservation[0][1].memory_mib == 30000
    assert c.pods_on("nowhere") == ()
