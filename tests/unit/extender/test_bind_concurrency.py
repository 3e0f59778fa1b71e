from __future__ import annotations

import asyncio
import collections

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslice.codec import resources
from gpuslice.extender import wire
from gpuslice.model import allocations
from tests.unit.builders import node
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit

CARD_MIB = 81920


def _overcommitted(cache: fakes.FakeCache) -> list[str]:
    """Cards whose summed grants exceed memory, cores or slots."""
    snap = cache.snapshot()
    bad = []
    for state in snap.nodes.values():
        for i, dev in enumerate(state.inventory.devices):
            u = state.usage[i]
            if u.memory_mib > dev.memory_mib or u.cores > dev.cores or u.slots > dev.split_count:
                bad.append(dev.uuid)
    return bad


async def _bind_all(
    sizes: list[tuple[int, int, int]], delay: float
) -> tuple[fakes.FakeCache, fakes.FakeBinder, int]:
    cache = fakes.FakeCache([node(f"n{i}").gpus(2).state() for i in range(2)])
    binder = fakes.FakeBinder()
    binder.delay = delay
    binder.plugin_releases_lock = True
    deps = fakes.make_deps(cache, binder)
    args = []
    for k, (mem, cores, target) in enumerate(sizes):
        pod = fakes.gpu_pod(f"p{k}", mem=mem, cores=cores)
        deps.flow.remember(resources.parse_pod(pod))
        args.append(wire.ExtenderBindingArgs(f"p{k}", "default", f"uid-p{k}", f"n{target}"))
    results = await asyncio.gather(*(deps.flow.bind(a) for a in args))
    return cache, binder, sum(1 for r in results if r == "")


def test_concurrent_binds_fill_exactly_the_capacity() -> None:
    # 20 pods of 30000 MiB, 10 per node; a card holds 2 (60000 <= 81920 < 90000): 2 nodes x 2 cards x 2 = 8.
    sizes = [(30000, 0, k % 2) for k in range(20)]
    cache, binder, ok = asyncio.run(_bind_all(sizes, delay=0.001))
    assert ok == 8
    assert _overcommitted(cache) == []
    assert len(cache.pods) == 8 and all(bound for _, _, bound in cache.pods.values())
    per_card = collections.Counter(
        g.uuid for _, alloc, _ in cache.pods.values() for grants in alloc.containers for g in grants
    )
    assert sorted(per_card.values()) == [2, 2, 2, 2]
    # Every bound pod's annotations name exactly the grants the cache holds.
    for key, (_, alloc, _) in cache.pods.items():
        assert binder.annotations[key]["hami.io/vgpu-node"] == alloc.node


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(1000, 81920), st.sampled_from([0, 10, 50, 100]), st.integers(0, 1)),
        min_size=1,
        max_size=16,
    )
)
def test_no_interleaving_of_binds_overcommits_a_card(sizes: list[tuple[int, int, int]]) -> None:
    cache, _, ok = asyncio.run(_bind_all(sizes, delay=0.0005))
    assert _overcommitted(cache) == []
    assert ok == len(cache.pods)
    for _, alloc, _ in cache.pods.values():
        assert isinstance(alloc, allocations.PodAllocation)


def test_concurrent_binds_against_the_real_cluster_cache() -> None:
    from gpuslice.cache import cache as caches

    real = caches.ClusterCache()
    for i in range(2):
        real.upsert_node(node(f"n{i}").gpus(2).state().inventory)
    binder = fakes.FakeBinder()
    binder.delay = 0.001
    binder.plugin_releases_lock = True
    deps = fakes.make_deps(real, binder)
    args = []
    for k in range(20):
        pod = fakes.gpu_pod(f"p{k}", mem=30000)
        deps.flow.remember(resources.parse_pod(pod))
        args.append(wire.ExtenderBindingArgs(f"p{k}", "default", f"uid-p{k}", f"n{k % 2}"))

    async def run() -> list[str]:
        return list(await asyncio.gather(*(deps.flow.bind(a) for a in args)))

    results = asyncio.run(run())
    # 2 nodes x 2 cards x 2 pods of 30000 MiB per 81920 MiB card = 8.
    assert sum(1 for r in results if r == "") == 8
    for state in real.snapshot().nodes.values():
        for i, dev in enumerate(state.inventory.devices):
            assert state.usage[i].memory_mib == 60000 <= dev.memory_mib
