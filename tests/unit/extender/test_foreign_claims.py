"""Another scheduler's filter claim on a Pending pod, through the real feed, cache and bind flow.

HAMi's filter claimed the node's only card whole for pod ``default/p`` and its scheduler never
bound it. While the claim is held the cache charges it and the bind refuses the pod, saying why and
for how long; once stale (older than the node lock expiry, no lock naming the pod) the cache drops
it, the pod's own request fits the card it freed, and the Binding overwrites the claim. Only the API
is faked (``fakes.FakeBinder``); the clock is a variable.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec
import pytest
from starlette.testclient import TestClient

from gpuslice.cache import cache as caches
from gpuslice.codec import keys, pod_devices, registrations, resources
from gpuslice.codec import locks as lockcodec
from gpuslice.extender import config, feed, metrics, wire
from gpuslice.extender.binding import bind as binds
from gpuslice.extender.http import app as apps
from gpuslice.framework import logs, nominations
from gpuslice.kube import claims, informer, objects
from gpuslice.model import allocations, devices, status
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit

ADDED, MODIFIED = informer.EventType.ADDED, informer.EventType.MODIFIED
NOW = fakes.CLOCK
EXPIRY = 300.0
NODE, CARD = "n1", "GPU-n1-0"
P = "default/p"
WHOLE = allocations.PodAllocation(node=NODE, containers=((allocations.DeviceGrant(CARD, 81920, 100),),))
"""HAMi's claim: the whole card."""


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _node(lock: str | None = None) -> objects.Node:
    reg = registrations.encode_json(
        [devices.GpuDevice(uuid=CARD, index=0, type="NVIDIA A100", memory_mib=81920)]
    )
    ann = {keys.NODE_REGISTER: reg}
    if lock is not None:
        ann[keys.NODE_LOCK] = lock
    return objects.Node(metadata=objects.ObjectMeta(name=NODE, annotations=ann, resource_version="7"))


def _pod_dict(claim: dict[str, str] | None, node_name: str = "") -> dict[str, Any]:
    """Pod ``p`` asking 8000 MiB of one card, with HAMi's filter claim (``claim``) on it."""
    body = fakes.gpu_pod("p", mem=8000, annotations=dict(claim) if claim else None)
    if claim:
        body["metadata"]["labels"] = {keys.VGPU_NODE: claim[keys.VGPU_NODE]}
    if node_name:
        body["spec"]["nodeName"] = node_name
    return body


def _pod(claim: dict[str, str] | None, node_name: str = "") -> objects.Pod:
    return objects.decode_pod(msgspec.json.encode(_pod_dict(claim, node_name)))


class Setup:
    """A feed on a fake clock, its cache, and a bind flow whose truth is the feed."""

    def __init__(self, written: float, settings: config.Settings | None = None, seen: bool = True) -> None:
        self.clock = Clock()
        self.cache = caches.ClusterCache(nominator=nominations.Nominator())
        self.freed: list[str] = []
        self.feed = feed.Feed(
            object(),  # type: ignore[arg-type]  # informers are built but never run here
            self.cache,
            settings or config.Settings(node_lock_expiry_s=EXPIRY),
            logs.Log(0),
            metrics.Metrics(),
        )
        self.feed.clock = self.clock
        self.feed.on_capacity_freed.add(self.freed.append)
        self.node_event(_node(), ADDED)
        self.feed.sync.pods.resource_version = "999999"  # the watch is past every lock write: no reads
        self.claim = pod_devices.filter_annotations(WHOLE, written)
        if seen:  # else the pod watch has not shown the pod yet
            self.feed.sync.pods.handler(informer.Event(ADDED, _pod(self.claim)))
        self.binder = fakes.FakeBinder({P: _pod_dict(self.claim)})
        self.use(self.feed)

    def use(self, truth: binds.Truth) -> None:
        """Bind with this truth check (and claim source, when it is one)."""
        self.deps = fakes.make_deps(self.cache, self.binder, truth=truth, clock=self.clock)
        self.events: fakes.RecordedEvents = self.deps.flow.events  # type: ignore[assignment]

    def node_event(self, node: objects.Node, type_: informer.EventType = MODIFIED) -> None:
        """What the node informer does: store the node, then hand the event on."""
        self.feed.sync.nodes.store[node.metadata.name] = node
        self.feed.sync.nodes.handler(informer.Event(type_, node))

    def bind(self) -> tuple[bool, str]:
        self.deps.flow.remember(resources.parse_pod(_pod_dict(self.claim)))
        outcome = asyncio.run(self.deps.flow.bind(wire.ExtenderBindingArgs("p", "default", "uid-p", NODE)))
        return outcome.ok, outcome.error

    def charged(self) -> list[tuple[int, int, int]]:
        return fakes.usage(self.cache, NODE)

    def reasons(self) -> list[str]:
        return [reason for _, _, reason, _ in self.events.events]


def test_a_young_claim_is_charged_and_its_pod_waits_with_the_reason() -> None:
    s = Setup(written=NOW - 100)
    assert s.cache.pod_state(P) is caches.PodState.ADDED
    assert s.charged() == [(1, 81920, 100)]
    ok, error = s.bind()
    assert not ok
    # written at NOW - 100 (counted from the end of that second): held for 300 - 99 = 201 s more
    assert f"another scheduler's claim on node {NODE}" in error and "in 201s" in error, error
    assert s.binder.calls == []  # refused before any API call: no lock, no write
    assert s.binder.bound == {} and s.charged() == [(1, 81920, 100)]


def test_an_old_claim_is_not_charged_and_the_binding_overwrites_it() -> None:
    s = Setup(written=NOW - EXPIRY - 60)
    assert s.cache.pod_state(P) is None and s.charged() == [(0, 0, 0)]
    ok, error = s.bind()
    assert ok, error
    assert s.binder.bound == {P: NODE}
    ours = s.binder.annotations[P]
    # every key of HAMi's claim rewritten with gpuslice's decision (8000 MiB, not the whole card)
    assert ours[keys.VGPU_TIME] == str(int(NOW)) != s.claim[keys.VGPU_TIME]
    assert ours[keys.DEVICES_ALLOCATED] == ours[keys.DEVICES_TO_ALLOCATE] == f"{CARD},NVIDIA,8000,0:;"
    assert ours[keys.BIND_PHASE] == keys.BIND_PHASE_ALLOCATING
    assert s.charged() == [(1, 8000, 0)]
    assert s.reasons() == ["GPUAllocated", "StaleClaimReplaced"]
    note = s.events.events[-1][3]
    assert f"stale claim on node {NODE}" in note and f"written at {int(NOW - EXPIRY - 60)}" in note, note


def test_the_claim_turns_stale_with_time_alone() -> None:
    s = Setup(written=NOW - 100)
    assert not s.bind()[0]
    s.clock.now = NOW + 200  # 299 s since the end of its second: still held
    s.feed.recheck_claims()
    assert s.charged() == [(1, 81920, 100)] and s.freed == []
    s.clock.now = NOW + 202  # 301 s: stale; the feed's next pass drops it and nudges the Pending pods
    s.feed.recheck_claims()
    assert s.cache.pod_state(P) is None and s.charged() == [(0, 0, 0)]
    assert s.freed == [NODE]
    ok, error = s.bind()
    assert ok, error
    assert s.charged() == [(1, 8000, 0)] and "StaleClaimReplaced" in s.reasons()


def test_the_bind_judges_the_claim_itself_without_waiting_for_the_feed() -> None:
    s = Setup(written=NOW - 100)
    s.clock.now = NOW + 202  # stale now, but no feed pass has run since
    assert s.cache.pod_state(P) is caches.PodState.ADDED
    ok, error = s.bind()
    assert ok, error
    assert s.binder.bound == {P: NODE} and s.charged() == [(1, 8000, 0)]


def test_a_lock_naming_the_pod_keeps_an_old_claim_held_until_released() -> None:
    s = Setup(written=NOW - EXPIRY - 60)
    assert s.cache.pod_state(P) is None
    # a bind of the pod took the claimed node's lock: the claim counts again at once
    s.node_event(_node(lockcodec.encode(NOW, "default", "p")))
    assert s.cache.pod_state(P) is caches.PodState.ADDED and s.charged() == [(1, 81920, 100)]
    verdict = s.feed.foreign_claim(P)
    assert verdict is not None and verdict.state is claims.State.LOCKED
    s.node_event(_node(lockcodec.encode(NOW, "default", "other")))
    assert s.cache.pod_state(P) is None and s.freed == [NODE]  # another pod's lock: no bind of this one
    s.node_event(_node())
    assert s.cache.pod_state(P) is None


def test_a_bound_pod_keeps_its_claim_however_old() -> None:
    s = Setup(written=NOW - 3600)
    s.feed.sync.pods.handler(informer.Event(MODIFIED, _pod(s.claim, node_name=NODE)))
    assert s.cache.pod_state(P) is caches.PodState.ADDED and s.charged() == [(1, 81920, 100)]
    s.clock.now += 3600
    s.feed.recheck_claims()
    assert s.charged() == [(1, 81920, 100)] and s.feed.foreign_claim(P) is None


def test_a_claim_with_a_bind_phase_is_left_to_the_recovery_loop() -> None:
    """gpuslice's own writes (and HAMi's bind) carry a bind phase: never judged stale here."""
    s = Setup(written=NOW - 3600)
    bind_claim = pod_devices.bind_annotations(WHOLE, NOW - 3600)
    s.feed.sync.pods.handler(informer.Event(MODIFIED, _pod(bind_claim)))
    assert s.cache.pod_state(P) is caches.PodState.ADDED and s.charged() == [(1, 81920, 100)]
    s.clock.now += 3600
    s.feed.recheck_claims()
    assert s.charged() == [(1, 81920, 100)] and s.feed.foreign_claim(P) is None


def test_a_new_claim_after_a_stale_one_is_charged_again() -> None:
    """The scheduler that wrote it is alive after all: its re-filter stamps a new time."""
    s = Setup(written=NOW - EXPIRY - 60)
    assert s.cache.pod_state(P) is None
    refiled = pod_devices.filter_annotations(WHOLE, NOW)
    s.feed.sync.pods.handler(informer.Event(MODIFIED, _pod(refiled)))
    assert s.cache.pod_state(P) is caches.PodState.ADDED and s.charged() == [(1, 81920, 100)]


def test_the_expiry_is_the_node_lock_expiry() -> None:
    short = config.Settings(node_lock_expiry_s=30.0)
    assert Setup(written=NOW - 40, settings=short).cache.pod_state(P) is None
    assert Setup(written=NOW - 20, settings=short).cache.pod_state(P) is caches.PodState.ADDED
    # unset (0): HAMi's default, 5 minutes
    assert Setup(written=NOW - 290, settings=config.Settings()).cache.pod_state(P) is caches.PodState.ADDED
    assert Setup(written=NOW - 310, settings=config.Settings()).cache.pod_state(P) is None


def _filter(s: Setup) -> dict[str, Any]:
    with TestClient(apps.create_app(s.deps)) as c:
        r = c.post("/filter", json={"Pod": _pod_dict(s.claim), "Nodes": None, "NodeNames": [NODE]})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_the_filter_names_a_held_claim_and_passes_the_pod_once_it_is_stale() -> None:
    s = Setup(written=NOW - 100)
    body = _filter(s)
    # not InsufficientGPUMemory (the claim fills the card): the claim itself is the reason
    assert body["NodeNames"] == [] and body["FailedNodes"] == {}
    assert body["FailedAndUnresolvableNodes"] == {NODE: status.FOREIGN_CLAIM_HELD}
    (event,) = s.events.events
    assert event[2] == "FilteringFailed" and status.FOREIGN_CLAIM_HELD in event[3]
    assert f"another scheduler's claim on node {NODE}" in event[3] and "in 201s" in event[3], event
    s.clock.now = NOW + 202
    assert _filter(s)["NodeNames"] == [NODE]  # the pod's request fits the card the claim no longer holds


def test_the_feeds_housekeeping_drops_a_claim_once_stale() -> None:
    """Once a second, with no event at all: the claim leaves the cache and the Pending pods are nudged."""
    s = Setup(written=NOW - 100)
    s.clock.now = NOW + 202

    async def one_pass() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(s.feed._housekeeping(), 1.5)

    asyncio.run(one_pass())
    assert s.cache.pod_state(P) is None and s.charged() == [(0, 0, 0)]
    assert s.freed == [NODE]


class LaggingWatch:
    """The feed as the bind's truth, but its watch shows the pod only during the truth check,
    after the bind reserved the cards (and, with ``our_lock``, the node lock the bind took)."""

    def __init__(self, s: Setup, our_lock: bool = False) -> None:
        self.s = s
        self.our_lock = our_lock

    async def settle(self, node: str, resource_version: str) -> None:
        if self.our_lock:
            self.s.node_event(_node(lockcodec.encode(NOW, "default", "p")))
        self.s.feed.sync.pods.handler(informer.Event(ADDED, _pod(self.s.claim)))
        await self.s.feed.settle(node, resource_version)

    def foreign_claim(self, key: str) -> claims.Claim | None:
        return self.s.feed.foreign_claim(key)


def test_a_young_claim_the_watch_shows_only_during_the_bind_refuses_it() -> None:
    s = Setup(written=NOW - 100, seen=False)
    s.use(LaggingWatch(s))
    ok, error = s.bind()
    assert not ok and "another scheduler's claim" in error and "in 201s" in error, error
    # checked after the node lock: the lock is released, nothing was written, nothing is reserved
    assert [c[0] for c in s.binder.calls] == ["lock", "unlock"]
    assert s.binder.bound == {} and s.binder.locks == {}
    assert s.cache.pod_state(P) is caches.PodState.ADDED and s.charged() == [(1, 81920, 100)]


@pytest.mark.parametrize("our_lock", [False, True], ids=["watch-lags", "watch-shows-our-lock"])
def test_an_old_claim_the_watch_shows_only_during_the_bind_is_replaced(our_lock: bool) -> None:
    """The lock this bind took names the pod: it does not make the old claim held."""
    s = Setup(written=NOW - EXPIRY - 60, seen=False)
    s.use(LaggingWatch(s, our_lock=our_lock))
    ok, error = s.bind()
    assert ok, error
    assert s.binder.bound == {P: NODE}
    assert s.binder.annotations[P][keys.DEVICES_ALLOCATED] == f"{CARD},NVIDIA,8000,0:;"
    assert s.reasons() == ["GPUAllocated", "StaleClaimReplaced"]


def test_a_held_claim_the_cache_lost_is_charged_again_by_the_next_pass() -> None:
    """E.g. a bind of the pod reserved while the watch lagged, then forgot its reservation."""
    s = Setup(written=NOW - 100)
    s.cache.remove_pod(P)
    assert s.charged() == [(0, 0, 0)]
    s.feed.recheck_claims()
    assert s.cache.pod_state(P) is caches.PodState.ADDED and s.charged() == [(1, 81920, 100)]
    assert s.freed == []  # nothing freed: nothing to nudge
