"""policy.victims: the victims on one node and the order of candidates (kube-scheduler's rules)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.framework import registry
from gpuslice.model import allocations, nodes, requests
from gpuslice.policy import fit, victims
from tests.unit.builders import node, pod, uuid

pytestmark = pytest.mark.unit

SPREAD = registry.get("spread")
WHOLE = pod("hp").gpu(1, pct=100, cores=100).obj()
"""A pod that needs a whole card (all its memory, every core)."""


def resident(
    key: str,
    card: int,
    priority: int,
    memory: int = 20000,
    cores: int = 20,
    start: float = 0.0,
    **labels: str,
) -> victims.Resident:
    return victims.Resident(
        key=f"ns/{key}",
        uid=f"uid-{key}",
        priority=priority,
        reservation=((uuid("n1", card), nodes.CardUsage(1, memory, cores)),),
        labels=tuple(sorted(labels.items())),
        start=start,
    )


def state_with(residents: Sequence[victims.Resident], cards: int = 2) -> nodes.NodeState:
    b = node("n1").gpus(cards)
    for r in residents:
        for u, use in r.reservation:
            b.used(int(u.rsplit("-", 1)[1]), memory=use.memory_mib, cores=use.cores, slots=use.slots)
    return b.state()


def names(c: victims.Candidate | None) -> list[str]:
    assert c is not None
    return [v.key.split("/")[1] for v in c.victims]


def select(
    residents: Sequence[victims.Resident],
    priority: int = 100,
    want: requests.PodRequest = WHOLE,
    budgets: Sequence[victims.Budget] = (),
    cards: int = 2,
) -> victims.Candidate | None:
    return victims.select_on_node(
        state_with(residents, cards), residents, want, priority, SPREAD, budgets=budgets
    )


@pytest.mark.parametrize(
    ("residents", "expected", "card"),
    [
        # The card of the lower-priority pods is freed; the higher ones are reprieved first.
        (
            [resident("a", 0, 1), resident("b", 0, 1), resident("c", 1, 5), resident("d", 1, 5)],
            ["a", "b"],
            0,
        ),
        ([resident("a", 0, 5), resident("b", 0, 5), resident("c", 1, 1), resident("d", 1, 1)], ["c", "d"], 1),
        # Equal priority: the earliest started are reprieved first, so the card of the later ones
        # goes; here that is the single pod on card 1 (fewest victims).
        (
            [
                resident("a", 0, 1, start=1),
                resident("b", 0, 1, start=2),
                resident("c", 0, 1, start=3),
                resident("d", 1, 1, start=4),
            ],
            ["d"],
            1,
        ),
        # A pod of the preemptor's priority or above is never a victim: card 0 is not freed.
        ([resident("a", 0, 100), resident("c", 1, 1), resident("d", 1, 2)], ["d", "c"], 1),
    ],
    ids=["low-card-freed", "other-card", "fewest-victims", "equal-priority-kept"],
)
def test_victims_on_one_node(residents: list[victims.Resident], expected: list[str], card: int) -> None:
    c = select(residents)
    assert names(c) == expected  # most important first
    assert c is not None and c.cards == (uuid("n1", card),) and c.violations == 0
    assert c.allocation.node == "n1"


@pytest.mark.parametrize(
    ("residents", "cards"),
    [
        ([], 2),
        ([resident("a", 0, 100), resident("b", 1, 100)], 2),  # equal priority
        ([resident("a", 0, 500), resident("b", 0, 1)], 1),  # the card keeps a higher-priority pod
    ],
    ids=["empty", "equal", "card-held-higher"],
)
def test_no_candidate_when_lower_priority_pods_cannot_make_room(
    residents: list[victims.Resident], cards: int
) -> None:
    assert select(residents, cards=cards) is None


def test_a_pod_needing_more_cards_than_the_node_has_gets_nothing() -> None:
    two = pod("hp").gpu(2, pct=100, cores=100).obj()
    assert select([resident("a", 0, 1)], want=two, cards=1) is None


def test_only_strictly_lower_priority() -> None:
    assert select([resident("a", 0, 100), resident("b", 1, 100)], priority=100) is None
    assert select([resident("a", 0, 99), resident("b", 1, 100)], priority=100) is not None


def test_preemption_policy_never() -> None:
    assert not victims.can_preempt(1000, victims.PREEMPT_NEVER)
    assert victims.can_preempt(1000, "PreemptLowerPriority") and victims.can_preempt(1000, None)


def budget(allowed: int, **match: str) -> victims.Budget:
    return victims.Budget("ns", "pdb", victims.Selector(match_labels=tuple(sorted(match.items()))), allowed)


def test_budget_protected_pods_are_reprieved_first() -> None:
    # Both cards hold equal-priority pods; a and b (card 0, started first) are protected, so the
    # unprotected c and d on card 1 are the victims and no budget is violated.
    residents = [
        resident("a", 0, 1, start=1, app="db"),
        resident("b", 0, 1, start=2, app="db"),
        resident("c", 1, 1, start=3),
        resident("d", 1, 1, start=4),
    ]
    c = select(residents, budgets=[budget(0, app="db")])
    assert names(c) == ["c", "d"] and c is not None and c.violations == 0
    # Without the budget the later-started pods' card still goes, but a budget on them is counted.
    c = select(residents, budgets=[budget(1, app="db"), budget(0, app="none")])
    assert names(c) == ["c", "d"]


def test_violations_are_counted_when_unavoidable() -> None:
    residents = [resident("a", 0, 1, app="db"), resident("b", 0, 1, app="db")]
    c = select(residents, cards=1, budgets=[budget(1, app="db")])
    assert c is not None and names(c) == ["a", "b"] and c.violations == 1  # one disruption allowed


def test_budget_selector_terms() -> None:
    r = resident("a", 0, 1, app="db", tier="gold")
    expr = victims.Requirement
    assert victims.Selector().matches(dict(r.labels))  # empty selector: every pod
    assert victims.Selector(match_expressions=(expr("tier", "In", ("gold",)),)).matches(dict(r.labels))
    assert not victims.Selector(match_expressions=(expr("tier", "NotIn", ("gold",)),)).matches(dict(r.labels))
    assert victims.Selector(match_expressions=(expr("x", "DoesNotExist"),)).matches(dict(r.labels))
    assert not victims.Selector(match_expressions=(expr("x", "Exists"),)).matches(dict(r.labels))
    other_ns = victims.Budget("other", "pdb", victims.Selector(), 0)
    assert not other_ns.selects(r)
    assert not victims.Budget("ns", "pdb", None, 0).selects(r)  # no selector: selects nothing
    assert victims.Budget("ns", "pdb", victims.Selector(), 0).selects(r)


def candidate(name: str, violations: int, *prios: int, start: float = 0.0) -> victims.Candidate:
    vs = tuple(resident(f"{name}{k}", 0, p, start=start) for k, p in enumerate(prios))
    return victims.Candidate(name, vs, violations, allocations.PodAllocation(node=name, containers=()))


@pytest.mark.parametrize(
    ("cands", "best"),
    [
        ([candidate("a", 1, 1), candidate("b", 0, 50)], "b"),  # fewest PDB violations first
        ([candidate("a", 0, 10, 1), candidate("b", 0, 5, 5, 5)], "b"),  # lowest highest priority
        ([candidate("a", 0, 5, 5), candidate("b", 0, 5, 1)], "b"),  # smallest priority sum
        ([candidate("a", 0, -5, -5), candidate("b", 0, -5)], "b"),  # sum with negative priorities
        ([candidate("a", 0, 5, 0), candidate("b", 0, 5)], "b"),  # fewest victims
        ([candidate("a", 0, 5, start=1.0), candidate("b", 0, 5, start=2.0)], "b"),  # latest start
        ([candidate("b", 0, 5), candidate("a", 0, 5)], "a"),  # then the node name
    ],
    ids=["pdb", "highest", "sum", "negative-sum", "count", "start", "name"],
)
def test_order_follows_pick_one_node_for_preemption(cands: list[victims.Candidate], best: str) -> None:
    assert victims.order(cands)[0].node == best
    assert victims.order(reversed(cands))[0].node == best


# ----- property: the chosen set makes the pod fit, and no victim could be spared


def _fits(state: nodes.NodeState, gone: Sequence[victims.Resident], want: requests.PodRequest) -> bool:
    s = state
    for r in gone:
        for u, use in r.reservation:
            i = int(u.rsplit("-", 1)[1])
            old = s.usage[i]
            usage = list(s.usage)
            usage[i] = nodes.CardUsage(
                old.slots - use.slots, old.memory_mib - use.memory_mib, old.cores - use.cores
            )
            s = nodes.NodeState(inventory=s.inventory, usage=tuple(usage))
    return fit.place(s, want, SPREAD).status.ok


@st.composite
def scenes(draw: st.DrawFn) -> tuple[list[victims.Resident], int, requests.PodRequest, int]:
    cards = draw(st.integers(1, 3))
    residents = []
    left = [81920] * cards
    cores_left = [100] * cards
    for k in range(draw(st.integers(0, 8))):
        card = draw(st.integers(0, cards - 1))
        mem = draw(st.sampled_from([5000, 10000, 20000, 40000]))
        cores = draw(st.sampled_from([0, 10, 30, 50]))
        if mem > left[card] or cores > cores_left[card]:
            continue
        left[card] -= mem
        cores_left[card] -= cores
        prio = draw(st.integers(-3, 6))
        residents.append(
            resident(f"r{k}", card, prio, memory=mem, cores=cores, start=float(draw(st.integers(0, 5))))
        )
    want = draw(
        st.sampled_from(
            [
                WHOLE,
                pod("m").gpu(1, memory=50000).obj(),
                pod("two").gpu(2, memory=30000, cores=40).obj(),
            ]
        )
    )
    return residents, draw(st.integers(-2, 7)), want, cards


@settings(max_examples=300, deadline=None)
@given(scenes())
def test_chosen_set_is_sufficient_and_minimal(
    scene: tuple[list[victims.Resident], int, requests.PodRequest, int],
) -> None:
    residents, priority, want, cards = scene
    state = state_with(residents, cards)
    c = victims.select_on_node(state, residents, want, priority, SPREAD)
    lower = [r for r in residents if r.priority < priority]
    if c is None:
        assert not lower or not _fits(state, lower, want)
        return
    assert all(v.priority < priority for v in c.victims)
    assert _fits(state, c.victims, want)
    for v in c.victims:  # sparing any single victim leaves no room: no smaller set by reprieve
        assert not _fits(state, [w for w in c.victims if w is not v], want)
    assert [v.priority for v in c.victims] == sorted((v.priority for v in c.victims), reverse=True)
