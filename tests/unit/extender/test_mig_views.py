"""MIG cards in the cluster view's JSON (``/ui/state``) and in the per-card metrics."""

from __future__ import annotations

import msgspec
import pytest

from gpuslice.cache import cache as caches
from gpuslice.extender import metrics
from gpuslice.extender.ops import clusterview
from gpuslice.framework import view
from gpuslice.model import allocations
from gpuslice.model import mig as model_mig
from gpuslice.policy import mig
from tests.unit import migcards
from tests.unit.builders import node
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit


def _hold(cache: caches.ClusterCache, key: str, uuid: str, s: model_mig.Slice) -> None:
    prof = model_mig.find(migcards.PROFILES, s.profile)
    assert prof is not None
    grant = allocations.DeviceGrant(uuid, prof.memory_mib, prof.cores, mig=s)
    cache.add_pod(
        key, f"uid-{key}", allocations.PodAllocation(node=uuid.split("-")[1], containers=((grant,),))
    )


def _cache() -> caches.ClusterCache:
    """Node ``m``: two MIG A100-80GB, card 0 holding 1g.10gb@0 and 3g.40gb@4-7; ``g``: one shared card."""
    cache = fakes.cluster_cache(migcards.state("m", (), ()), node("g").gpus(1))
    _hold(cache, "team/small", "GPU-m-0", migcards.instance("1g.10gb", 0))
    _hold(cache, "team/big", "GPU-m-0", migcards.instance("3g.40gb", 4))
    return cache


def test_the_view_lists_each_mig_cards_instances_and_slices() -> None:
    state = clusterview.ClusterView(fakes.make_deps(_cache())).state()
    decoded = msgspec.json.decode(msgspec.json.encode(state))
    by_node = {n["name"]: n for n in decoded["nodes"]}
    c0, c1 = by_node["m"]["cards"]
    assert c0["mode"] == "mig"
    assert c0["mig"]["instances"] == [
        {"profile": "1g.10gb", "start": 0, "size": 1, "pod": "team/small", "assumed": False},
        {"profile": "3g.40gb", "start": 4, "size": 4, "pod": "team/big", "assumed": False},
    ]
    assert (c0["mig"]["slices_total"], c0["mig"]["slices_held"], c0["mig"]["slices_free"]) == (8, 5, 3)
    # what policy.mig says of the card, every profile alike (the workload is still learning)
    dev = migcards.card("GPU-m-0")
    expected = mig.card_slices(
        dev, migcards.usage(*(migcards.instance(p, s) for p, s in (("1g.10gb", 0), ("3g.40gb", 4)))), None
    )
    assert c0["mig"]["slices_stranded"] == round(expected.stranded, 2) > 0
    assert c1["mig"]["instances"] == [] and c1["mig"]["slices_free"] == 8
    assert by_node["g"]["cards"][0]["mig"] is None
    assert [p["pod"] for p in c0["pods"]] == ["team/big", "team/small"]


def test_the_page_draws_the_slices() -> None:
    page = clusterview.page().decode()
    assert "function slicesView(m)" in page and "c.mig ? slicesView(c.mig) : null" in page


def test_the_metric_counts_slices_by_state_per_card() -> None:
    cache = _cache()
    m = metrics.Metrics(lambda: view.states(cache.snapshot()))

    def sample(uuid: str, state: str) -> float | None:
        return m.registry.get_sample_value("gpuslice_mig_slices", {"node": "m", "uuid": uuid, "state": state})

    assert (sample("GPU-m-0", "held"), sample("GPU-m-0", "free")) == (5.0, 3.0)
    stranded = sample("GPU-m-0", "stranded")
    assert stranded is not None and 0 < stranded <= 3
    assert (sample("GPU-m-1", "held"), sample("GPU-m-1", "free")) == (0.0, 8.0)
    assert (
        m.registry.get_sample_value("gpuslice_mig_slices", {"node": "g", "uuid": "GPU-g-0", "state": "free"})
        is None
    )
    # the gauge follows the cache at the next scrape
    cache.remove_pod("team/big")
    assert (sample("GPU-m-0", "held"), sample("GPU-m-0", "free")) == (1.0, 7.0)
