"""The cluster view (``extender.clusterview``) on the real ``ClusterCache``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from starlette.testclient import TestClient

from gpuslice.cache import cache as caches
from gpuslice.cache import shapes
from gpuslice.extender.http import app as apps
from gpuslice.extender.ops import clusterview
from gpuslice.framework import explain as explains
from gpuslice.model import config as model_config
from gpuslice.model import status
from gpuslice.policy import api
from tests.unit import builders
from tests.unit.builders import node
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit


def _cache(histogram: shapes.ShapeHistogram | None = None) -> caches.ClusterCache:
    cache = fakes.cluster_cache(
        node("a").gpus(2).cordon(1),
        node("b").gpus(1).unhealthy(0),
        node("c").gpus(1),
        histogram=histogram,
    )
    fakes.charge(cache, "team/train", "a", (0, 40960, 50))
    fakes.charge(cache, "team/infer", "a", (0, 8192, 10))
    fakes.charge(cache, "ml/wide", "c", (0, 81920, 100))
    return cache


def _state(deps: apps.Deps) -> clusterview.State:
    return clusterview.ClusterView(deps).state()


def _card(state: clusterview.State, node_name: str, index: int) -> clusterview.Card:
    n = next(n for n in state.nodes if n.name == node_name)
    return n.cards[index]


def test_holders_lists_the_pods_charged_per_card_sorted_with_their_charge() -> None:
    cache = _cache()
    got = cache.holders()
    assert [h.pod for h in got[builders.uuid("a", 0)]] == ["team/infer", "team/train"]
    train = got[builders.uuid("a", 0)][1]
    assert (train.node, train.usage.memory_mib, train.usage.cores, train.usage.slots) == ("a", 40960, 50, 1)
    assert not train.assumed
    assert builders.uuid("a", 1) not in got
    cache.remove_pod("team/infer")
    assert [h.pod for h in cache.holders()[builders.uuid("a", 0)]] == ["team/train"]


def test_holders_marks_assumed_pods_until_the_watch_confirms_them() -> None:
    cache = _cache()
    alloc = builders.alloc("a", ((builders.uuid("a", 0), 1024, 0),))
    assert cache.assume("team/new", "uid-new", alloc, 0.0).ok
    assert [(h.pod, h.assumed) for h in cache.holders()[builders.uuid("a", 0)]] == [
        ("team/infer", False),
        ("team/new", True),
        ("team/train", False),
    ]
    cache.add_pod("team/new", "uid-new", alloc)
    assert not any(h.assumed for h in cache.holders()[builders.uuid("a", 0)])


def test_state_shows_usage_pods_and_marks_per_card() -> None:
    cache = _cache()
    deps = fakes.make_deps(cache, excluded={"c": "NodeLockHeld"}, invalid={"broken"})
    state = _state(deps)
    assert [n.name for n in state.nodes] == ["a", "b", "c"]
    a0 = _card(state, "a", 0)
    assert (a0.used_memory_mib, a0.used_cores, a0.used_slots) == (49152, 60, 2)
    assert [(p.pod, p.memory_mib, p.cores, p.slots) for p in a0.pods] == [
        ("team/infer", 8192, 10, 1),
        ("team/train", 40960, 50, 1),
    ]
    assert a0.marks == () and a0.free_milli == 400  # memory: (81920 - 49152) / 81920
    assert _card(state, "a", 1).marks == (clusterview.CORDONED,)
    assert _card(state, "a", 1).free_milli == 0
    assert _card(state, "b", 0).marks == (clusterview.UNHEALTHY,)
    assert [n.excluded for n in state.nodes] == ["", "", "NodeLockHeld"]
    assert state.invalid_nodes == ("broken",)
    assert state.holders_status == clusterview.ON
    assert state.synced


def test_fragmentation_says_learning_until_the_workload_is_trusted() -> None:
    state = _state(fakes.make_deps(_cache()))
    assert state.workload == clusterview.LEARNING
    assert state.fragmentation is None
    assert all(n.fragmentation is None for n in state.nodes)


def test_fragmentation_is_fgds_measure_against_the_learned_workload() -> None:
    settings = model_config.WorkloadSettings(min_count=3, drift=0.0)
    cache = _cache(shapes.ShapeHistogram(settings))
    half = api.Shape(cpu_milli=0, share_milli=500, count=1)
    for _ in range(3):
        cache.observe_request(half)
    state = _state(fakes.make_deps(cache))
    assert state.workload == clusterview.TRUSTED
    by_node = {n.name: n.fragmentation for n in state.nodes}
    # a: card 0 has 400 milli free (below the 500 every expected pod asks: all fragment), card 1 is
    # cordoned (0 free). b: its only card is unhealthy. c: full.
    assert by_node["a"] == clusterview.Fragmentation(400, 400)
    assert by_node["b"] == clusterview.Fragmentation(0, 0)
    assert by_node["c"] == clusterview.Fragmentation(0, 0)
    assert state.fragmentation == clusterview.Fragmentation(400, 400)
    cache.remove_pod("ml/wide")  # c's card is free again: a whole card, usable by the 500-milli shape
    state = _state(fakes.make_deps(cache))
    assert state.fragmentation == clusterview.Fragmentation(400, 1400)


def test_state_json_is_reused_within_the_interval_and_then_refreshed() -> None:
    now = [0.0]
    cache = _cache()
    view = clusterview.ClusterView(fakes.make_deps(cache), clock=lambda: now[0], min_interval_s=1.0)
    first = msgspec.json.decode(view.state_json(), type=clusterview.State)
    cache.remove_pod("ml/wide")
    now[0] = 0.5
    assert msgspec.json.decode(view.state_json(), type=clusterview.State) == first
    now[0] = 1.0
    again = msgspec.json.decode(view.state_json(), type=clusterview.State)
    assert again.generation > first.generation
    assert _card(again, "c", 0).pods == ()


def test_sections_without_their_parts_say_unavailable() -> None:
    state = _state(fakes.make_deps(_cache()))
    assert (state.pending_status, state.pending, state.shadow_status, state.shadow) == (
        clusterview.UNAVAILABLE,
        (),
        clusterview.UNAVAILABLE,
        None,
    )


def test_pending_pods_carry_explains_per_card_explanation_and_shadow_off_says_off() -> None:
    deps = fakes.make_deps(_cache(), excluded={"c": "NodeLockHeld"})
    big = builders.pod("big").ns("team").uid("uid-big").gpu(1, memory=60000).obj()
    deps.pending.note(big, False, "0/3 nodes feasible")
    view = clusterview.ClusterView(deps, clusterview.pending_section(deps), clusterview.shadow_section(deps))
    state = view.state()
    assert state.pending_status == clusterview.ON and state.pending_more == 0
    (entry,) = state.pending
    assert (entry.pod, entry.filter_summary, entry.nodes_more) == ("team/big", "0/3 nodes feasible", 0)
    assert entry.explanation is not None
    doc = explains.decode(bytes(entry.explanation))
    full = explains.explain(deps.cache.snapshot(), big, deps.profile, deps.invalid_nodes, deps.excluded)
    assert (doc.summary, doc.change, sorted(doc.nodes, key=lambda n: n.name)) == (
        full.summary,
        full.change,
        list(full.nodes),
    )
    by_node = {n.name: n for n in doc.nodes}
    assert set(by_node) == {"a", "b", "c"} and not any(n.fits for n in doc.nodes)
    # a: card 0 has 32768 MiB free, card 1 is cordoned; c is excluded (the lock)
    assert [c.reason for c in by_node["a"].cards][1] == status.DEVICE_CORDONED
    assert "NodeLockHeld" in by_node["c"].reasons
    assert doc.nodes[0].name == "a"  # closest to fitting first: a card that only lacks memory
    assert (state.shadow_status, state.shadow) == (clusterview.OFF, None)
    deps.pending.drop("uid-big")
    assert view.state().pending == ()


def test_the_explained_nodes_are_cut_to_the_closest_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clusterview, "MAX_EXPLAINED_NODES", 1)
    deps = fakes.make_deps(_cache())
    deps.pending.note(builders.pod("big").uid("u").gpu(1, memory=60000).obj(), False, "")
    (entry,) = clusterview.pending_section(deps)(deps.cache.snapshot())[1]
    assert entry.explanation is not None
    assert [n.name for n in explains.decode(bytes(entry.explanation)).nodes] == ["a"]
    assert entry.nodes_more == 2


def test_given_sections_are_passed_through_as_json() -> None:
    def pending(snap: Any) -> tuple[str, list[clusterview.Pending], int]:
        explanation = clusterview.as_raw({"summary": "no fit"})
        return clusterview.ON, [clusterview.Pending(pod="ns/p", explanation=explanation)], 2

    def shadow() -> tuple[str, msgspec.Raw | None]:
        return clusterview.ON, clusterview.as_raw({"agreement": 0.5})

    state = clusterview.ClusterView(fakes.make_deps(_cache()), pending, shadow).state()
    decoded = msgspec.json.decode(msgspec.json.encode(state))
    assert decoded["pending"][0]["explanation"] == {"summary": "no fit"}
    assert decoded["pending_more"] == 2
    assert decoded["shadow"] == {"agreement": 0.5}


@pytest.fixture
def client() -> Iterator[TestClient]:
    deps = fakes.make_deps(_cache(), excluded={"c": "NodeLockHeld"})
    with TestClient(apps.create_app(deps), raise_server_exceptions=False) as c:
        yield c


def test_ui_serves_one_self_contained_page(client: TestClient) -> None:
    r = client.get("/ui")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    html = r.text
    assert "ui/state" in html
    # nothing fetched from elsewhere: no absolute URLs, no external scripts, styles or images
    assert not re.search(r"https?://|//cdn|<script[^>]+src=|<link[^>]+href=|<img", html), "external reference"
    assert ".innerHTML" not in html  # pod names are user input: the script writes text only


def test_ui_state_answers_the_views_json(client: TestClient) -> None:
    r = client.get("/ui/state")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    state = msgspec.json.decode(r.content, type=clusterview.State)
    assert [(n.name, n.excluded) for n in state.nodes] == [("a", ""), ("b", ""), ("c", "NodeLockHeld")]
    assert [p.pod for p in _card(state, "c", 0).pods] == ["ml/wide"]
    assert client.post("/ui/state").status_code == 405


def test_the_metrics_listener_serves_the_view_too() -> None:
    deps = fakes.make_deps(_cache())
    with TestClient(apps.create_metrics_app(deps)) as side:
        assert side.get("/ui").status_code == 200
        state = msgspec.json.decode(side.get("/ui/state").content, type=clusterview.State)
        assert [n.name for n in state.nodes] == ["a", "b", "c"]
        assert state.shadow_status == clusterview.OFF and state.pending_status == clusterview.ON


def test_capacity_held_for_a_preemptor_is_shown_on_its_cards() -> None:
    cache = _cache()
    alloc = builders.alloc("a", ((builders.uuid("a", 0), 20000, 30),))
    assert cache.nominate("team/urgent", "uid-urgent", alloc, expires_at=100.0)
    card = _card(_state(fakes.make_deps(cache)), "a", 0)
    assert [(p.pod, p.memory_mib, p.cores) for p in card.held] == [("team/urgent", 20000, 30)]
    assert [p.pod for p in card.pods] == ["team/infer", "team/train"]
    assert card.used_memory_mib == 40960 + 8192 + 20000  # the snapshot counts the held cards as taken
