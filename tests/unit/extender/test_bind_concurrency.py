from __future__ import annotations

import asyncio
import collections
import dataclasses
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslice.cache import cache as caches
from gpuslice.codec import keys, resources
from gpuslice.extender import config, wire
from gpuslice.extender.binding import bind as binds
from gpuslice.model import allocations, devices, nodes
from gpuslice.policy import cards
from tests.unit import builders
from tests.unit.builders import node
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit

CARD_MIB = 81920


def _charged_by_pods(cache: caches.ClusterCache, keys_: list[str]) -> dict[str, tuple[int, int, int]]:
    """Card UUID -> (slots, MiB, cores) summed over what the cache charges for ``keys_``."""
    out: dict[str, tuple[int, int, int]] = collections.defaultdict(lambda: (0, 0, 0))
    for key in keys_:
        alloc = cache.pod_allocation(key)
        if alloc is None:
            continue
        for uuid, r in allocations.card_reservation(alloc).items():
            s, m, c = out[uuid]
            out[uuid] = (s + r.slots, m + r.memory_mib, c + r.cores)
    return dict(out)


def _snapshot_usage(cache: caches.ClusterCache) -> dict[str, tuple[int, int, int]]:
    out = {}
    for state in cache.snapshot().nodes.values():
        for i, dev in enumerate(state.inventory.devices):
            u = state.usage[i]
            if u != nodes.EMPTY_CARD:
                out[dev.uuid] = (u.slots, u.memory_mib, u.cores)
    return out


async def _bind_all(
    sizes: list[tuple[int, int, int]], delay: float
) -> tuple[caches.ClusterCache, fakes.FakeBinder, int]:
    cache = fakes.cluster_cache(*(node(f"n{i}").gpus(2) for i in range(2)))
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
    assert all(r.result in (binds.Result.BOUND, binds.Result.NO_FIT) for r in results), results
    return cache, binder, sum(1 for r in results if r.ok)


def test_concurrent_binds_fill_exactly_the_capacity() -> None:
    # 20 pods of 30000 MiB, 10 per node; a card holds 2 (60000 <= 81920 < 90000): 2 nodes x 2 cards x 2 = 8.
    sizes = [(30000, 0, k % 2) for k in range(20)]
    cache, binder, ok = asyncio.run(_bind_all(sizes, delay=0.001))
    assert ok == 8 == len(binder.bound)
    assert fakes.overcommitted(cache) == []
    bound = sorted(binder.bound)
    assert all(cache.pod_state(k) is caches.PodState.ASSUMED for k in bound)
    per_card = collections.Counter(
        g.uuid
        for k in bound
        for grants in (cache.pod_allocation(k) or builders.alloc("none")).containers
        for g in grants
    )
    assert sorted(per_card.values()) == [2, 2, 2, 2]
    for state in cache.snapshot().nodes.values():
        for i, dev in enumerate(state.inventory.devices):
            assert state.usage[i].memory_mib == 60000 <= dev.memory_mib
    # Every bound pod's annotations name exactly the grants the cache holds.
    assert binder.charged() == {k: cache.pod_allocation(k) for k in bound}
    for k in bound:
        assert binder.annotations[k][keys.VGPU_NODE] == binder.bound[k]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(1000, 81920), st.sampled_from([0, 10, 50, 100]), st.integers(0, 1)),
        min_size=1,
        max_size=16,
    )
)
def test_no_interleaving_of_binds_overcommits_a_card(sizes: list[tuple[int, int, int]]) -> None:
    cache, binder, ok = asyncio.run(_bind_all(sizes, delay=0.0005))
    assert fakes.overcommitted(cache) == []
    assert ok == len(binder.bound)
    everyone = [f"default/p{k}" for k in range(len(sizes))]
    # The cache charges the bound pods, once each, and nothing else.
    assert {k for k in everyone if cache.pod_allocation(k) is not None} == set(binder.bound)
    assert _charged_by_pods(cache, everyone) == _snapshot_usage(cache)


# ----------------------------------------------------------------------------- with faults


@dataclasses.dataclass(frozen=True)
class _Plan:
    """One bind of the property test below."""

    mem: int
    cores: int
    node: int
    fault_op: str | None  # lock / annotate / bind / read (the resolver's), or None
    ambiguous: bool
    applied: bool
    times: int


_plans = st.builds(
    _Plan,
    mem=st.integers(1000, CARD_MIB),
    cores=st.sampled_from([0, 10, 50, 100]),
    node=st.integers(0, 1),
    fault_op=st.sampled_from([None, None, "lock", "annotate", "bind", "read"]),
    ambiguous=st.booleans(),
    applied=st.booleans(),
    times=st.integers(1, 3),
)
_foreign = st.lists(
    st.tuples(st.integers(0, 1), st.integers(500, CARD_MIB), st.sampled_from([0, 10, 50, 100])),
    max_size=8,
)


def _truth_usage(
    cache: caches.ClusterCache, binder: fakes.FakeBinder, node_name: str
) -> list[nodes.CardUsage]:
    """Per card of the node: what the API's device claims add up to (the truth another writer sees)."""
    inv = cache.snapshot().nodes[node_name].inventory
    index = {d.uuid: i for i, d in enumerate(inv.devices)}
    used = [nodes.EMPTY_CARD] * len(inv.devices)
    claims = list(binder.charged().values()) + [fakes.claimed_allocation(p) for p in binder.claimed]
    for alloc in claims:
        if alloc.node != node_name:
            continue
        for uuid, r in allocations.card_reservation(alloc).items():
            i = index[uuid]
            u = used[i]
            used[i] = nodes.CardUsage(u.slots + r.slots, u.memory_mib + r.memory_mib, u.cores + r.cores)
    return used


async def _chaos(plans: list[_Plan], foreign: list[tuple[int, int, int]], delays: list[float]) -> None:
    cache = fakes.cluster_cache(*(node(f"n{i}").gpus(2) for i in range(2)))
    binder = fakes.FakeBinder()
    binder.delays = delays
    binder.plugin_releases_lock = True
    pending_foreign = list(foreign)
    injected: list[str] = []

    def other_writer(node_name: str) -> None:
        """Before our truth read: another writer's pod lands on a card of the node, if the API's
        claims leave room for it there (it cannot see our reservations, only what is written)."""
        if not pending_foreign:
            return
        card, mem, cores = pending_foreign.pop(0)
        inv = cache.snapshot().nodes[node_name].inventory
        dev = inv.devices[card]
        add = nodes.CardUsage(1, mem, cores)
        now = _truth_usage(cache, binder, node_name)[card]
        if cards.admits(dev, now, add, cores >= devices.FULL_CORES) is not None:
            return  # no room on the card in what is written: the other writer places nothing
        name = f"f{len(injected)}"
        binder.claimed.append(fakes.claim(name, builders.alloc(node_name, ((dev.uuid, mem, cores),))))
        injected.append(f"other/{name}")

    truth = fakes.ApiTruth(cache, binder, before=other_writer)
    settings_ = config.Settings(lock_wait_s=0.05, bind_timeout_s=5.0, commit_deadline_s=1.0)
    deps = fakes.make_deps(cache, binder, settings_, truth=truth, clock=time.time)
    flow = deps.flow
    args = []
    for k, plan in enumerate(plans):
        pod = fakes.gpu_pod(f"p{k}", mem=plan.mem, cores=plan.cores)
        binder.pods[f"default/p{k}"] = pod
        flow.remember(resources.parse_pod(pod))
        args.append(wire.ExtenderBindingArgs(f"p{k}", "default", f"uid-p{k}", f"n{plan.node}"))
        if plan.fault_op is not None:
            binder.fail_pod[(plan.fault_op, f"default/p{k}")] = fakes.Fault(
                "chaos", ambiguous=plan.ambiguous, times=plan.times, applied=plan.applied
            )
    outcomes = await asyncio.gather(*(flow.bind(a) for a in args))
    await flow.drain()
    assert not flow.live()
    allowed = {
        binds.Result.BOUND,
        binds.Result.PENDING,
        binds.Result.FAILED,
        binds.Result.NO_FIT,
        binds.Result.BUSY,
    }
    assert {o.result for o in outcomes} <= allowed, outcomes

    ours = [f"default/p{k}" for k in range(len(plans))]
    assert fakes.overcommitted(cache) == [], outcomes
    # Every bound pod is charged, with the very grants its annotations name.
    for key, node_name in binder.bound.items():
        alloc = cache.pod_allocation(key)
        assert alloc is not None and alloc.node == node_name, (key, outcomes)
        assert binder.charged()[key] == alloc
    # The cache charges nothing of ours but bound pods and claims still on the API (a bind undone
    # whose annotations could not be removed: the truth check charged them, the recovery loop
    # clears them later); each once, and its totals are exactly the sum of what it holds.
    api_claims = binder.charged()
    for key in ours:
        held = cache.pod_allocation(key)
        assert held is None or key in binder.bound or api_claims.get(key) == held, (key, outcomes)
    for k, outcome in enumerate(outcomes):
        if outcome.ok:
            assert f"default/p{k}" in binder.bound
    assert _charged_by_pods(cache, ours + injected) == _snapshot_usage(cache)
    # What the watch would do next (confirm every claim on the API) keeps every card within bounds.
    for key, alloc in api_claims.items():
        cache.add_pod(key, f"uid-{key.split('/', 1)[1]}", alloc)
    for theirs in binder.claimed:
        cache.add_pod(theirs.key, theirs.metadata.uid, fakes.claimed_allocation(theirs))
    assert fakes.overcommitted(cache) == []


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    plans=st.lists(_plans, min_size=1, max_size=10),
    foreign=_foreign,
    delays=st.lists(st.sampled_from([0.0, 0.0005, 0.002]), min_size=1, max_size=6),
)
def test_faults_and_foreign_pods_never_overcommit_and_charge_bound_pods_once(
    monkeypatch: pytest.MonkeyPatch,
    plans: list[_Plan],
    foreign: list[tuple[int, int, int]],
    delays: list[float],
) -> None:
    """Concurrent binds with random delays (interleavings), random definite and ambiguous API
    failures (some of them landed) and other writers' pods appearing under the node lock."""
    monkeypatch.setattr(binds, "RESOLVE_BACKOFF_S", (0.001, 0.002))
    asyncio.run(_chaos(plans, foreign, delays))
