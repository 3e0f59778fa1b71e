"""``explain`` on MIG cards: the instances held, free and stranded slices, MigPlacementInfeasible."""

from __future__ import annotations

import pytest

from gpuslice import explaincli
from gpuslice.cache import cache as caches
from gpuslice.framework import explain, profile
from gpuslice.model import allocations, status
from gpuslice.model import mig as model_mig
from tests.unit import builders as b
from tests.unit import migcards
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit

POLICIES = profile.Profile.build("binpack", "spread", choice="rank")


def _cache(*held: model_mig.Slice) -> caches.ClusterCache:
    """Node ``m``: card 0 an A100-80GB in MIG mode holding ``held`` (one pod each), card 1 too, empty."""
    cache = fakes.cluster_cache(migcards.state("m", (), ()))
    for k, s in enumerate(held):
        prof = model_mig.find(migcards.PROFILES, s.profile)
        assert prof is not None
        grant = allocations.DeviceGrant("GPU-m-0", prof.memory_mib, prof.cores, mig=s)
        cache.add_pod(f"other/p{k}", f"u{k}", allocations.PodAllocation(node="m", containers=((grant,),)))
    return cache


def test_a_mig_card_shows_its_instances_and_slices() -> None:
    cache = _cache(migcards.instance("1g.10gb", 0), migcards.instance("3g.40gb", 4))
    doc = explain.explain(cache.snapshot(), b.pod().gpu(1, memory=9000).obj(), POLICIES)
    (node,) = doc.nodes
    assert node.fits
    c0, c1 = node.cards
    assert c0.mode == "mig" and c0.mig is not None and c1.mig is not None
    assert c0.mig.instances == (explain.Instance("1g.10gb", 0, 1), explain.Instance("3g.40gb", 4, 4))
    assert (c0.mig.slices_total, c0.mig.slices_free) == (8, 3)
    assert 0 < c0.mig.slices_stranded <= 3
    assert c1.mig.instances == () and c1.mig.slices_free == 8
    assert explain.decode(explain.encode(doc)) == doc
    text = explaincli.mig_text(c0.mig)
    assert text.startswith("held 1g.10gb@0, 3g.40gb@4-7; free 3/8, stranded ")


def test_no_free_placement_is_mig_placement_infeasible_per_card() -> None:
    # 1g instances at slices 0 and 4 leave 62464 MiB free, but every profile of 40 GB starts at 0 or 4.
    cache = _cache(migcards.instance("1g.10gb", 0), migcards.instance("1g.10gb", 4))
    pod = b.pod().gpu(1, memory=40000).obj()
    snap = cache.snapshot()
    state = snap.nodes["m"]
    doc = explain.explain(snap, pod, POLICIES)
    (node,) = doc.nodes
    assert node.fits  # card 1 is empty: a 3g.40gb there
    assert [(c.reason, c.chosen) for c in node.cards] == [
        (status.MIG_PLACEMENT_INFEASIBLE, False),
        ("fits", True),
    ]
    assert state.usage[0].mig  # the cache charged the slices


def test_a_node_whose_every_card_has_no_placement_says_so() -> None:
    cache = fakes.cluster_cache(migcards.state("m", ()))
    for k, s in enumerate((migcards.instance("1g.10gb", 0), migcards.instance("1g.10gb", 4))):
        grant = allocations.DeviceGrant("GPU-m-0", 9728, 15, mig=s)
        cache.add_pod(f"other/p{k}", f"u{k}", allocations.PodAllocation(node="m", containers=((grant,),)))
    doc = explain.explain(cache.snapshot(), b.pod().gpu(1, memory=40000).obj(), POLICIES)
    (node,) = doc.nodes
    assert not node.fits
    assert node.reasons == (status.MIG_PLACEMENT_INFEASIBLE,)
    assert [c.reason for c in node.cards] == [status.MIG_PLACEMENT_INFEASIBLE]
    tables = explaincli.rows(doc)
    title, header, rows = tables[1]
    assert header[-2:] == ["MIG", "reason"]
    assert rows[0][-2].startswith("held 1g.10gb@0, 1g.10gb@4; free 6/8")
    assert node.change == (
        "needs a free placement of a MIG profile that serves the request (3g.40gb, 4g.40gb, 7g.80gb), "
        "none is free on m card 0 (free slices: card 0 6/8)"
    )


def test_cards_off_mig_have_no_mig_part() -> None:
    cache = fakes.cluster_cache(b.node("g").gpus(1))
    doc = explain.explain(cache.snapshot(), b.pod().gpu(1, memory=1000).obj(), POLICIES)
    assert doc.nodes[0].cards[0].mig is None
    assert b"mig" not in explain.encode(doc)
    assert "MIG" not in explaincli.rows(doc)[1][1]
