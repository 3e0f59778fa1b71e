"""Property tests: place/apply/release sequences keep every card within capacity, release restores
the exact state, an exclusive card never shares, and the cache agrees with the model arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.cache import cache as cache_mod
from gpuslice.framework import nominations, registry
from gpuslice.model import allocations, devices, nodes, requests
from gpuslice.policy import fit
from tests.unit.policy import strategies

pytestmark = pytest.mark.unit

POLICIES = ("binpack", "spread", "topology-aware", "topology-aware:lowest-fragmentation", "balanced")


def within_capacity(state: nodes.NodeState) -> bool:
    return all(
        0 <= u.slots <= d.split_count and 0 <= u.memory_mib <= d.memory_mib and 0 <= u.cores <= d.cores
        for d, u in zip(state.inventory.devices, state.usage, strict=True)
    )


def exclusive_cards(alloc: allocations.PodAllocation, state: nodes.NodeState) -> set[str]:
    """Cards (of 100 cores) this pod holds with an exclusive grant."""
    full = {d.uuid for d in state.inventory.devices if d.cores == devices.FULL_CORES}
    return {g.uuid for c in alloc.containers for g in c if g.cores >= devices.FULL_CORES and g.uuid in full}


Op = tuple[str, int, int]  # ("place", pod index, policy index) or ("release", live index, 0)


@settings(max_examples=200, deadline=None)
@given(
    start=strategies.node_states(host=False).filter(within_capacity),
    pods=st.lists(strategies.pods(), min_size=1, max_size=6),
    ops=st.lists(
        st.tuples(st.sampled_from(("place", "place", "release")), st.integers(0, 50), st.integers(0, 50)),
        min_size=1,
        max_size=14,
    ),
)
def test_place_release_sequences(
    start: nodes.NodeState, pods: list[requests.PodRequest], ops: list[Op]
) -> None:
    state = start
    live: list[tuple[str, allocations.PodAllocation]] = []
    c = cache_mod.ClusterCache(nominator=nominations.Nominator())
    c.upsert_node(start.inventory)
    # the starting usage is one pre-existing pod per used card (so the cache starts equal)
    for i, (d, u) in enumerate(zip(start.inventory.devices, start.usage, strict=True)):
        if u.slots:
            pre = allocations.PodAllocation(
                node=start.name,
                containers=tuple(
                    (
                        allocations.DeviceGrant(
                            d.uuid, u.memory_mib if k == 0 else 0, u.cores if k == 0 else 0
                        ),
                    )
                    for k in range(u.slots)
                ),
            )
            c.add_pod(f"pre/{i}", str(i), pre)
    assert c.snapshot().nodes[start.name] == start
    serial = 0
    for kind, a, b in ops:
        if kind == "place":
            pod = pods[a % len(pods)]
            placed = fit.place(state, pod, registry.get(POLICIES[b % len(POLICIES)]))
            if placed.allocation is None:
                continue
            alloc = placed.allocation
            for _, other in live:  # an exclusive card never shares, in either direction
                assert not exclusive_cards(alloc, state) & {g.uuid for cc in other.containers for g in cc}
                assert not exclusive_cards(other, state) & {g.uuid for cc in alloc.containers for g in cc}
            before = state
            state = allocations.apply(state, alloc)
            assert within_capacity(state)
            assert allocations.apply(state, alloc, -1) == before  # release restores exactly
            serial += 1
            key = f"ns/p{serial}"
            assert c.assume(key, key, alloc, 0.0).ok  # the cache agrees it still fits
            live.append((key, alloc))
        elif live:
            key, alloc = live.pop(a % len(live))
            state = allocations.apply(state, alloc, -1)
            c.remove_pod(key)
        assert within_capacity(state)
        assert c.snapshot().nodes[start.name] == state
    # releasing everything returns to the start, whatever the order
    for key, alloc in reversed(live):
        state = allocations.apply(state, alloc, -1)
        c.remove_pod(key)
    assert state == start
    assert c.snapshot().nodes[start.name] == start
