"""The cache knows, per node, the pods of each job and the cards they hold (``NodeState.jobs``)."""

from __future__ import annotations

import pytest

from gpuslice.cache import cache as caches
from gpuslice.model import nodes
from tests.unit.builders import alloc, node, uuid

pytestmark = pytest.mark.unit


def fresh() -> caches.ClusterCache:
    c = caches.ClusterCache()
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
    c.remove_pod("ns/p2")
    assert c.snapshot().nodes["a"].job("owner:j") == nodes.JobOnNode("owner:j", 1, (0,))


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
