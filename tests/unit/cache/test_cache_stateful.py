"""A hypothesis state machine drives the cache with random watch/bind events and checks it against
a plain model: per-card usage = sum of live pods' reservations, namespace totals, orphans, states.
Watch events carry ``inits_done`` (init containers succeeded, or reset by kubelet), so pods are
recharged between the full and the app-only reservation."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from gpuslice.cache import cache as cache_mod
from gpuslice.framework import nominations
from gpuslice.model import allocations, devices, nodes, status
from gpuslice.policy import quota

pytestmark = pytest.mark.unit

NODES = ("a", "b")
UUIDS = tuple(f"GPU-{n}-{i}" for n in NODES for i in range(3)) + ("GPU-ghost",)
KEYS = tuple(f"{ns}/p{i}" for ns in ("x", "y") for i in range(4))


def inventory(name: str, cards: int) -> nodes.NodeInventory:
    return nodes.NodeInventory(
        name=name,
        devices=tuple(
            devices.GpuDevice(uuid=f"GPU-{name}-{i}", index=i, memory_mib=10**6, cores=10**4, split_count=100)
            for i in range(cards)
        ),
    )


grants = st.tuples(st.sampled_from(UUIDS), st.integers(0, 3000), st.sampled_from((0, 10, 30)))
allocs = st.builds(
    lambda node, cs, init: allocations.PodAllocation(
        node=node,
        containers=tuple(tuple(allocations.DeviceGrant(u, m, c) for u, m, c in g) for g in cs),
        init_count=min(init, len(cs)),
    ),
    st.sampled_from(NODES),
    st.lists(st.lists(grants, max_size=2), min_size=1, max_size=3),
    st.integers(0, 1),
)


class CacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cache = cache_mod.ClusterCache(nominator=nominations.Nominator())
        self.inv: dict[str, nodes.NodeInventory] = {}
        self.pods: dict[str, tuple[allocations.PodAllocation, cache_mod.PodState, float | None]] = {}
        self.done: dict[str, bool] = {}
        self.now = 0.0
        for ns in ("x", "y"):
            self.cache.set_quota(ns, quota.QuotaView(memory_limit=10**12))

    @rule(name=st.sampled_from(NODES), cards=st.integers(0, 3))
    def upsert(self, name: str, cards: int) -> None:
        self.inv[name] = inventory(name, cards)
        self.cache.upsert_node(self.inv[name])

    @rule(name=st.sampled_from(NODES))
    def remove_node(self, name: str) -> None:
        self.inv.pop(name, None)
        self.cache.remove_node(name)

    @rule(key=st.sampled_from(KEYS), alloc=allocs, done=st.booleans())
    def add(self, key: str, alloc: allocations.PodAllocation, done: bool) -> None:
        self.cache.add_pod(key, key, alloc, done)
        self.pods[key] = (alloc, cache_mod.PodState.ADDED, None)
        self.done[key] = done

    @rule(key=st.sampled_from(KEYS), alloc=allocs)
    def assume(self, key: str, alloc: allocations.PodAllocation) -> None:
        if key in self.pods:
            refused = self.cache.assume(key, key, alloc, self.now)
            assert refused.reasons == (status.ALREADY_CACHED,) and not refused.ok
            return
        if self.cache.assume(key, key, alloc, self.now).ok:
            self.pods[key] = (alloc, cache_mod.PodState.ASSUMED, None)
            self.done[key] = False

    @rule(key=st.sampled_from(KEYS), done=st.booleans())
    def confirm(self, key: str, done: bool) -> None:
        """The watch sees a held pod again (same allocation); its init containers done or not."""
        if key in self.pods:
            alloc = self.pods[key][0]
            self.cache.add_pod(key, key, alloc, done)
            self.pods[key] = (alloc, cache_mod.PodState.ADDED, None)
            self.done[key] = done

    @rule(key=st.sampled_from(KEYS))
    def finish(self, key: str) -> None:
        self.cache.finish_binding(key, self.now)
        got = self.pods.get(key)
        if got is not None and got[1] is cache_mod.PodState.ASSUMED:
            self.pods[key] = (got[0], got[1], self.now)

    @rule(key=st.sampled_from(KEYS))
    def forget(self, key: str) -> None:
        got = self.pods.get(key)
        assumed = got is not None and got[1] is cache_mod.PodState.ASSUMED
        assert self.cache.forget(key) is assumed
        if assumed:
            del self.pods[key]

    @rule(key=st.sampled_from(KEYS))
    def remove(self, key: str) -> None:
        self.cache.remove_pod(key)
        self.pods.pop(key, None)

    @rule(dt=st.sampled_from((1.0, 10.0, 40.0)))
    def tick_and_expire(self, dt: float) -> None:
        self.now += dt
        expected = sorted(
            k
            for k, (_, s, b) in self.pods.items()
            if s is cache_mod.PodState.ASSUMED and b is not None and self.now - b >= 30.0
        )
        assert self.cache.expire(self.now, 30.0) == tuple(expected)
        for k in expected:
            del self.pods[k]

    @invariant()
    def matches_model(self) -> None:
        snap = self.cache.snapshot()
        assert set(snap.nodes) == set(self.inv)
        want: dict[str, nodes.CardUsage] = {}
        orphans = set()
        per_ns = {"x": [0, 0, 0], "y": [0, 0, 0]}
        for key, (alloc, state, _) in self.pods.items():
            assert self.cache.pod_state(key) is state
            reservation = allocations.card_reservation(alloc, self.done[key])
            for r in reservation.values():
                t = per_ns[key.split("/")[0]]
                t[0] += r.slots
                t[1] += r.memory_mib
                t[2] += r.cores
            known = {d.uuid for d in self.inv[alloc.node].devices} if alloc.node in self.inv else set()
            for u, r in reservation.items():
                if u in known:
                    w = want.get(u, nodes.EMPTY_CARD)
                    want[u] = nodes.CardUsage(
                        w.slots + r.slots, w.memory_mib + r.memory_mib, w.cores + r.cores
                    )
                else:
                    orphans.add((alloc.node, u, key))
        for name, inv in self.inv.items():
            st_ = snap.nodes[name]
            assert st_.inventory == inv
            for d, got in zip(inv.devices, st_.usage, strict=True):
                assert got == want.get(d.uuid, nodes.EMPTY_CARD)
            row = snap.columns.row_of[name]
            assert list(snap.columns.card("used_mem")[row, : len(inv.devices)]) == [
                u.memory_mib for u in st_.usage
            ]
        assert {(o.node, o.uuid, o.pod) for o in snap.orphans} == orphans
        for ns, (c, m, k) in per_ns.items():
            q = snap.quota(ns)
            assert q is not None
            assert (q.used_count, q.used_memory, q.used_cores) == (c, m, k)
        for key in KEYS:
            if key not in self.pods:
                assert self.cache.pod_state(key) is None


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
