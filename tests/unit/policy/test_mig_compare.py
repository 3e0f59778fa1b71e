"""``mig.compare``: what the fragmentation rule's instances strand next to HAMi's first fit."""

from __future__ import annotations

import pytest

from gpuslice.framework import registry
from gpuslice.model import allocations, nodes, requests
from gpuslice.model import mig as model_mig
from gpuslice.policy import api, fit, mig
from tests.unit import migcards
from tests.unit.builders import pod

pytestmark = pytest.mark.unit

gi = migcards.instance
FRAG = api.Context()
FIRST = api.Context(mig_rule=mig.FIRST_FIT)


def _both(
    state: nodes.NodeState, req: requests.PodRequest
) -> tuple[allocations.PodAllocation, allocations.PodAllocation | None]:
    rule = registry.card_policy("binpack")
    ours = fit.place(state, req, rule, FRAG).allocation
    assert ours is not None
    return ours, fit.place(state, req, rule, FIRST).allocation


def test_a_different_slice_on_the_same_card_is_named_with_what_it_saves() -> None:
    # 1g.10gb held at slice 0: HAMi takes the highest free 1g slice (6), which leaves slice 7 alone
    # for every profile but 1g; slice 1 next to the held one strands nothing new.
    state = migcards.state("n", (gi("1g.10gb", 0),))
    ours, first = _both(state, pod("p").gpu(1, memory=9000).obj())
    note = mig.compare(state, ours, first, FRAG)
    assert note == (
        "MIG: 1g.10gb at slice 1 of GPU-n-0 strands 1 fewer slice than HAMi's first fit "
        "(1g.10gb at slice 6 of GPU-n-0)"
    )
    theirs = [(0, g.mig) for c in first.containers for g in c if g.mig] if first else []
    assert mig.cost_of(state, theirs, FRAG) - mig.cost_of(state, [(0, gi("1g.10gb", 1))], FRAG) == 1


def test_a_different_card_is_named() -> None:
    # Card 0 has slices 0-3 taken, card 1 its 1g slices 5 and 6: the two rules pick different
    # cards, and the note names both.
    state = migcards.state("n", (gi("2g.20gb", 0), gi("2g.20gb", 2)), (gi("1g.10gb", 6), gi("1g.10gb", 5)))
    ours, first = _both(state, pod("p").gpu(1, memory=9000).obj())
    note = mig.compare(state, ours, first, FRAG)
    assert first is not None and note is not None
    ours_uuid = ours.containers[0][0].uuid
    first_uuid = first.containers[0][0].uuid
    assert ours_uuid != first_uuid
    held = ours.containers[0][0].mig
    assert held is not None
    assert note.startswith(f"MIG: 1g.10gb at slice {mig.span(held)} of {ours_uuid}")
    assert f"of {first_uuid})" in note and "fewer" in note


def test_the_same_choice_says_nothing() -> None:
    state = migcards.state("n", ())
    ours, first = _both(state, pod("p").gpu(1, memory=70000).obj())  # only 7g.80gb serves it
    assert ours == first
    assert mig.compare(state, ours, first, FRAG) is None


def test_a_placement_without_instances_says_nothing() -> None:
    state = migcards.state("n", ())
    plain = allocations.PodAllocation(node="n", containers=((allocations.DeviceGrant("GPU-n-0", 1000, 0),),))
    assert mig.compare(state, plain, None, FRAG) is None


def test_more_and_nothing_are_said_too() -> None:
    state = migcards.state("n", (gi("1g.10gb", 0),))
    good = _alloc(gi("1g.10gb", 1))
    bad = _alloc(gi("1g.10gb", 6))
    assert mig.compare(state, bad, good, FRAG) == (
        "MIG: 1g.10gb at slice 6 of GPU-n-0 strands 1 more slice than HAMi's first fit "
        "(1g.10gb at slice 1 of GPU-n-0)"
    )
    assert mig.compare(state, good, None, FRAG) == (
        "MIG: 1g.10gb at slice 1 of GPU-n-0; HAMi's first fit places nothing here"
    )
    # slices 2 and 3 are alike next to a 1g held at 0: each leaves the same pairs free
    assert mig.compare(state, _alloc(gi("1g.10gb", 2)), _alloc(gi("1g.10gb", 3)), FRAG) == (
        "MIG: 1g.10gb at slice 2 of GPU-n-0 strands as many slices as HAMi's first fit "
        "(1g.10gb at slice 3 of GPU-n-0)"
    )
    pair = _alloc(gi("2g.20gb", 2))
    note = mig.compare(state, pair, _alloc(gi("2g.20gb", 4)), FRAG)
    assert note is not None and note.startswith("MIG: 2g.20gb at slices 2-3 of GPU-n-0 strands 0.67 fewer")


def test_span() -> None:
    assert mig.span(gi("1g.10gb", 6)) == "6"
    assert mig.span(gi("3g.40gb", 4)) == "4-7"


def _alloc(s: model_mig.Slice) -> allocations.PodAllocation:
    grant = allocations.DeviceGrant("GPU-n-0", 9728, 15, mig=s)
    return allocations.PodAllocation(node="n", containers=((grant,),))
