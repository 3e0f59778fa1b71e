"""The cache knows, per node, the pods of each job and the cards they hold (``NodeState.jobs``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.cache import cache as caches
from gpuslice.cache import snapshot
from gpuslice.framework import nominations
from gpuslice.model import nodes
from tests.unit.builders import alloc, node, uuid

pytestmark = pytest.mark.unit


def fresh() -> caches.ClusterCache:
    c = caches.ClusterCache(nominator=nominations.Nominator())
    c.upsert_node(node("a").gpus(4).inventory())
    c.upsert_node(node("b").gpus(2).inventory())
    return c


def test_jobs_per_node() -> None:
    c = fresh()
    c.add_pod("ns/p1", "u1", alloc("a", ((uuid("a", 0), 1000, 0),)), job="owner:j")
    c.add_pod("ns/p2", "u2", alloc("a", ((uuid("a", 2), 1000, 0), (uuid("a", 0), 1000, 0))), job="owner:j")
    c.add_pod("ns/p3", "u3", alloc("a", ((uuid("a", 1), 1000, 0),)), job="label:x")
    c.add_pod("ns/p4", "u4", alloc("b", ((uuid("b", 1), 1000, 0),)))  # no job
    snap = c.snapshot()
    assert snap.nodes["a"].jobs == (
        nodes.JobOnNode("label:x", 1, (1,)),
        nodes.JobOnNode("owner:j", 2, (0, 2)),
    )
    assert snap.nodes["b"].jobs == ()
    assert snap.nodes["a"].job("owner:j") == nodes.JobOnNode("owner:j", 2, (0, 2))
    assert {j: dict(on) for j, on in snap.jobs.items()} == {
        "label:x": {"a": nodes.JobOnNode("label:x", 1, (1,))},
        "owner:j": {"a": nodes.JobOnNode("owner:j", 2, (0, 2))},
    }
    assert dict(snap.job_nodes("owner:j")) == {"a": nodes.JobOnNode("owner:j", 2, (0, 2))}
    assert not snap.job_nodes("") and not snap.job_nodes("owner:none")
    c.remove_pod("ns/p2")
    later = c.snapshot()
    assert later.nodes["a"].job("owner:j") == nodes.JobOnNode("owner:j", 1, (0,))
    assert dict(later.job_nodes("owner:j")) == {"a": nodes.JobOnNode("owner:j", 1, (0,))}
    assert dict(snap.job_nodes("owner:j")) == {"a": nodes.JobOnNode("owner:j", 2, (0, 2))}  # unchanged
    assert later.jobs["label:x"] is snap.jobs["label:x"]  # a job no change touched is shared
    c.remove_node("a")
    assert not c.snapshot().jobs  # the node's pods are orphans: no node holds the jobs
    c.upsert_node(node("a").gpus(4).inventory())
    assert set(c.snapshot().jobs) == {"label:x", "owner:j"}  # charged again on the node's return


def test_assumed_pods_count_and_confirmation_keeps_or_updates_the_job() -> None:
    c = fresh()
    a = alloc("b", ((uuid("b", 0), 1000, 0),))
    assert c.assume("ns/p", "u", a, 0.0, job="owner:j").ok
    assert c.snapshot().nodes["b"].jobs == (nodes.JobOnNode("owner:j", 1, (0,)),)
    c.add_pod("ns/p", "u", a, job="label:relabelled")  # the watch confirms it with another job
    assert c.snapshot().nodes["b"].jobs == (nodes.JobOnNode("label:relabelled", 1, (0,)),)
    assert c.forget("ns/p") is False  # confirmed, no longer assumed
    c.remove_pod("ns/p")
    assert c.snapshot().nodes["b"].jobs == ()


def test_a_pod_on_an_unknown_card_counts_without_a_card() -> None:
    c = fresh()
    c.add_pod("ns/p", "u", alloc("a", (("GPU-gone", 1000, 0),)), job="owner:j")
    assert c.snapshot().nodes["a"].jobs == (nodes.JobOnNode("owner:j", 1, ()),)


NODES = ("a", "b", "c")
JOBS = ("", "owner:j", "label:x", "owner:k")
OPS = st.lists(
    st.tuples(
        st.sampled_from(("add", "assume", "forget", "remove", "drop_node", "node_back", "snapshot")),
        st.integers(0, 5),  # pod
        st.sampled_from(NODES),
        st.integers(0, 1),  # card
        st.sampled_from(JOBS),
    ),
    max_size=40,
)


def plain(index: object) -> dict[str, dict[str, nodes.JobOnNode]]:
    return {j: dict(on) for j, on in index.items()}  # type: ignore[attr-defined]


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_the_job_index_equals_a_fresh_scan(ops: list[tuple[str, int, str, int, str]]) -> None:
    c = caches.ClusterCache(nominator=nominations.Nominator())
    for name in NODES:
        c.upsert_node(node(name).gpus(2).inventory())
    kept: list[tuple[snapshot.Snapshot, dict[str, dict[str, nodes.JobOnNode]]]] = []
    present: set[str] = set()
    for op, k, name, card, job in ops:
        key, a = f"ns/p{k}", alloc(name, ((uuid(name, card), 1000, 0),))
        if op == "add":
            c.add_pod(key, f"u{k}", a, job=job)
            present.add(key)
        elif op == "assume" and key not in present:  # assume is for a pod the cache does not hold
            if c.assume(key, f"u{k}", a, 0.0, job=job).ok:
                present.add(key)
        elif op == "forget":
            if c.forget(key):
                present.discard(key)
        elif op == "remove":
            c.remove_pod(key)
            present.discard(key)
        elif op == "drop_node":
            c.remove_node(name)
        elif op == "node_back":
            c.upsert_node(node(name).gpus(2).inventory())
        elif op == "snapshot":
            snap = c.snapshot()
            assert plain(snap.jobs) == plain(snapshot.job_index(snap.nodes))
            kept.append((snap, plain(snap.jobs)))
    snap = c.snapshot()
    assert plain(snap.jobs) == plain(snapshot.job_index(snap.nodes))
    for old, then in kept:  # copy-on-write: what older snapshots hold never changed
        assert plain(old.jobs) == then
