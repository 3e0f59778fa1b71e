"""Properties of MIG placement under random arrivals and departures, for both rules.

Every instance handed out is a legal placement of its profile on its card, no two instances on
a card share a memory slice, the cache's own check (``cards.admits``) accepts every placement, a
departure gives back exactly what the arrival took, and for one instance the two rules agree on
whether a node can take it (they search the same candidates; only the choice differs).
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from gpuslice.framework import registry
from gpuslice.model import allocations, devices, mig, nodes, requests
from gpuslice.policy import api, cards, fit
from gpuslice.policy import mig as migs

P = mig.Placement


def _table(gb: int) -> tuple[mig.Profile, ...]:
    """An A100 (40 or 80 GB) profile table, as NVIDIA's MIG user guide lists it."""
    unit = gb // 8 * 1024
    rows = [
        ("1g", unit, 1, 1, tuple(range(7))),
        ("2g", 2 * unit, 2, 2, (0, 2, 4)),
        ("3g", 4 * unit, 3, 4, (0, 4)),
        ("4g", 4 * unit, 4, 4, (0,)),
        ("7g", 8 * unit, 7, 8, (0,)),
    ]
    return tuple(
        mig.Profile(
            name=f"{g}.{mem // 1024}gb",
            memory_mib=mem,
            cores=-(-slices * 100 // 7),
            slice_count=slices,
            placements=tuple(P(s, size) for s in starts),
        )
        for g, mem, slices, size, starts in rows
    )


TABLES = (_table(40), _table(80))


@st.composite
def _nodes(draw: st.DrawFn) -> list[nodes.NodeState]:
    out = []
    for n in range(draw(st.integers(1, 3))):
        cards_ = []
        for k in range(draw(st.integers(1, 4))):
            mode = draw(st.sampled_from((devices.MODE_MIG, devices.MODE_MIG, devices.MODE_HAMI_CORE)))
            gb = draw(st.sampled_from((40, 80)))
            cards_.append(
                devices.GpuDevice(
                    uuid=f"GPU-{n}-{k}",
                    index=k,
                    type=f"NVIDIA A100 {gb}GB",
                    memory_mib=gb * 1024,
                    split_count=7 if mode == devices.MODE_MIG else 10,
                    mode=mode,
                    mig_profiles=TABLES[gb == 80] if mode == devices.MODE_MIG else (),
                )
            )
        out.append(nodes.empty_state(nodes.NodeInventory(name=f"n{n}", devices=tuple(cards_))))
    return out


_request = st.tuples(
    st.integers(1, 3),  # instances in the container
    st.sampled_from((3000, 5000, 9000, 12000, 20000, 30000, 40000, 70000)),
    st.sampled_from((None, devices.MODE_MIG)),
)
_steps = st.lists(st.tuples(st.booleans(), _request, st.integers(0, 1000)), min_size=1, max_size=40)


def _pod(count: int, memory: int, mode: str | None) -> requests.PodRequest:
    sel = requests.NO_SELECTORS if mode is None else requests.Selectors(mode=mode)
    ctr = requests.ContainerRequest(count=count, memory_mib=memory)
    return requests.PodRequest(name="p", namespace="d", containers=(ctr,), selectors=sel)


def _check(state: nodes.NodeState) -> None:
    for dev, used in zip(state.inventory.devices, state.usage, strict=True):
        if not dev.is_mig:
            assert used.mig == ()
            continue
        assert mig.overlapping(used.mig) == []
        for s in used.mig:
            assert migs.legal(dev, s), (dev.uuid, s)
            assert s.end <= mig.slices_of(dev.mig_profiles)


@settings(max_examples=150, deadline=None)
@given(states=_nodes(), steps=_steps, rule=st.sampled_from(migs.RULES))
def test_instances_are_legal_and_never_overlap(
    states: list[nodes.NodeState], steps: list[tuple[bool, tuple[int, int, str | None], int]], rule: str
) -> None:
    ctx = api.Context(mig_rule=rule)
    policy = registry.card_policy("binpack")
    by_name = {s.name: s for s in states}
    placed: list[allocations.PodAllocation] = []
    for leave, (count, memory, mode), pick in steps:
        if leave and placed:
            gone = placed.pop(pick % len(placed))
            before = by_name[gone.node]
            by_name[gone.node] = after = allocations.apply(before, gone, -1)
            assert all(u.slots >= 0 and u.memory_mib >= 0 for u in after.usage)
            _check(after)
            continue
        pod = _pod(count, memory, mode)
        for name in sorted(by_name):
            state = by_name[name]
            p = fit.place(state, pod, policy, ctx)
            if p.allocation is None:
                continue
            reservation = allocations.card_reservation(p.allocation)
            index = {d.uuid: i for i, d in enumerate(state.inventory.devices)}
            for uuid, add in reservation.items():
                i = index[uuid]
                assert cards.admits(state.inventory.devices[i], state.usage[i], add, False) is None
            for grants in p.allocation.containers:
                for g in grants:
                    dev = state.inventory.devices[index[g.uuid]]
                    assert (g.mig is not None) == dev.is_mig
                    if g.mig is not None:
                        prof = mig.find(dev.mig_profiles, g.mig.profile)
                        assert prof is not None and prof.memory_mib >= memory
                        assert (g.memory_mib, g.cores) == (prof.memory_mib, prof.cores)
            by_name[name] = allocations.apply(state, p.allocation)
            _check(by_name[name])
            placed.append(p.allocation)
            break
    for alloc in placed:  # everything leaves: every card is empty again
        by_name[alloc.node] = allocations.apply(by_name[alloc.node], alloc, -1)
    for state in by_name.values():
        assert all(u == nodes.EMPTY_CARD for u in state.usage)


@settings(max_examples=150, deadline=None)
@given(states=_nodes(), steps=_steps)
def test_rules_agree_on_feasibility_of_one_instance(
    states: list[nodes.NodeState], steps: list[tuple[bool, tuple[int, int, str | None], int]]
) -> None:
    policy = registry.card_policy("spread")
    first, frag = api.Context(mig_rule=migs.FIRST_FIT), api.Context(mig_rule=migs.FRAGMENTATION)
    state = states[0]
    for _, (_, memory, _), _ in steps:
        pod = _pod(1, memory, devices.MODE_MIG)
        a = fit.place(state, pod, policy, first)
        b = fit.place(state, pod, policy, frag)
        assert a.status == b.status
        if b.allocation is None:
            break
        state = allocations.apply(state, b.allocation)
        assert migs.node_stranded(state, frag) >= 0
