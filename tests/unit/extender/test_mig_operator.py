"""MIG in the extender's operator surface: the placement setting, and the bind event's note."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from gpuslice.cache import cache as caches
from gpuslice.extender import config
from gpuslice.extender.binding import bind as binds
from gpuslice.extender.http import app as apps
from gpuslice.framework import cycle, nominations, profile
from gpuslice.model import allocations
from gpuslice.policy import mig
from tests.unit import migcards
from tests.unit.builders import pod
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit


def test_the_setting_defaults_to_fragmentation_and_takes_first_fit() -> None:
    assert config.parse([], {}).mig_placement == mig.FRAGMENTATION
    assert config.parse(["--mig-placement", "first-fit"], {}).mig_placement == mig.FIRST_FIT
    assert config.parse([], {"GPUSLICE_MIG_PLACEMENT": "first-fit"}).mig_placement == mig.FIRST_FIT
    assert config.validate({"mig_placement": "fragmentation"}).mig_placement == "fragmentation"


def test_a_bad_rule_names_the_flag() -> None:
    with pytest.raises(config.ConfigError, match=r"mig_placement \(--mig-placement\): expected one of "):
        config.parse(["--mig-placement", "firstfit"], {})
    with pytest.raises(ValueError, match="MIG placement must be one of"):
        profile.Profile.build("binpack", "spread", mig_rule="best")


@pytest.mark.parametrize("rule", [mig.FRAGMENTATION, mig.FIRST_FIT])
def test_the_context_gets_the_rule(rule: str) -> None:
    settings = config.parse(["--mig-placement", rule], {})
    built = profile.Profile.from_settings(settings, clock=None)
    assert built.mig_rule == rule
    snap = caches.ClusterCache(nominator=nominations.Nominator()).snapshot()
    assert cycle.Cycle.of(built, snap, pod("p").gpu(1).obj()).ctx.mig_rule == rule


def _mig_cache() -> caches.ClusterCache:
    """One node with one A100-80GB in MIG mode; a running pod holds 1g.10gb at slice 0."""
    cache = fakes.cluster_cache(migcards.state("n", ()))
    held = migcards.instance("1g.10gb", 0)
    grant = allocations.DeviceGrant("GPU-n-0", 9728, 15, mig=held)
    cache.add_pod("default/old", "uid-old", allocations.PodAllocation(node="n", containers=((grant,),)))
    return cache


def _bind_note(rule: str) -> str:
    deps = fakes.make_deps(_mig_cache(), settings=config.Settings(mig_placement=rule))
    with TestClient(apps.create_app(deps)) as c:
        c.post("/filter", json={"Pod": fakes.gpu_pod("p", mem=9000), "Nodes": None, "NodeNames": ["n"]})
        r = c.post("/bind", json={"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n"})
    assert r.json() == {"Error": ""}
    assert isinstance(deps.events, fakes.RecordedEvents)
    (bound,) = deps.events.events
    assert bound[:3] == ("default/p", "Normal", "GPUAllocated")
    return bound[3]


def test_the_bind_event_names_the_instance_and_what_it_saves_over_first_fit() -> None:
    note = _bind_note(mig.FRAGMENTATION)
    assert "Device: GPU-n-0 1g.10gb@1 (9728MB/15cores)" in note
    assert note.endswith(
        "; MIG: 1g.10gb at slice 1 of GPU-n-0 strands 1 fewer slice than HAMi's first fit "
        "(1g.10gb at slice 6 of GPU-n-0)"
    )


def test_under_first_fit_the_event_has_no_comparison() -> None:
    note = _bind_note(mig.FIRST_FIT)
    assert note.endswith("Device: GPU-n-0 1g.10gb@6 (9728MB/15cores)")
    assert "MIG:" not in note


def test_describe_shows_instances_and_shares() -> None:
    alloc = allocations.PodAllocation(
        node="n",
        containers=(
            (allocations.DeviceGrant("GPU-x", 19968, 29, mig=migcards.instance("2g.20gb", 2)),),
            (allocations.DeviceGrant("GPU-y", 4000, 30),),
        ),
    )
    assert binds.describe(alloc) == "GPU-x 2g.20gb@2-3 (19968MB/29cores), GPU-y (4000MB/30cores)"
