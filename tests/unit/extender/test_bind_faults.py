"""The bind path under faults: gates, the truth check, ambiguous and definite API failures, the
per-node queue and the failpoints. Every test runs the real ``ClusterCache``; the API is
``fakes.FakeBinder``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest
from starlette.testclient import TestClient

from gpuslice.cache import cache as caches
from gpuslice.codec import keys, pod_devices, resources
from gpuslice.extender import config, wire
from gpuslice.extender.binding import bind as binds
from gpuslice.extender.binding import failpoints
from gpuslice.extender.http import app as apps
from tests.unit import builders
from tests.unit.builders import node
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit

P = "default/p"


def _args(name: str = "p", node_name: str = "n1") -> wire.ExtenderBindingArgs:
    return wire.ExtenderBindingArgs(name, "default", f"uid-{name}", node_name)


def _remember(deps: apps.Deps, name: str = "p", mem: int = 8000, cores: int = 0) -> None:
    """What the filter leaves for the bind: the pod's parsed request."""
    deps.flow.remember(resources.parse_pod(fakes.gpu_pod(name, mem=mem, cores=cores)))


def _ops(binder: fakes.FakeBinder) -> list[str]:
    return [c[0] for c in binder.calls]


async def _until(condition: Callable[[], bool]) -> None:
    """Yield to the other tasks until ``condition`` holds (a bounded number of loop turns)."""
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def _api_errors(deps: apps.Deps, op: str) -> float:
    value = deps.metrics.registry.get_sample_value("gpuslice_api_errors_total", {"operation": op})
    return value or 0.0


@pytest.fixture(autouse=True)
def fast_resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The resolver's pauses, shortened (the production ones start at 0.5 s)."""
    monkeypatch.setattr(binds, "RESOLVE_BACKOFF_S", (0.005, 0.01))
    yield


@pytest.fixture
def cache() -> caches.ClusterCache:
    """n1: two idle 80 GiB cards. n2: one idle card."""
    return fakes.cluster_cache(node("n1").gpus(2), node("n2").gpus(1))


# ----------------------------------------------------------------------------- gates


def test_a_follower_refuses_to_bind_and_writes_nothing(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000)})
    deps = fakes.make_deps(cache, binder, leading=lambda: False)
    _remember(deps)
    with TestClient(apps.create_app(deps)) as c:
        r = c.post("/bind", json={"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n1"})
    assert r.status_code == 200
    assert "not the leader" in r.json()["Error"]
    assert binder.calls == []  # no read, no lock, no write
    assert binder.locks == {} and binder.annotations == {} and binder.bound == {}
    assert cache.pod_state(P) is None
    assert fakes.usage(cache, "n1") == [(0, 0, 0), (0, 0, 0)]
    assert fakes.binds_counted(deps, "not_leader") == 1


def test_bind_answers_not_synced_after_sync_wait(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder()
    deps = fakes.make_deps(cache, binder, config.Settings(sync_wait_s=0.15), synced=lambda: False)
    _remember(deps)
    t0 = time.monotonic()
    outcome = asyncio.run(deps.flow.bind(_args()))
    waited = time.monotonic() - t0
    assert outcome.result is binds.Result.NOT_SYNCED and not outcome.ok
    assert "not synced" in outcome.error
    assert waited >= 0.15  # it waited for the sync first
    assert binder.calls == [] and cache.pod_state(P) is None
    assert fakes.binds_counted(deps, "not_synced") == 1


def test_bind_proceeds_once_the_cache_syncs_within_sync_wait(cache: caches.ClusterCache) -> None:
    looks = iter([False, False, False])
    binder = fakes.FakeBinder()
    deps = fakes.make_deps(cache, binder, config.Settings(sync_wait_s=5.0), synced=lambda: next(looks, True))
    _remember(deps)
    outcome = asyncio.run(deps.flow.bind(_args()))
    assert outcome.ok and binder.bound == {P: "n1"}


# ----------------------------------------------------------------------------- the truth check


def _other_writer_fills_our_card(
    cache: caches.ClusterCache, binder: fakes.FakeBinder, free_left: int
) -> tuple[fakes.ApiTruth, list[str]]:
    """A truth stub: before the read, another writer's pod lands on the card our bind reserved,
    leaving ``free_left`` MiB (as the API list after the node lock would show it)."""
    filled: list[str] = []

    def land(node_name: str) -> None:
        mine = cache.pod_allocation(P)
        assert mine is not None and mine.node == node_name
        card = mine.containers[0][0].uuid
        other = builders.alloc(node_name, ((card, 81920 - free_left, 0),))
        binder.claimed.append(fakes.claim("foreign", other))
        filled.append(card)

    return fakes.ApiTruth(cache, binder, before=land), filled


def test_truth_check_re_places_onto_another_card(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder()
    truth, filled = _other_writer_fills_our_card(cache, binder, free_left=4000)
    deps = fakes.make_deps(cache, binder, truth=truth)
    _remember(deps, mem=8000)
    outcome = asyncio.run(deps.flow.bind(_args()))
    assert outcome.ok, outcome
    assert truth.calls == [("n1", "101")]  # settled up to the lock write's resourceVersion
    (taken,) = filled
    mine = cache.pod_allocation(P)
    assert mine is not None and [g.uuid for g in mine.containers[0]] != [taken]
    # The annotations name the card the cache charges, not the one first reserved.
    assert binder.charged() == {P: mine}
    assert fakes.overcommitted(cache) == []
    by_card = {builders.uuid("n1", i): u for i, u in enumerate(fakes.usage(cache, "n1"))}
    assert by_card[taken] == (1, 77920, 0)  # the other writer's pod alone
    assert sorted(by_card.values()) == [(1, 8000, 0), (1, 77920, 0)]
    assert cache.pod_state("other/foreign") is caches.PodState.ADDED
    assert deps.metrics.registry.get_sample_value("gpuslice_bind_truth_corrections_total") == 1


def test_truth_check_refuses_when_no_card_is_left(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder()
    truth, _ = _other_writer_fills_our_card(cache, binder, free_left=4000)
    deps = fakes.make_deps(cache, binder, truth=truth)
    _remember(deps, mem=8000)
    outcome = asyncio.run(deps.flow.bind(_args(node_name="n2")))  # n2 has one card
    assert outcome.result is binds.Result.NO_FIT and "no longer fits" in outcome.error
    assert fakes.usage(cache, "n2") == [(1, 77920, 0)]  # never 77920 + 8000 > 81920
    assert fakes.overcommitted(cache) == []
    assert cache.pod_state(P) is None
    assert binder.locks == {} and binder.annotations == {} and binder.bound == {}
    assert _ops(binder) == ["lock", "claimed", "unlock"]


def test_truth_read_failure_undoes_the_bind(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder()
    binder.fail["claimed"] = fakes.Fault("apiserver unavailable", ambiguous=True)
    deps = fakes.make_deps(cache, binder, truth=fakes.ApiTruth(cache, binder))
    _remember(deps)
    outcome = asyncio.run(deps.flow.bind(_args()))
    # Nothing was written yet, so even an unanswered read is simply a failed bind.
    assert outcome.result is binds.Result.FAILED and outcome.error.startswith("claimed failed")
    assert cache.pod_state(P) is None and binder.locks == {} and binder.annotations == {}


def test_pod_bound_elsewhere_while_waiting_releases_the_node_lock(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder()

    class Watch:
        async def settle(self, node_name: str, resource_version: str) -> None:
            # The pod watch meanwhile: another binder bound the pod to n2.
            cache.add_pod(P, "uid-p", builders.alloc("n2", ((builders.uuid("n2", 0), 8000, 0),)))

    deps = fakes.make_deps(cache, binder, truth=Watch())
    _remember(deps)
    outcome = asyncio.run(deps.flow.bind(_args()))
    assert outcome.result is not binds.Result.ERROR
    assert binder.locks == {} and binder.annotations == {}


# ----------------------------------------------------------------------------- ambiguous failures


def test_ambiguous_binding_failure_is_kept_and_finished_by_the_resolver(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000)})
    binder.fail["bind"] = fakes.Fault("context deadline exceeded", ambiguous=True, times=1)
    deps = fakes.make_deps(cache, binder)
    _remember(deps)
    flow = deps.flow

    async def run() -> None:
        outcome = await flow.bind(_args())
        assert outcome.result is binds.Result.PENDING and not outcome.ok
        assert "outcome unknown" in outcome.error and "retry" in outcome.error
        # Nothing is rolled back: the write may have landed.
        assert cache.pod_state(P) is caches.PodState.ASSUMED
        assert fakes.usage(cache, "n1") in ([(1, 8000, 0), (0, 0, 0)], [(0, 0, 0), (1, 8000, 0)])
        assert binder.annotations == {}  # this one did not land: nothing is half written
        assert binder.locks == {"n1": P}
        assert "unlock" not in _ops(binder) and binder.bound == {}
        assert flow.is_live(P) and flow.live() == {P: "n1"}
        await flow.drain()

    asyncio.run(run())
    assert binder.bound == {P: "n1"}
    assert _ops(binder) == ["lock", "bind", "read", "bind", "label"]
    assert binder.annotations[P][keys.VGPU_NODE] == "n1" and binder.labels == {P: "n1"}
    assert cache.pod_state(P) is caches.PodState.ASSUMED
    alloc = cache.pod_allocation(P)
    assert alloc is not None and binder.charged() == {P: alloc}
    assert binder.locks == {"n1": P}  # ours until the device plugin's Allocate releases it
    assert not flow.live()
    assert fakes.binds_counted(deps, "pending") == 1
    assert fakes.binds_counted(deps, "resolved") == 1
    assert deps.metrics.registry.get_sample_value("gpuslice_bind_ambiguous_total", {"operation": "bind"}) == 1
    # kube-scheduler's retry of the bind is a repeat now.
    again = asyncio.run(flow.bind(_args()))
    assert again.result is binds.Result.REPEAT and again.ok


def test_a_binding_that_landed_is_not_posted_again(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000)})
    binder.fail["bind"] = fakes.Fault("connection reset", ambiguous=True, times=1, applied=True)
    deps = fakes.make_deps(cache, binder)
    _remember(deps)

    async def run() -> binds.Outcome:
        outcome = await deps.flow.bind(_args())
        await deps.flow.drain()
        return outcome

    assert asyncio.run(run()).result is binds.Result.PENDING
    assert binder.bound == {P: "n1"}
    assert _ops(binder) == ["lock", "bind", "read", "label"]  # seen bound with our devices: no repeat
    assert cache.pod_state(P) is caches.PodState.ASSUMED
    assert fakes.binds_counted(deps, "resolved") == 1


def test_repeated_ambiguous_bindings_are_sent_again_until_one_answers(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000)})
    binder.fail["bind"] = fakes.Fault("503", ambiguous=True, times=2)  # and the first retry
    deps = fakes.make_deps(cache, binder)
    _remember(deps)

    async def run() -> binds.Outcome:
        outcome = await deps.flow.bind(_args())
        assert binder.locks == {"n1": P} and cache.pod_state(P) is caches.PodState.ASSUMED
        await deps.flow.drain()
        return outcome

    assert asyncio.run(run()).result is binds.Result.PENDING
    assert binder.bound == {P: "n1"}
    assert _ops(binder) == ["lock", "bind", "read", "bind", "read", "bind", "label"]
    # The retries carry the very annotations of the first attempt.
    alloc = cache.pod_allocation(P)
    assert alloc is not None and binder.charged() == {P: alloc}
    assert fakes.binds_counted(deps, "resolved") == 1


def _theirs(node_name: str) -> dict[str, str]:
    """Another binder's annotations for P: its own card and time."""
    alloc = builders.alloc(node_name, ((builders.uuid(node_name, 1), 20000, 0),))
    return pod_devices.bind_annotations(alloc, fakes.CLOCK - 7)


def test_pod_bound_to_our_node_by_another_writer_keeps_its_devices(cache: caches.ClusterCache) -> None:
    """Another binder (a previous incarnation, say) bound P to n1 with its own devices while our
    bind waited: our Binding gets the apiserver's 409, the pod is where kube-scheduler wants it."""
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000)})
    theirs = _theirs("n1")

    class Meanwhile:
        async def settle(self, node_name: str, resource_version: str) -> None:
            binder.annotate(P, theirs)
            binder.bound[P] = node_name

    deps = fakes.make_deps(cache, binder, truth=Meanwhile())
    _remember(deps)
    outcome = asyncio.run(deps.flow.bind(_args()))
    assert outcome.result is binds.Result.REPEAT and outcome.ok
    assert binder.annotations[P] == theirs  # not overwritten: the device plugin serves these
    assert cache.pod_state(P) is None  # our reservation goes; the watch charges theirs
    assert fakes.usage(cache, "n1") == [(0, 0, 0), (0, 0, 0)]
    assert binder.locks == {"n1": P}  # the pod's Allocate releases it
    assert _ops(binder) == ["lock", "bind"]  # no label either: the other writer's pod


def test_resolver_finds_the_pod_bound_here_by_another_writer(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000)})
    binder.fail["bind"] = fakes.Fault("timeout", ambiguous=True, times=1)
    deps = fakes.make_deps(cache, binder)
    _remember(deps)
    theirs = _theirs("n1")

    async def run() -> None:
        assert (await deps.flow.bind(_args())).result is binds.Result.PENDING
        binder.annotate(P, theirs)
        binder.bound[P] = "n1"
        binder.pods[P]["spec"]["nodeName"] = "n1"
        await deps.flow.drain()

    asyncio.run(run())
    assert _ops(binder) == ["lock", "bind", "read"]
    assert binder.annotations[P] == theirs
    assert cache.pod_state(P) is None and binder.locks == {"n1": P}
    assert fakes.binds_counted(deps, "resolved") == 0
    assert not deps.flow.live()


def test_ambiguous_failure_then_pod_deleted_drops_everything(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder()  # read_pod finds nothing: the pod was deleted meanwhile
    binder.fail["bind"] = fakes.Fault("timeout", ambiguous=True, times=1)
    deps = fakes.make_deps(cache, binder)
    _remember(deps)

    async def run() -> binds.Outcome:
        outcome = await deps.flow.bind(_args())
        assert cache.pod_state(P) is caches.PodState.ASSUMED and binder.locks == {"n1": P}
        await deps.flow.drain()
        return outcome

    assert asyncio.run(run()).result is binds.Result.PENDING
    assert cache.pod_state(P) is None
    assert fakes.usage(cache, "n1") == [(0, 0, 0), (0, 0, 0)]
    assert binder.locks == {}
    assert binder.bound == {}
    assert _ops(binder)[-2:] == ["read", "unlock"]
    assert fakes.binds_counted(deps, "resolved") == 0
    assert not deps.flow.live()


def test_resolver_undoes_on_a_definite_failure(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000)})
    binder.fail["bind"] = fakes.Fault("timeout", ambiguous=True, times=1)
    deps = fakes.make_deps(cache, binder)
    _remember(deps)

    async def run() -> None:
        assert (await deps.flow.bind(_args())).result is binds.Result.PENDING
        binder.fail["bind"] = fakes.Fault('pods "p" is forbidden', reason="Forbidden")  # now a 4xx
        await deps.flow.drain()

    asyncio.run(run())
    assert cache.pod_state(P) is None
    assert binder.annotations == {} and binder.locks == {} and binder.bound == {}
    assert fakes.binds_counted(deps, "resolved") == 0


def test_resolver_of_a_deposed_leader_leaves_the_bind_to_the_new_one(cache: caches.ClusterCache) -> None:
    leading = [True]
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000)})
    binder.fail["bind"] = fakes.Fault("timeout", ambiguous=True, times=1)
    deps = fakes.make_deps(cache, binder, leading=lambda: leading[0])
    _remember(deps)

    async def run() -> None:
        assert (await deps.flow.bind(_args())).result is binds.Result.PENDING
        leading[0] = False
        await deps.flow.drain()

    asyncio.run(run())
    assert cache.pod_state(P) is None  # its reservation goes
    assert binder.locks == {"n1": P}  # the new leader's recovery releases it after the grace
    assert binder.annotations == {} and binder.bound == {}


def test_resolver_keeps_another_binders_annotations(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000)})
    binder.fail["bind"] = fakes.Fault("timeout", ambiguous=True, times=1)
    deps = fakes.make_deps(cache, binder)
    _remember(deps)
    theirs = pod_devices.bind_annotations(
        builders.alloc("n2", ((builders.uuid("n2", 0), 8000, 0),)), fakes.CLOCK
    )

    async def run() -> None:
        assert (await deps.flow.bind(_args())).result is binds.Result.PENDING
        # Meanwhile another binder (a new leader) bound the pod to n2 with its own annotations.
        binder.annotations[P] = dict(theirs)
        binder.bound[P] = "n2"
        binder.pods[P]["spec"]["nodeName"] = "n2"
        await deps.flow.drain()

    asyncio.run(run())
    assert cache.pod_state(P) is None and binder.locks == {}
    assert binder.annotations.get(P) == theirs


def test_pending_is_an_error_on_the_wire(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000)})
    binder.fail["bind"] = fakes.Fault("timeout", ambiguous=True)  # the resolver keeps retrying too
    deps = fakes.make_deps(cache, binder)
    _remember(deps)
    with TestClient(apps.create_app(deps)) as c:
        r = c.post("/bind", json={"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n1"})
        error: str = r.json()["Error"]
        assert error.startswith("bind outcome unknown") and error.endswith("retry")
        binder.fail.clear()  # the apiserver answers again: the resolver finishes the bind
        assert c.portal is not None
        c.portal.call(deps.flow.drain)  # on the app's event loop, where the resolver runs
    assert binder.bound == {P: "n1"}


def test_the_label_waits_for_the_device_plugin_to_release_the_node_lock(cache: caches.ClusterCache) -> None:
    """HAMi's label (for HAMi's vGPU monitor) comes once the plugin answered Allocate and released
    the lock: never in a race with the plugin's own writes to the pod."""
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000)})
    deps = fakes.make_deps(cache, binder)
    _remember(deps)

    async def run() -> None:
        assert (await deps.flow.bind(_args())).result is binds.Result.BOUND
        await asyncio.sleep(0.01)
        assert _ops(binder) == ["lock", "bind"] and binder.labels == {}
        binder.release("n1")  # the device plugin, after Allocate
        await _until(lambda: binder.labels == {P: "n1"})

    asyncio.run(run())
    assert _ops(binder) == ["lock", "bind", "label"]


def test_a_later_bind_on_the_node_or_the_timeout_labels_a_waiting_pod(
    cache: caches.ClusterCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000), "default/q": fakes.gpu_pod("q", mem=8000)})
    deps = fakes.make_deps(cache, binder)
    deps.flow.lock_owner = lambda node: None  # the watch never showed the lock naming the pods
    _remember(deps, "p")
    _remember(deps, "q")
    monkeypatch.setattr(binds, "LABEL_AFTER_S", 0.05)

    async def run() -> None:
        assert (await deps.flow.bind(_args("p"))).ok
        binder.release("n1")  # not seen as the release of p's lock: the watch never showed it
        assert (await deps.flow.bind(_args("q"))).ok  # the lock moved on: p's Allocate is over
        await _until(lambda: P in binder.labels)
        assert "default/q" not in binder.labels
        await asyncio.sleep(0.1)  # LABEL_AFTER_S
        assert binder.labels == {P: "n1", "default/q": "n1"}

    asyncio.run(run())


def test_a_failed_label_does_not_fail_the_bind(cache: caches.ClusterCache) -> None:
    """Nothing placed depends on the label: a failure is logged and counted only."""
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000)})
    binder.fail["label"] = fakes.Fault("etcdserver: request timed out", ambiguous=True)
    deps = fakes.make_deps(cache, binder)
    _remember(deps)

    async def run() -> binds.Outcome:
        outcome = await deps.flow.bind(_args())
        binder.release("n1")
        await deps.flow.drain()
        return outcome

    outcome = asyncio.run(run())
    assert outcome.result is binds.Result.BOUND and outcome.ok
    assert _ops(binder) == ["lock", "bind", "label"]
    assert binder.bound == {P: "n1"} and binder.labels == {}
    assert cache.pod_state(P) is caches.PodState.ASSUMED
    assert _api_errors(deps, "label") == 1


# ----------------------------------------------------------------------------- definite failures


def test_definite_binding_failure_undoes_everything_at_once(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000)})
    binder.fail["bind"] = fakes.Fault('pods "p" not found', reason="NotFound")
    deps = fakes.make_deps(cache, binder)
    _remember(deps)
    outcome = asyncio.run(deps.flow.bind(_args()))
    assert outcome.result is binds.Result.FAILED and outcome.error == 'bind failed: pods "p" not found'
    # Undone before the answer: no resolver, nothing left behind.
    assert not deps.flow.live()
    assert cache.pod_state(P) is None
    assert fakes.usage(cache, "n1") == [(0, 0, 0), (0, 0, 0)]
    assert binder.annotations == {}  # a refused Binding wrote nothing: nothing to remove
    assert binder.locks == {}
    assert _ops(binder) == ["lock", "bind", "unlock"]
    assert _api_errors(deps, "bind") == 1
    assert fakes.binds_counted(deps, "failed") == 1
    events = deps.events
    assert isinstance(events, fakes.RecordedEvents)
    assert [e[:3] for e in events.events] == [(P, "Warning", "BindingFailed")]


def test_definite_lock_failure_writes_nothing(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder()
    binder.fail["lock"] = fakes.Fault("forbidden", reason="Forbidden")
    deps = fakes.make_deps(cache, binder)
    _remember(deps)
    outcome = asyncio.run(deps.flow.bind(_args()))
    assert outcome.result is binds.Result.FAILED and outcome.error.startswith("lock failed")
    assert _ops(binder) == ["lock"]
    assert cache.pod_state(P) is None and binder.locks == {} and binder.annotations == {}


# ----------------------------------------------------------------------------- per-node queue


def _queue_settings(queue_budget_s: float) -> config.Settings:
    """Settings leaving ``queue_budget_s`` of ``bind_timeout_s`` for waiting in a node's queue."""
    lock_wait_s, commit_deadline_s = 0.05, 0.5
    return config.Settings(
        lock_wait_s=lock_wait_s,
        commit_deadline_s=commit_deadline_s,
        bind_timeout_s=lock_wait_s + commit_deadline_s + binds.QUEUE_MARGIN_S + queue_budget_s,
    )


@pytest.mark.parametrize(
    ("delay", "budget", "queued"),
    [(0.05, 0.05, binds.Result.BUSY), (0.002, 0.5, binds.Result.BOUND)],
    ids=["held-past-the-deadline", "freed-in-time"],
)
def test_binds_to_one_node_queue_and_give_up_at_their_deadline(
    cache: caches.ClusterCache, delay: float, budget: float, queued: binds.Result
) -> None:
    binder = fakes.FakeBinder()
    # Every API call takes ``delay``: the first bind holds n1's queue for 2 x delay (lock,
    # Binding); the second one may wait there for ``budget``.
    binder.delay = delay
    binder.plugin_releases_lock = True  # n1's lock is free again once p is bound
    deps = fakes.make_deps(cache, binder, _queue_settings(budget))
    for name in ("p", "q", "r"):
        _remember(deps, name, mem=8000)

    async def run() -> list[binds.Outcome]:
        first = asyncio.ensure_future(deps.flow.bind(_args("p")))
        await _until(lambda: ("lock", "n1", "default", "p") in binder.calls)  # p holds n1's queue
        second = asyncio.ensure_future(deps.flow.bind(_args("q")))
        other_node = asyncio.ensure_future(deps.flow.bind(_args("r", "n2")))
        await _until(lambda: cache.pod_state("default/q") is caches.PodState.ASSUMED)  # queued, reserved
        assert ("lock", "n1", "default", "q") not in binder.calls  # not before p is done
        return list(await asyncio.gather(first, second, other_node))

    p, q, r = asyncio.run(run())
    assert p.ok and r.ok  # another node's queue is not held up
    assert q.result is queued
    if queued is binds.Result.BUSY:
        assert "busy" in q.error
        assert cache.pod_state("default/q") is None  # its reservation is dropped
        assert binder.bound == {P: "n1", "default/r": "n2"}
        assert ("lock", "n1", "default", "q") not in binder.calls
        assert sorted(fakes.usage(cache, "n1")) == [(0, 0, 0), (1, 8000, 0)]
        assert fakes.binds_counted(deps, "busy") == 1
    else:
        assert binder.bound == {P: "n1", "default/q": "n1", "default/r": "n2"}
        assert sorted(fakes.usage(cache, "n1")) == [(1, 8000, 0), (1, 8000, 0)]


def test_writes_after_the_lock_carry_timeouts_within_the_commit_deadline(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder()
    deps = fakes.make_deps(cache, binder, config.Settings(commit_deadline_s=2.0))
    _remember(deps)
    assert asyncio.run(deps.flow.bind(_args())).ok
    assert [op for op, _ in binder.timeouts] == ["bind"]
    assert all(t is not None and 0 < t <= 2.0 for _, t in binder.timeouts)


# ----------------------------------------------------------------------------- failpoints


def test_exit_failpoint_fires_right_after_the_lock(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder()
    seen: list[tuple[int, list[str], dict[str, str]]] = []

    def exit_(status: int) -> None:  # records instead of ending the test process
        seen.append((status, _ops(binder), dict(binder.locks)))

    faults = failpoints.Failpoints({"bind-after-lock": "exit"}, exit_=exit_)
    assert faults.armed
    deps = fakes.make_deps(cache, binder, faults=faults)
    _remember(deps)
    asyncio.run(deps.flow.bind(_args()))
    assert seen == [(137, ["lock"], {"n1": P})]  # lock taken, nothing written yet


@pytest.mark.parametrize(
    ("name", "ops_before"),
    # bind-before-binding keeps its place just before the Binding, which now carries the annotations.
    [("bind-before-binding", ["lock"]), ("bind-after-binding", ["lock", "bind"])],
)
def test_exit_failpoints_fire_at_their_step(
    cache: caches.ClusterCache, name: str, ops_before: list[str]
) -> None:
    binder = fakes.FakeBinder()
    seen: list[tuple[int, list[str], bool]] = []

    def exit_(status: int) -> None:
        seen.append((status, _ops(binder), P in binder.annotations))

    faults = failpoints.Failpoints({name: "exit"}, exit_=exit_)
    deps = fakes.make_deps(cache, binder, faults=faults)
    _remember(deps)
    asyncio.run(deps.flow.bind(_args()))
    # A crash before the Binding leaves no annotations behind; after it, a bound pod with them.
    assert seen == [(failpoints.EXIT_STATUS, ops_before, "bind" in ops_before)]


def test_sleep_failpoint_stalls_the_bind(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder()
    faults = failpoints.Failpoints({"bind-before-binding": "sleep(0.1)"}, exit_=lambda s: pytest.fail("exit"))
    deps = fakes.make_deps(cache, binder, faults=faults)
    _remember(deps)
    t0 = time.monotonic()
    assert asyncio.run(deps.flow.bind(_args())).ok
    assert time.monotonic() - t0 >= 0.1


def test_unarmed_failpoints_do_nothing() -> None:
    calls: list[int] = []
    faults = failpoints.Failpoints(exit_=calls.append)
    assert not faults.armed
    for name in sorted(failpoints.NAMES):
        asyncio.run(faults.hit(name))
    assert calls == []


def test_failpoints_parse_names_and_actions() -> None:
    text = " bind-after-lock=exit ; bind-before-binding=sleep(0.5);bind-after-binding=sleep(2) ;"
    assert failpoints.parse(text) == {
        "bind-after-lock": "exit",
        "bind-before-binding": "sleep(0.5)",
        "bind-after-binding": "sleep(2)",
    }
    assert failpoints.parse("") == {}
    env = {failpoints.ENV: "bind-after-lock=exit"}
    assert failpoints.Failpoints.from_env(env).armed
    assert not failpoints.Failpoints.from_env({}).armed


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("bind-before-lock=exit", "unknown failpoint 'bind-before-lock'"),
        ("bind-after-lock", "unknown failpoint 'bind-after-lock'"),  # no action at all
        ("=exit", "unknown failpoint ''"),
        ("bind-after-lock=crash", "action must be exit or sleep(<seconds>), got 'crash'"),
        ("bind-after-lock=sleep(x)", "got 'sleep(x)'"),
        ("bind-after-lock=sleep(-1)", "got 'sleep(-1)'"),
        ("bind-after-lock=exit;bind-before-binding=panic", "bind-before-binding: action must be"),
    ],
)
def test_failpoints_parse_rejects_unknown_names_and_actions(text: str, fragment: str) -> None:
    with pytest.raises(failpoints.FailpointError) as err:
        failpoints.parse(text)
    assert fragment in str(err.value)
    with pytest.raises(failpoints.FailpointError):
        failpoints.Failpoints.from_env({failpoints.ENV: text})


def test_node_that_died_while_the_bind_waited_for_its_lock_gets_nothing(cache: caches.ClusterCache) -> None:
    """The device plugin went away (handshake stale) between the reservation and the lock."""
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000)})
    excluded: dict[str, str] = {}

    class DiesDuringTheWait:
        async def settle(self, node: str, resource_version: str) -> None:
            excluded[node] = "NodeHandshakeStale"

    deps = fakes.make_deps(cache, binder, excluded=excluded, truth=DiesDuringTheWait())
    deps.flow.excluded = excluded
    _remember(deps)
    outcome = asyncio.run(deps.flow.bind(_args()))
    assert outcome.result is binds.Result.REJECTED and "NodeHandshakeStale" in outcome.error
    assert binder.locks == {} and binder.annotations == {} and binder.bound == {}
    assert cache.pod_state(P) is None
    assert fakes.usage(cache, "n1") == [(0, 0, 0), (0, 0, 0)]


def test_a_held_lock_is_no_reason_to_refuse_once_the_lock_is_ours(cache: caches.ClusterCache) -> None:
    """NodeLockHeld (the previous owner's stuck lock) may still be in the view after we took it."""
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000)})
    excluded: dict[str, str] = {}

    class StaleView:
        async def settle(self, node: str, resource_version: str) -> None:
            excluded[node] = "NodeLockHeld"

    deps = fakes.make_deps(cache, binder, excluded=excluded, truth=StaleView())
    deps.flow.excluded = excluded
    _remember(deps)
    assert asyncio.run(deps.flow.bind(_args())).ok


def test_writes_are_not_started_once_the_commit_deadline_has_passed(cache: caches.ClusterCache) -> None:
    """A slow truth read must not push the writes past the grace other replicas give a live bind."""
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000)})

    class Slow:
        async def settle(self, node: str, resource_version: str) -> None:
            await asyncio.sleep(0.2)

    settings = config.validate({"commit_deadline_s": 0.05, "orphan_grace_s": 1.0})
    deps = fakes.make_deps(cache, binder, settings, truth=Slow())
    _remember(deps)
    outcome = asyncio.run(deps.flow.bind(_args()))
    assert outcome.result is binds.Result.FAILED and "commit deadline" in outcome.error
    assert binder.annotations == {} and binder.bound == {} and binder.locks == {}
    assert cache.pod_state(P) is None


def test_the_pod_a_leftover_lock_names_does_not_queue_behind_binds_waiting_for_that_lock(
    cache: caches.ClusterCache,
) -> None:
    """A bind of P died after taking n1's lock; after a restart, q queues on n1 waiting for the
    lock, and P's retried bind must not wait behind q (q waits for P: a priority inversion)."""
    binder = fakes.FakeBinder({P: fakes.gpu_pod("p", mem=8000), "default/q": fakes.gpu_pod("q", mem=8000)})
    binder.locks["n1"] = P
    settings = config.validate({"lock_wait_s": 1.0, "bind_timeout_s": 6.0})
    deps = fakes.make_deps(cache, binder, settings, clock=time.monotonic)
    deps.flow.lock_owner = lambda node: binder.locks.get(node)
    _remember(deps, "p")
    _remember(deps, "q")

    async def run() -> tuple[binds.Outcome, binds.Outcome, float]:
        q = asyncio.ensure_future(deps.flow.bind(_args("q")))
        await _until(lambda: any(c[0] == "lock" and c[-1] == "q" for c in binder.calls))
        start = time.monotonic()
        p = await deps.flow.bind(_args("p"))
        took = time.monotonic() - start
        binder.release("n1")  # P's device plugin finishes; q can go on
        return p, await q, took

    p, q, took = asyncio.run(run())
    assert p.ok and took < 0.5, (p, took)  # not behind q's 1 s lock wait
    assert binder.bound.get(P) == "n1"
    assert q.ok or q.result is binds.Result.FAILED  # q either got the lock after the release or timed out
    assert fakes.overcommitted(cache) == []


def test_bind_to_a_node_with_an_invalid_registration_names_that_reason(cache: caches.ClusterCache) -> None:
    binder = fakes.FakeBinder({"default/p": fakes.gpu_pod("p", mem=8000)})
    deps = fakes.make_deps(cache, binder, invalid=["bad"])
    _remember(deps)
    outcome = asyncio.run(deps.flow.bind(_args(node_name="bad")))
    assert outcome.result is binds.Result.REJECTED and "NodeRegistrationInvalid" in outcome.error
    assert binder.locks == {} and binder.annotations == {}
