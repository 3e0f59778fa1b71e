"""extender.preemption: the orchestrator on the real ClusterCache, driven through the app's handlers.

Evictions go through an ``evict`` function that does what the apiserver and the pod watch would
(the pod leaves the cache); the Eviction API itself is covered by tests/integration/test_evictions.py.
"""

from __future__ import annotations

import argparse
import collections
from typing import Any

import msgspec
import pytest

from gpuslice.cache import cache as caches
from gpuslice.codec import keys, resources
from gpuslice.extender import config, preemption, wire
from gpuslice.extender.http import app as apps
from gpuslice.extender.http import preempt
from gpuslice.framework import nominations, scheduling
from gpuslice.kube import evictions, objects
from gpuslice.model import gangs as model_gangs
from gpuslice.model import status
from gpuslice.policy import victims
from tests.unit import builders
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit

CARD0, CARD1 = builders.uuid("n", 0), builders.uuid("n", 1)


class World:
    """A full node, the pod watch's store, and a preemption wired into the app's handlers."""

    def __init__(
        self, leading: bool = True, refuse: str = "", budgets: tuple[victims.Budget, ...] = ()
    ) -> None:
        self.nominator = nominations.Nominator()
        self.cache = fakes.cluster_cache(builders.node("n").gpus(2, memory=81920), nominator=self.nominator)
        self.store: dict[str, objects.Pod] = {}
        self.evicted: list[str] = []
        self.refuse = refuse
        for name, card, prio in (("lo-a", 0, 1), ("lo-b", 0, 1), ("mid-c", 1, 5), ("mid-d", 1, 5)):
            self.run(name, card, prio)
        self.deps = fakes.make_deps(self.cache)
        self.pre = preemption.Preemption(
            None,
            self.cache,
            self.deps.profile,
            self.deps.events,
            self.deps.metrics,
            self.deps.log,
            self.store.get,
            leading=lambda: leading,
            nominator=self.nominator,
            ttl_s=60.0,
            clock=lambda: fakes.CLOCK,
            evict=self.evict,
            budgets=self.budgets,
        )
        self._budgets = list(budgets)
        self.deps.preemption = self.pre
        self.h = apps.Handlers(self.deps)

    def run(self, name: str, card: int, priority: int) -> None:
        key = f"default/{name}"
        fakes.charge(self.cache, key, "n", (card, 40000, 40), uid=f"uid-{name}")
        self.store[key] = objects.Pod(
            metadata=objects.ObjectMeta(
                name=name, namespace="default", uid=f"uid-{name}", labels={"app": name.split("-")[0]}
            ),
            spec=objects.PodSpec(node_name="n", priority=priority),
        )

    async def budgets(self) -> list[victims.Budget]:
        return self._budgets

    async def evict(self, v: victims.Resident) -> evictions.Result:
        if v.key == self.refuse:
            return evictions.Result(evictions.Outcome.BLOCKED, "429: Cannot evict pod (disruption budget)")
        self.evicted.append(v.key)
        self.cache.remove_pod(v.key)  # the apiserver deletes it and the watch removes it
        self.store.pop(v.key, None)
        return evictions.Result(evictions.Outcome.EVICTED)

    async def filter(
        self, pod: dict[str, Any], priority: int | None = None, never: bool = False
    ) -> list[str]:
        if priority is not None:
            pod["spec"]["priority"] = priority
        if never:
            pod["spec"]["preemptionPolicy"] = victims.PREEMPT_NEVER
        body = msgspec.json.encode({"Pod": pod, "Nodes": None, "NodeNames": ["n"]})
        answer = msgspec.json.decode(await self.h.filter(body))
        await self.pre.wait_idle()
        names: list[str] = answer["NodeNames"]
        return names

    def events(self, reason: str) -> list[tuple[str, str, str, str]]:
        assert isinstance(self.deps.events, fakes.RecordedEvents)
        return [e for e in self.deps.events.events if e[2] == reason]

    def counted(self, outcome: str) -> float:
        got = self.deps.metrics.registry.get_sample_value("gpuslice_preemptions_total", {"outcome": outcome})
        return got or 0.0


def whole(name: str = "hp") -> dict[str, Any]:
    return fakes.gpu_pod(name, pct=100, cores=100)


async def test_the_cheapest_card_is_freed_held_and_handed_to_the_preemptor() -> None:
    w = World()
    assert await w.filter(whole(), priority=100) == []
    assert w.evicted == ["default/lo-a", "default/lo-b"]  # the lower-priority card's pods only
    nom = w.nominator.nomination("default/hp")
    assert nom is not None and {g.uuid for c in nom.alloc.containers for g in c} == {CARD0}
    (preempting,) = w.events("Preempting")
    assert preempting[0] == "default/hp" and CARD0 in preempting[3] and "default/lo-a" in preempting[3]
    assert {e[0] for e in w.events("Preempted")} == {"default/lo-a", "default/lo-b"}
    assert all("default/hp" in e[3] and CARD0 in e[3] for e in w.events("Preempted"))
    assert w.counted("preempted") == 1
    # Another pod sees the freed card taken; the preemptor sees it free.
    assert await w.filter(fakes.gpu_pod("other", mem=5000), priority=0) == []
    assert await w.filter(whole(), priority=100) == ["n"]
    bind = {"PodName": "hp", "PodNamespace": "default", "PodUID": "uid-hp", "Node": "n"}
    answer = msgspec.json.decode(await w.h.bind(msgspec.json.encode(bind)))
    assert answer.get("Error", "") == ""
    assert w.nominator.nomination("default/hp") is None
    assert w.cache.pod_state("default/hp") is caches.PodState.ASSUMED
    alloc = w.cache.pod_allocation("default/hp")
    assert alloc is not None and [g.uuid for c in alloc.containers for g in c] == [CARD0]
    assert fakes.usage(w.cache, "n")[0][1] == 81920  # charged once


async def test_a_budget_read_with_the_watched_labels_steers_the_choice_to_unprotected_pods() -> None:
    # lo-a and lo-b (priority 1, card 0) are the cheapest, but a budget with no disruption left
    # protects app=lo: the pods of card 1 (priority 5, unprotected) are evicted instead
    protect = victims.Budget("default", "keep-lo", victims.Selector(match_labels=(("app", "lo"),)), 0)
    w = World(budgets=(protect,))
    assert await w.filter(whole(), priority=100) == []
    assert w.evicted == ["default/mid-c", "default/mid-d"]
    nom = w.nominator.nomination("default/hp")
    assert nom is not None and {g.uuid for c in nom.alloc.containers for g in c} == {CARD1}


async def test_no_preemption_for_never_equal_priority_or_a_follower() -> None:
    w = World()
    await w.filter(whole(), priority=100, never=True)
    await w.filter(whole("eq"), priority=1)  # nobody strictly lower than 1
    assert w.evicted == [] and w.nominator.nominations() == ()
    follower = World(leading=False)
    await follower.filter(whole(), priority=100)
    assert follower.evicted == [] and follower.nominator.nominations() == ()


async def test_each_preemptor_gets_its_own_card() -> None:
    w = World()
    await w.filter(whole(), priority=100)
    w.run("lo-x", 1, 1)  # a third pod on card 1
    before = list(w.evicted)
    assert await w.filter(whole(), priority=100) == ["n"]  # its nominated card: no second attempt
    assert w.evicted == before
    await w.filter(whole("hp2"), priority=100)  # another preemptor frees card 1
    assert w.evicted == [*before, "default/mid-c", "default/mid-d", "default/lo-x"]


async def test_a_refused_eviction_stops_and_releases_the_nomination() -> None:
    w = World(refuse="default/lo-b")
    await w.filter(whole(), priority=100)
    assert w.evicted == ["default/lo-a"]
    assert w.nominator.nomination("default/hp") is None
    (blocked,) = w.events("PreemptionBlocked")
    assert blocked[1] == "Warning" and "default/lo-b" in blocked[3]
    assert w.counted("blocked") == 1


async def test_no_attempt_when_evicting_cannot_help() -> None:
    w = World()
    await w.filter(fakes.gpu_pod("huge", gpu=3), priority=100)  # 3 cards on a 2-card node: unresolvable
    await w.filter(whole("low"), priority=1)  # nobody has a strictly lower priority
    assert w.evicted == [] and w.nominator.nominations() == ()
    assert w.counted("preempted") == 0 and w.counted("no_candidate") == 1
    await w.filter(whole("low"), priority=1)  # retried by kube-scheduler at once: no new attempt
    assert w.counted("no_candidate") == 1
    later = w.pre.monotonic() + preemption.RETRY_S
    w.pre.monotonic = lambda: later
    await w.filter(whole("low"), priority=1)
    assert w.counted("no_candidate") == 2


def test_only_gpu_capacity_reasons_make_candidates() -> None:
    outcome = scheduling.FilterOutcome(
        [],
        {
            "a": status.INSUFFICIENT_GPU_MEMORY,
            "b": f"{status.GPU_SLOTS_EXHAUSTED},{status.EXCLUSIVE_CONFLICT}",
            "c": status.INSUFFICIENT_CPU,
            "d": status.NODE_LOCK_HELD,
            "e": status.QUOTA_EXCEEDED,
        },
        {"f": status.DEVICE_TYPE_MISMATCH},
        collections.Counter(),
    )
    assert preemption.gpu_candidates(outcome) == ["a", "b"]


async def test_the_sweep_releases_nominations_of_pods_gone_bound_elsewhere_or_expired() -> None:
    w = World()
    await w.filter(whole(), priority=100)
    assert w.nominator.nomination("default/hp") is not None
    w.store["default/hp"] = objects.Pod(
        metadata=objects.ObjectMeta(name="hp", namespace="default", uid="uid-hp"),
        spec=objects.PodSpec(priority=100),
    )
    assert w.pre.sweep() == ()  # pending, known to the watch: kept
    w.store["default/hp"] = objects.Pod(
        metadata=objects.ObjectMeta(name="hp", namespace="default", uid="uid-hp"),
        spec=objects.PodSpec(node_name="elsewhere", priority=100),
    )
    assert w.pre.sweep() == ("default/hp",)
    w.cache.nominate("default/gone", "uid-gone", builders.alloc("n", ((CARD0, 1, 0),)), fakes.CLOCK + 1)
    assert w.pre.sweep() == ("default/gone",)  # not in the watch's store: deleted
    w.store["default/late"] = objects.Pod(
        metadata=objects.ObjectMeta(name="late", namespace="default", uid="u")
    )
    w.cache.nominate("default/late", "u", builders.alloc("n", ((CARD0, 1, 0),)), fakes.CLOCK)
    assert w.pre.sweep() == ("default/late",)  # expired


def test_settings_and_flags() -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    assert config.load(parser.parse_args([]), environ={}).preemption is True
    s = config.load(parser.parse_args(["--preemption", "false", "--nomination-ttl-s", "2m"]), environ={})
    assert (s.preemption, s.nomination_ttl_s) == (False, 120.0)
    with pytest.raises(config.ConfigError, match="nomination_ttl_s"):
        config.load(parser.parse_args(["--nomination-ttl-s", "0"]), environ={})


async def test_a_gang_member_is_never_a_victim() -> None:
    # lo-a and lo-b (card 0) belong to a gang: evicting one would break it, so card 1's pods go
    w = World()
    for name in ("lo-a", "lo-b"):
        old = w.store[f"default/{name}"]
        meta = msgspec.structs.replace(
            old.metadata, annotations={keys.GANG: "train", keys.GANG_MIN_MEMBERS: "2"}
        )
        w.store[f"default/{name}"] = msgspec.structs.replace(old, metadata=meta)
    assert await w.filter(whole(), priority=100) == []
    assert w.evicted == ["default/mid-c", "default/mid-d"]


async def test_a_gang_member_starts_no_preemption() -> None:
    w = World()
    pod = whole()
    pod["metadata"]["annotations"] = {keys.GANG: "g", keys.GANG_MIN_MEMBERS: "1"}
    assert await w.filter(pod, priority=100) == []
    assert w.evicted == [] and w.nominator.nominations() == ()


def test_the_preempt_verb_drops_nodes_with_gang_victims_and_gang_preemptors() -> None:
    w = World()
    snap = w.cache.snapshot()
    request = resources.parse_pod(fakes.gpu_pod("hp", pct=100, cores=100))
    victims_ = {
        "n": wire.MetaVictims(pods=[wire.MetaPod(uid="uid-lo-a")]),
        "m": wire.MetaVictims(pods=[wire.MetaPod(uid="uid-free")]),
    }
    in_gang = {"uid-lo-a"}.__contains__
    assert set(preempt.narrow(snap, request, victims_, w.deps.profile, in_gang)) <= {"m"}
    assert "n" in preempt.narrow(snap, request, victims_, w.deps.profile)
    member = msgspec.structs.replace(
        request, gang=model_gangs.GangRef(namespace="default", name="g", source="annotation", min_member=2)
    )
    assert preempt.narrow(snap, member, victims_, w.deps.profile) == {}
