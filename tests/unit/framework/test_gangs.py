"""framework.gangs: whole-gang plans held in the cache, all or nothing (docs/gangs.md)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslice.cache import cache as caches
from gpuslice.framework import gangs, nominations, profile
from gpuslice.model import allocations, requests, status
from gpuslice.model import gangs as model_gangs
from tests.unit import builders as b
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit

PROFILE = profile.Profile.build("binpack", "binpack", choice="rank")
NOW = 1000.0


def world(*nodes: b.NodeBuilder) -> tuple[caches.ClusterCache, gangs.Gangs, nominations.Nominator]:
    """A cache reading preemptors' and gangs' holds on one journal, and the gangs' plans on it."""
    journal = nominations.Journal()
    preempt, holds = nominations.Nominator(journal), nominations.Nominator(journal)
    cache = fakes.cluster_cache(*nodes, nominator=nominations.Merged(journal, preempt, holds))
    return cache, gangs.Gangs(PROFILE, gangs.Directory(), holds), holds


def member(
    name: str, gang: str = "g", minimum: int = 4, *, memory: int = 81920, count: int = 1
) -> requests.PodRequest:
    pod = b.pod(name).uid(f"u-{name}").gpu(count, memory=memory).obj()
    ref = model_gangs.GangRef(
        namespace="default", name=gang, source=model_gangs.SOURCE_ANNOTATION, min_member=minimum
    )
    return msgspec.structs.replace(pod, gang=ref)


def names(cache: caches.ClusterCache) -> list[str]:
    return sorted(cache.snapshot().nodes)


def used_cards(cache: caches.ClusterCache) -> int:
    """Cards with any usage or hold in a plain snapshot."""
    return sum(1 for s in cache.snapshot().nodes.values() for u in s.usage if u.slots)


def test_the_first_member_plans_and_holds_the_whole_gang() -> None:
    cache, plans, _ = world(b.node("a").gpus(2), b.node("b").gpus(2))
    verdict = plans.admit(member("m0"), cache.snapshot(), names(cache), NOW)
    assert verdict.gated and verdict.node in ("a", "b")
    assert used_cards(cache) == 4  # the three members not seen yet hold their cards too
    nodes = [plans.admit(member(f"m{i}"), cache.snapshot(), names(cache), NOW).node for i in range(1, 4)]
    assert sorted(str(n) for n in [verdict.node, *nodes]) == ["a", "a", "b", "b"]
    plan = plans.view("default/g", NOW)
    assert plan is not None and plan.quorum == 4 and {s.state for s in plan.slots} == {"filtered"}
    # every card is planned once
    cards = [c for s in plan.slots for c in s.cards]
    assert len(cards) == len(set(cards)) == 4


def test_a_gang_that_does_not_fit_holds_nothing_and_says_what_is_short() -> None:
    cache, plans, holds = world(b.node("a").gpus(2), b.node("b").gpus(2))
    verdict = plans.admit(member("m0", minimum=5), cache.snapshot(), names(cache), NOW)
    assert verdict.gated and verdict.node is None and verdict.reason == status.GANG_UNSCHEDULABLE
    assert "default/g (minimum 5): 4 of 5 members fit" in verdict.message
    assert "InsufficientGPU" in verdict.message or "GPUSlotsExhausted" in verdict.message
    assert used_cards(cache) == 0 and holds.nominations() == ()


def test_other_pods_see_a_plan_as_taken_and_cannot_assume_its_cards() -> None:
    cache, plans, _ = world(b.node("a").gpus(2))
    plans.admit(member("m0", minimum=2), cache.snapshot(), ["a"], NOW)
    other = b.pod("x").uid("u-x").gpu(1, memory=1000).obj()
    snap = cache.snapshot()
    assert all(u.slots for u in snap.nodes["a"].usage)
    # an assume of another pod on a held card is refused
    card = snap.nodes["a"].inventory.devices[0].uuid
    verdict = cache.assume("default/x", other.uid, b.alloc("a", ((card, 1000, 0),)), NOW)
    assert not verdict.ok


def test_two_gangs_never_hold_parts_of_what_each_needs() -> None:
    cache, plans, _ = world(b.node("a").gpus(2), b.node("b").gpus(2))
    first = plans.admit(member("a0", "ga", 3), cache.snapshot(), names(cache), NOW)
    second = plans.admit(member("b0", "gb", 2), cache.snapshot(), names(cache), NOW)
    assert first.node is not None and second.node is None  # 3 + 2 > 4: the second holds nothing
    assert used_cards(cache) == 3
    plans.abort("default/ga", "test")
    assert used_cards(cache) == 0
    again = plans.admit(member("b0", "gb", 2), cache.snapshot(), names(cache), NOW)
    assert again.node is not None and used_cards(cache) == 2


def test_members_with_their_own_shapes_get_their_own_slots() -> None:
    cache, plans, _ = world(b.node("a").gpus(4, memory=40000))
    directory = plans.directory
    ref = member("x", minimum=3).gang
    big = msgspec.structs.replace(member("big", minimum=3, count=2, memory=40000))
    for pod in (big, member("s1", minimum=3, memory=40000)):
        directory.pod(ref, gangs.Member(f"default/{pod.name}", pod.uid, pod))
    small = member("s0", minimum=3, memory=40000)
    assert plans.admit(small, cache.snapshot(), ["a"], NOW).node == "a"
    plan = plans.view("default/g", NOW)
    assert plan is not None
    by_member = {s.member: len(s.cards) for s in plan.slots}
    assert by_member == {"default/big": 2, "default/s0": 1, "default/s1": 1}


def test_a_pod_group_gang_waits_for_its_group_object() -> None:
    cache, plans, _ = world(b.node("a").gpus(2))
    ref = model_gangs.GangRef(namespace="default", name="pg", source=model_gangs.SOURCE_POD_GROUP, group="pg")
    pod = msgspec.structs.replace(b.pod("m").uid("u").gpu(1, memory=1000).obj(), gang=ref)
    verdict = plans.admit(pod, cache.snapshot(), ["a"], NOW)
    assert verdict.reason == status.GANG_GROUP_MISSING and "PodGroup 'pg'" in verdict.message
    plans.directory.group(model_gangs.SOURCE_POD_GROUP, "default", "pg", model_gangs.GroupSpec(min_member=2))
    assert plans.admit(pod, cache.snapshot(), ["a"], NOW).node == "a"


def test_members_bound_already_lower_what_is_still_needed() -> None:
    cache, plans, _ = world(b.node("a").gpus(1))
    ref = member("x", minimum=3).gang
    for i in range(2):
        plans.directory.pod(
            ref, gangs.Member(f"default/old{i}", f"u{i}", member(f"old{i}", minimum=3), node="z")
        )
    verdict = plans.admit(member("m", minimum=3), cache.snapshot(), ["a"], NOW)
    assert verdict.node == "a"  # one left to place, and it fits
    plan = plans.view("default/g", NOW)
    assert plan is not None and plan.quorum == 1


def test_the_barrier_opens_with_the_quorum_and_bound_members_finish_the_plan() -> None:
    cache, plans, _ = world(b.node("a").gpus(2))
    pods = [member(f"m{i}", minimum=2) for i in range(2)]
    nodes = [plans.admit(p, cache.snapshot(), ["a"], NOW).node for p in pods]
    first = plans.arrive(pods[0], "a", NOW)
    assert not first.open and not first.error
    assert plans.arrive(pods[1], "b", NOW).error  # not its planned node
    second = plans.arrive(pods[1], "a", NOW)
    assert second.open and plans.state("default/g", first.plan).open
    for p in pods:
        plans.claim(p)
        plans.bound(p)
    assert nodes == ["a", "a"] and plans.view("default/g", NOW) is None


def test_an_abort_releases_every_hold_and_tells_the_waiting_members() -> None:
    cache, plans, holds = world(b.node("a").gpus(2))
    pods = [member(f"m{i}", minimum=2) for i in range(2)]
    plans.admit(pods[0], cache.snapshot(), ["a"], NOW)
    arrival = plans.arrive(pods[0], "a", NOW)
    plans.abort("default/g", "the barrier waited too long")
    state = plans.state("default/g", arrival.plan)
    assert not state.open and "the barrier waited too long" in state.error
    assert holds.nominations() == () and used_cards(cache) == 0


def test_plans_expire_and_a_member_going_away_gives_the_plan_up() -> None:
    cache, plans, holds = world(b.node("a").gpus(2))
    plans.admit(member("m0", minimum=2), cache.snapshot(), ["a"], NOW)
    assert plans.expire(NOW + 59) == () and plans.expire(NOW + 60) == ("default/g",)
    assert holds.nominations() == ()
    plans.admit(member("m0", minimum=2), cache.snapshot(), ["a"], NOW)
    plans.member_gone("default/m0")
    assert plans.view("default/g", NOW) is None and holds.nominations() == ()


def test_a_failed_bind_after_the_barrier_holds_its_slot_again() -> None:
    cache, plans, holds = world(b.node("a").gpus(2))
    pods = [member(f"m{i}", minimum=2) for i in range(2)]
    for p in pods:
        plans.admit(p, cache.snapshot(), ["a"], NOW)
    for p in pods:
        plans.arrive(p, "a", NOW)
    plans.claim(pods[0])
    assert cache.assume("default/m0", "u-m0", fakes_alloc(cache, "a", 0), NOW).ok
    cache.forget("default/m0")  # the bind failed after its assume
    plans.failed(pods[0], None, NOW)
    nom = holds.nomination("default/m0")
    assert nom is not None and not nom.claimed and used_cards(cache) == 2


def fakes_alloc(cache: caches.ClusterCache, node: str, card: int) -> allocations.PodAllocation:
    uuid = cache.snapshot().nodes[node].inventory.devices[card].uuid
    return b.alloc(node, ((uuid, 81920, 0),))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=4),
    st.lists(
        st.tuples(st.integers(1, 6), st.integers(1, 3), st.sampled_from([20000, 40000, 81920])),
        min_size=1,
        max_size=4,
    ),
)
def test_property_plans_are_all_or_nothing_and_never_overcommit(
    cards: list[int], gang_specs: list[tuple[int, int, int]]
) -> None:
    cache, plans, holds = world(*(b.node(f"n{i}").gpus(c) for i, c in enumerate(cards)))
    all_names = names(cache)
    for k, (size, count, memory) in enumerate(gang_specs):
        before = len(holds.nominations())
        verdict = plans.admit(
            member(f"g{k}-0", f"g{k}", size, memory=memory, count=count), cache.snapshot(), all_names, NOW
        )
        after = len(holds.nominations())
        if verdict.node is None:
            assert after == before  # nothing held for a gang that does not fit
        else:
            assert after == before + size
        for state in cache.snapshot().nodes.values():
            for i, u in enumerate(state.usage):
                dev = state.inventory.devices[i]
                assert u.memory_mib <= dev.memory_mib and u.slots <= dev.split_count


def test_a_member_whose_plan_went_before_its_bind_is_still_gated_and_refused() -> None:
    cache, plans, _ = world(b.node("a").gpus(2))
    pods = [member(f"m{i}", minimum=2) for i in range(2)]
    plans.admit(pods[0], cache.snapshot(), ["a"], NOW)
    plans.abort("default/g", "test")  # gone between its filter and its bind
    assert plans.gated(pods[0])
    arrival = plans.arrive(pods[0], "a", NOW)
    assert not arrival.open and "no plan holds" in arrival.error


def test_members_of_a_met_gang_and_pods_without_gpus_are_not_gated() -> None:
    cache, plans, _ = world(b.node("a").gpus(2))
    ref = member("x", minimum=1).gang
    plans.directory.pod(ref, gangs.Member("default/old", "u-old", member("old", minimum=1), node="a"))
    assert not plans.gated(member("new", minimum=1))
    assert plans.admit(member("new", minimum=1), cache.snapshot(), ["a"], NOW) == gangs.NOT_GATED
    gpuless = msgspec.structs.replace(b.pod("cpu").no_gpu().obj(), gang=ref)
    assert not plans.gated(gpuless)


def test_a_member_of_another_shape_takes_over_a_slot_held_for_members_not_created_yet() -> None:
    cache, plans, holds = world(b.node("a").gpus(3))
    first = member("m0", minimum=3, memory=20000)
    assert plans.admit(first, cache.snapshot(), ["a"], NOW).node == "a"  # three small slots held
    big = member("big", minimum=3, count=2, memory=81920)  # two whole cards: a shape nobody planned
    verdict = plans.admit(big, cache.snapshot(), ["a"], NOW)
    # it fits only by taking a placeholder's cards: 3 cards, the plan keeps m0 and one small slot
    assert verdict.node == "a", verdict.message
    plan = plans.view("default/g", NOW)
    assert plan is not None and plan.quorum == 3 and len(plan.slots) == 3
    assert sorted(len(s.cards) for s in plan.slots) == [1, 1, 2]
    (big_slot,) = [s for s in plan.slots if len(s.cards) == 2]
    others = {c for s in plan.slots if s is not big_slot for c in s.cards}
    assert len(set(big_slot.cards)) == 2 and not set(big_slot.cards) & others  # whole cards, alone
    assert len(holds.nominations()) == 3


def test_a_member_beyond_the_minimum_that_does_not_fit_waits_and_keeps_the_plan() -> None:
    cache, plans, _ = world(b.node("a").gpus(2))
    first = member("m0", minimum=2)
    plans.admit(first, cache.snapshot(), ["a"], NOW)
    plans.admit(member("m1", minimum=2), cache.snapshot(), ["a"], NOW)
    extra = plans.admit(member("m2", minimum=2), cache.snapshot(), ["a"], NOW)
    assert extra.node is None and extra.reason == status.GANG_UNSCHEDULABLE
    plan = plans.view("default/g", NOW)
    assert plan is not None and len(plan.slots) == 2


def pending_member(plans: gangs.Gangs, pod: requests.PodRequest) -> None:
    """The pod watch shows the member pending."""
    plans.directory.pod(pod.gang, gangs.Member(f"default/{pod.name}", pod.uid, pod))


def test_a_gang_refused_for_long_is_not_overtaken_by_later_gangs() -> None:
    cache, plans, _ = world(b.node("a").gpus(2), b.node("b").gpus(2))
    fakes.charge(cache, "default/solo", "a", (0, 81920, 100))  # one card busy: three free
    big = member("big0", "big", 4)
    pending_member(plans, big)
    assert plans.admit(big, cache.snapshot(), names(cache), NOW).node is None  # 4 > 3 free
    small = member("s0", "small", 2)
    pending_member(plans, small)
    # not starving yet: the small gang goes first (backfill)
    early = plans.admit(small, cache.snapshot(), names(cache), NOW + 10)
    assert early.node is not None
    plans.abort("default/small", "test")
    # past STARVING_S the big gang is the head of the line: the small one fits alone, but not
    # together with it, so it waits
    late = plans.admit(small, cache.snapshot(), names(cache), NOW + gangs.STARVING_S + 1)
    assert late.node is None and "waits behind gang default/big" in late.message
    cache.remove_pod("default/solo")  # room frees: it goes to the head
    assert plans.admit(big, cache.snapshot(), names(cache), NOW + 40).node is not None
    assert plans.admit(small, cache.snapshot(), names(cache), NOW + 41).node is None  # no room left


def test_a_gang_that_cannot_fit_an_empty_cluster_holds_nobody_back() -> None:
    cache, plans, _ = world(b.node("a").gpus(2), b.node("b").gpus(2))
    huge = member("h0", "huge", 5)
    pending_member(plans, huge)
    assert plans.admit(huge, cache.snapshot(), names(cache), NOW).node is None
    small = member("s0", "small", 2)
    pending_member(plans, small)
    assert plans.admit(small, cache.snapshot(), names(cache), NOW + 100).node is not None
