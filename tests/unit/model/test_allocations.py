"""model.allocations: HAMi's init-container charge, its release once inits succeed, quota totals."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.model import allocations, nodes
from tests.unit.builders import alloc, node, uuid

pytestmark = pytest.mark.unit

A, B, C = uuid("n", 0), uuid("n", 1), uuid("n", 2)
U = nodes.CardUsage

RESERVATIONS = [
    # (id, allocation, charge while initialising, charge once every init container succeeded)
    ("app-only", alloc("n", ((A, 1000, 10),)), {A: U(1, 1000, 10)}, {A: U(1, 1000, 10)}),
    (
        "two-apps-sum",
        alloc("n", ((A, 1000, 10),), ((A, 500, 20), (B, 700, 0))),
        {A: U(2, 1500, 30), B: U(1, 700, 0)},
        {A: U(2, 1500, 30), B: U(1, 700, 0)},
    ),
    (
        # an init container larger than the app: init 5000 on A, app 1500 on A -> 5000 until done, 1500 after
        "init-peak-above-app",
        alloc("n", ((A, 5000, 0),), ((A, 1500, 0),), init_count=1),
        {A: U(1, 5000, 0)},
        {A: U(1, 1500, 0)},
    ),
    (
        # two inits run one at a time: the peak per dimension, not the sum
        "init-peak-is-max-per-dimension",
        alloc("n", ((A, 3000, 10),), ((A, 1000, 60),), ((A, 500, 5),), init_count=2),
        {A: U(1, 3000, 60)},
        {A: U(1, 500, 5)},
    ),
    (
        "app-sum-above-init",
        alloc("n", ((A, 1000, 10),), ((A, 800, 20),), ((A, 800, 20),), init_count=1),
        {A: U(2, 1600, 40)},
        {A: U(2, 1600, 40)},
    ),
    (
        # a card only the init container used: 1 slot until done, nothing after
        "init-only-card-released",
        alloc("n", ((B, 4000, 30),), ((A, 1000, 0),), init_count=1),
        {A: U(1, 1000, 0), B: U(1, 4000, 30)},
        {A: U(1, 1000, 0)},
    ),
    (
        "init-without-gpu",
        alloc("n", (), ((A, 1000, 0),), init_count=1),
        {A: U(1, 1000, 0)},
        {A: U(1, 1000, 0)},
    ),
    ("app-without-gpu", alloc("n", ((A, 2000, 0),), (), init_count=1), {A: U(1, 2000, 0)}, {}),
    ("no-gpu", alloc("n", (), ()), {}, {}),
]


@pytest.mark.parametrize(
    ("a", "full", "app"), [r[1:] for r in RESERVATIONS], ids=[r[0] for r in RESERVATIONS]
)
def test_card_reservation(
    a: allocations.PodAllocation, full: dict[str, nodes.CardUsage], app: dict[str, nodes.CardUsage]
) -> None:
    assert allocations.card_reservation(a) == full
    assert allocations.card_reservation(a, inits_done=False) == full
    assert allocations.card_reservation(a, inits_done=True) == app


def test_charge_totals_sum_slots_memory_cores() -> None:
    assert allocations.charge_totals({}) == (0, 0, 0)
    assert allocations.charge_totals({A: U(2, 1500, 30), B: U(1, 700, 0), C: U(3, 1, 1)}) == (6, 2201, 31)


def test_apply_uses_the_same_rule() -> None:
    state = node("n").gpus(2, memory=10000).state()
    a = alloc("n", ((B, 4000, 30),), ((A, 1000, 0),), init_count=1)
    full = allocations.apply(state, a)
    assert full.usage == (U(1, 1000, 0), U(1, 4000, 30))
    done = allocations.apply(state, a, inits_done=True)
    assert done.usage == (U(1, 1000, 0), nodes.EMPTY_CARD)
    assert allocations.apply(done, a, -1, inits_done=True).usage == state.usage


grants = st.tuples(st.sampled_from((A, B, C)), st.integers(0, 5000), st.integers(0, 100))
allocs = st.lists(st.lists(grants, max_size=3), min_size=1, max_size=5).flatmap(
    lambda cs: st.builds(
        lambda init: allocations.PodAllocation(
            node="n",
            containers=tuple(tuple(allocations.DeviceGrant(u, m, k) for u, m, k in g) for g in cs),
            init_count=init,
        ),
        st.integers(0, len(cs)),
    )
)


def app_only(a: allocations.PodAllocation) -> dict[str, nodes.CardUsage]:
    """Plain sums over the app containers, independent of card_reservation's code."""
    out: dict[str, nodes.CardUsage] = {}
    for grants_ in a.containers[a.init_count :]:
        for g in grants_:
            u = out.get(g.uuid, nodes.EMPTY_CARD)
            out[g.uuid] = U(u.slots + 1, u.memory_mib + g.memory_mib, u.cores + g.cores)
    return out


@given(allocs)
@settings(max_examples=300, deadline=None)
def test_release_never_grows_and_equals_the_app_charge(a: allocations.PodAllocation) -> None:
    full = allocations.card_reservation(a)
    done = allocations.card_reservation(a, inits_done=True)
    assert done == app_only(a)
    assert done.keys() <= full.keys()
    for card, d in done.items():
        f = full[card]
        assert d.slots <= f.slots and d.memory_mib <= f.memory_mib and d.cores <= f.cores
    small, big = allocations.charge_totals(done), allocations.charge_totals(full)
    assert all(s <= b for s, b in zip(small, big, strict=True))
    if a.init_count == 0:
        assert done == full
