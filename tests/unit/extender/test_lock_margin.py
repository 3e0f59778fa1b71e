"""The lock margin in the extender: which locks count as busy, and how each node choice uses them.

The cluster is the one of ``test_node_choice``: four one-card 80 GiB nodes, "a-half" and "b-half"
with 40000 MiB taken each, "c-free" idle, "d-full" with 78000 MiB taken. For a pod of 8000 MiB and
30 cores, binpack scores a-half and b-half 51 each and c-free 18; d-full does not fit. With a
margin of 0.1 the band is 41..51: a-half and b-half only; with 0.6 it reaches down to 0.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import pytest
from starlette.testclient import TestClient

from gpuslice.codec import locks as lockcodec
from gpuslice.extender import config
from gpuslice.extender.binding import bind as binds
from gpuslice.extender.binding import lockview
from gpuslice.extender.http import app as apps
from gpuslice.kube import objects
from gpuslice.model import config as model_config
from tests.unit.extender import fakes
from tests.unit.extender.test_node_choice import _cache

pytestmark = pytest.mark.unit

NAMES = ["c-free", "b-half", "d-full", "a-half"]
NOW = fakes.CLOCK


def _client(choice: str, margin: float, busy: Callable[[str], Collection[str]] | None) -> TestClient:
    deps = fakes.make_deps(_cache(), settings=config.Settings(node_choice=choice, lock_margin=margin))
    deps.locks = busy
    return TestClient(apps.create_app(deps))


def _filter(client: TestClient, name: str, names: list[str] = NAMES) -> list[str]:
    pod = fakes.gpu_pod(name, mem=8000, cores=30)
    body = client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": names}).json()
    answer: list[str] = body["NodeNames"]
    return answer


def _prioritize(client: TestClient, name: str) -> dict[str, int]:
    pod = fakes.gpu_pod(name, mem=8000, cores=30)
    feasible = ["c-free", "b-half", "a-half"]
    body = client.post("/prioritize", json={"Pod": pod, "Nodes": None, "NodeNames": feasible}).json()
    return {h["Host"]: h["Score"] for h in body}


def _moves(deps: apps.Deps, verb: str) -> float:
    value = deps.metrics.registry.get_sample_value("gpuslice_lock_margin_moves_total", {"verb": verb})
    return value or 0.0


def _busy(*nodes: str) -> Callable[[str], Collection[str]]:
    return lambda key: set(nodes)


@pytest.mark.parametrize(
    ("margin", "busy", "expected"),
    [
        (0.0, ("a-half",), "a-half"),  # margin 0: the policy's choice, locks or not
        (0.1, (), "a-half"),  # nothing busy: the best, ties to the lower name
        (0.1, ("a-half",), "b-half"),  # the best is busy; b-half scores the same and is free
        (0.1, ("b-half",), "a-half"),  # the best is free already
        (0.1, ("a-half", "b-half"), "a-half"),  # every node in the band busy: the best score
        (0.6, ("a-half", "b-half"), "c-free"),  # a band of 60 points reaches the idle node
        (0.3, ("a-half", "b-half"), "a-half"),  # 30 points (21..51) do not: 18 is outside
        (0.1, ("c-free",), "a-half"),  # a busy lock outside the band changes nothing
    ],
    ids=[
        "margin-0-unchanged",
        "nothing-busy",
        "free-node-in-band-preferred",
        "free-best-stays",
        "all-in-band-busy-best-score",
        "wide-band-reaches-idle-node",
        "band-stops-short-of-idle-node",
        "busy-outside-band-ignored",
    ],
)
def test_extender_filter_answers_the_lock_aware_choice(
    margin: float, busy: tuple[str, ...], expected: str
) -> None:
    with _client("extender", margin, _busy(*busy)) as client:
        assert _filter(client, "p") == [expected]


def test_margin_0_never_asks_for_the_lock_state() -> None:
    def refuse(key: str) -> Collection[str]:
        raise AssertionError("the lock state was read at margin 0")

    for choice in ("extender", "rank", "blend"):
        with _client(choice, 0.0, refuse) as client:
            assert _filter(client, "p")
            assert _prioritize(client, "p")


def test_rank_prioritize_ranks_the_free_node_in_band_first() -> None:
    with _client("rank", 0.1, _busy("a-half")) as client:
        # without locks: a-half 10, b-half 9 (ties to the lower name), c-free 8
        assert _prioritize(client, "p") == {"b-half": 10, "a-half": 9, "c-free": 8}
    with _client("rank", 0.1, _busy("c-free")) as client:
        assert _prioritize(client, "p") == {"a-half": 10, "b-half": 9, "c-free": 8}


def test_blend_prioritize_lowers_the_busy_node_in_band() -> None:
    with _client("blend", 0.0, _busy("a-half")) as client:
        plain = _prioritize(client, "p")
    with _client("blend", 0.1, _busy("a-half")) as client:
        aware = _prioritize(client, "p")
    # 51 -> 5 on the wire, 18 -> 2; a-half loses 10 + 1 points: 40 -> 4; the others keep theirs
    assert plain == {"c-free": 2, "b-half": 5, "a-half": 5}
    assert aware == {"c-free": 2, "b-half": 5, "a-half": 4}


def test_moves_are_counted_per_verb() -> None:
    deps = fakes.make_deps(_cache(), settings=config.Settings(lock_margin=0.1))
    deps.locks = _busy("a-half")
    with TestClient(apps.create_app(deps)) as client:
        assert _filter(client, "p") == ["b-half"]
    assert _moves(deps, "filter") == 1.0
    deps = fakes.make_deps(_cache(), settings=config.Settings(lock_margin=0.1))
    deps.locks = _busy("b-half")  # the best (a-half) is free: no move
    with TestClient(apps.create_app(deps)) as client:
        assert _filter(client, "p") == ["a-half"]
    assert _moves(deps, "filter") == 0.0
    deps = fakes.make_deps(_cache(), settings=config.Settings(node_choice="rank", lock_margin=0.1))
    deps.locks = _busy("a-half")
    with TestClient(apps.create_app(deps)) as client:
        _prioritize(client, "p")
    assert _moves(deps, "prioritize") == 1.0


def test_a_filter_answer_counts_as_taken_until_its_bind_and_only_for_other_pods() -> None:
    # kube-scheduler filters the next pod of a burst before the previous pod's /bind arrives: the
    # node the filter answered is taken (``BindFlow.claim``) for CLAIM_TTL_S, or until that bind.
    deps = fakes.make_deps(_cache(), settings=config.Settings(lock_margin=0.1))
    flow = deps.flow
    clock = [100.0]
    flow.monotonic = lambda: clock[0]
    deps.locks = lockview.LockView(dict, lambda key: None, flow.in_flight, lambda: NOW, 300.0).busy
    with TestClient(apps.create_app(deps)) as client:
        assert _filter(client, "p1") == ["a-half"]
        assert flow.in_flight("default/p2") == {"a-half"}
        assert flow.in_flight("default/p1") == set()  # a pod never waits for itself
        assert _filter(client, "p2") == ["b-half"]
        assert _filter(client, "p1") == ["a-half"]  # p1 filtered again: its own claim is no lock
        clock[0] += binds.CLAIM_TTL_S + 0.1  # no bind came: the claims lapse
        assert flow.in_flight("default/p3") == set()
        assert _filter(client, "p3") == ["a-half"]
        # p3's bind starts: its claim gives way to the bind itself, which ends here (bound)
        bound = client.post(
            "/bind",
            json={"PodName": "p3", "PodNamespace": "default", "PodUID": "uid-p3", "Node": "a-half"},
        ).json()
        assert bound["Error"] == ""
        assert flow.in_flight("default/p4") == set()


# ----------------------------------------------------------------------------- which locks are busy


def _pod(name: str, *, phase: str = "Pending", deleting: bool = False) -> objects.Pod:
    meta = objects.ObjectMeta(
        name=name, namespace="default", deletion_timestamp="2023-11-14T22:00:00Z" if deleting else None
    )
    return objects.Pod(metadata=meta, status=objects.PodStatus(phase=phase))


def _value(owner: str | None, age_s: float = 1.0) -> str:
    taken = NOW - age_s
    if owner is None:
        return lockcodec.encode(taken, "x", "y").split(",")[0]  # legacy: a bare timestamp
    return lockcodec.encode(taken, "default", owner)


PODS: dict[str, objects.Pod] = {
    "default/live": _pod("live"),
    "default/running": _pod("running", phase="Running"),
    "default/done": _pod("done", phase="Succeeded"),
    "default/failed": _pod("failed", phase="Failed"),
    "default/leaving": _pod("leaving", deleting=True),
}


@pytest.mark.parametrize(
    ("value", "busy"),
    [
        (_value("live"), True),  # a live pod waiting for its Allocate holds it
        (_value("running"), True),  # bound and running, the plugin not done yet: still held
        (_value("me"), False),  # the pod itself (a bind of it died after the lock): it re-takes it
        (_value("gone"), False),  # dangling: the owner is not in the pod watch
        (_value("done"), False),  # dangling: finished
        (_value("failed"), False),  # dangling: finished
        (_value("leaving"), False),  # dangling: being deleted
        (_value("live", age_s=301.0), False),  # expired (older than the 300 s expiry)
        ("not a lock", False),  # unreadable: the bind takes it over
        (_value(None), True),  # legacy, no owner: held until it expires
        (_value(None, age_s=301.0), False),
    ],
    ids=[
        "live-owner",
        "running-owner",
        "own-lock",
        "owner-gone",
        "owner-succeeded",
        "owner-failed",
        "owner-deleting",
        "expired",
        "malformed",
        "legacy-fresh",
        "legacy-expired",
    ],
)
def test_holds_judges_the_lock_as_the_bind_path_would(value: str, busy: bool) -> None:
    assert lockview.holds(value, "default/me", NOW, 300.0, PODS.get) is busy


def test_lock_view_joins_the_node_watch_and_the_binds_in_flight() -> None:
    locks = {"n1": _value("live"), "n2": _value("gone"), "n3": _value("me")}
    seen: list[str] = []

    def in_flight(key: str) -> set[str]:
        seen.append(key)
        return {"n4"}

    view = lockview.LockView(lambda: locks, PODS.get, in_flight, lambda: NOW, 300.0)
    assert view.busy("default/me") == {"n1", "n4"}
    assert seen == ["default/me"]


def test_lock_margin_setting() -> None:
    assert config.validate({}).lock_margin == model_config.DEFAULT_LOCK_MARGIN  # the default is valid
    assert config.parse(["--lock-margin", "0.1"], environ={}).lock_margin == 0.1
    assert config.parse([], environ={"GPUSLICE_LOCK_MARGIN": "0.05"}).lock_margin == 0.05
    for bad in ("-0.1", "1.5", "nan"):
        with pytest.raises(config.ConfigError, match="lock_margin"):
            config.parse(["--lock-margin", bad], environ={})
