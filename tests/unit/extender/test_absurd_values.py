"""Syntactically valid requests with absurd values: answered without a 5xx, kept out of the workload.

The fault run behind these: one pod asking ``cpu: 1e30`` reached the learned workload through its
filter, and from then on every FGD-style decision raised ``OverflowError`` in the column scorer
(a 500), until the shape decayed out. Here such a pod is an invalid request naming its field (every
node ``InvalidRequest``, a Warning event), the workload never sees it, and the next pod is placed.
Names longer than Kubernetes allows are a 400 naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from gpuslice.cache import shapes
from gpuslice.extender import config
from gpuslice.extender.http import app as apps
from gpuslice.model import config as model_config
from gpuslice.model import limits, status
from gpuslice.policy import api
from tests.unit.builders import node
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit

NODES = [f"n{i}" for i in range(3)]
ABSURD = [
    {"cpu": "1e30"},
    {"memory": "1e40"},
    {"nvidia.com/gpumem": "2147483648"},
    {"nvidia.com/gpucores": "99999999999"},
    {"nvidia.com/gpu": "2147483647"},
]


def _pod(name: str, extra: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    pod = fakes.gpu_pod(name, mem=4000)
    pod["spec"]["containers"][0]["resources"]["limits"].update(extra or {})
    pod["metadata"].update(meta)
    return pod


class Served:
    def __init__(self, client: TestClient, deps: apps.Deps, histogram: shapes.ShapeHistogram) -> None:
        self.client = client
        self.deps = deps
        self.histogram = histogram

    def post(self, verb: str, body: dict[str, Any]) -> Any:
        return self.client.post(verb, content=json.dumps(body))

    def filter(self, pod: dict[str, Any], names: list[str] = NODES) -> Any:
        return self.post("/filter", {"Pod": pod, "NodeNames": names})


@pytest.fixture(params=["fgd", "fgd-lookahead"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    """FGD-style node policies on a workload trusted from the first request, handed over at once."""
    hist = shapes.ShapeHistogram(model_config.WorkloadSettings(min_count=1))
    cache = fakes.cluster_cache(*(node(n).gpus(4).host(64000, 256000) for n in NODES), histogram=hist)
    settings = config.Settings(node_policy=request.param, workload_min_count=1, workload_period_s=0)
    deps = fakes.make_deps(cache, settings=settings)
    with TestClient(apps.create_app(deps), raise_server_exceptions=False) as c:
        yield Served(c, deps, hist)


@pytest.mark.parametrize("extra", ABSURD, ids=[next(iter(a)) for a in ABSURD])
def test_an_absurd_pod_is_refused_by_name_and_the_next_pod_is_placed(
    served: Served, extra: dict[str, str]
) -> None:
    for verb in ("/score", "/prioritize"):  # scored before any filter: every node 0
        r = served.post(verb, {"Pod": _pod("absurd", extra), "NodeNames": NODES})
        assert r.status_code == 200, r.text
        assert [h["Score"] for h in r.json()] == [0, 0, 0]
    r = served.filter(_pod("absurd", extra))
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["NodeNames"] == []
    assert answer["FailedAndUnresolvableNodes"] == dict.fromkeys(NODES, status.INVALID_REQUEST)
    events = served.deps.events.events  # type: ignore[attr-defined]
    (resource,) = extra
    assert [e[2] for e in events] == ["FilteringFailed"] and resource in events[0][3], events
    assert served.histogram.count == 0  # nothing entered the learned workload
    r = served.post("/preempt", {"Pod": _pod("absurd", extra), "NodeNameToMetaVictims": {}})
    assert r.status_code == 200, r.text
    # the next, ordinary pod: its shape is learned and it is placed with FGD's score
    for i in range(3):
        r = served.filter(_pod(f"ok-{i}"))
        assert r.status_code == 200, r.text
        assert r.json()["NodeNames"], r.json()
        r = served.post("/prioritize", {"Pod": _pod(f"ok-{i}"), "NodeNames": NODES})
        assert r.status_code == 200, r.text
    assert served.histogram.count == 3 and served.histogram.refused == 0


def test_a_shape_past_the_bounds_never_enters_the_workload() -> None:
    # The histogram's own guard, for whatever reaches it without a decoder (the simulator's traces).
    hist = shapes.ShapeHistogram(model_config.WorkloadSettings(min_count=1))
    assert not hist.observe(api.Shape(cpu_milli=10**33, share_milli=500, count=1))
    assert not hist.observe(api.Shape(cpu_milli=1000, share_milli=-1, count=1))
    assert not hist.observe(api.Shape(cpu_milli=1000, share_milli=500, count=1, types=("x" * 254,)))
    assert hist.count == 0 and hist.refused == 3 and hist.workload() is None
    assert hist.observe(api.Shape(cpu_milli=limits.MAX_CPU_MILLI, share_milli=1000, count=8))
    assert hist.count == 1


# ----- names longer than Kubernetes allows: a 400 naming the field


@pytest.fixture
def plain() -> Iterator[TestClient]:
    cache = fakes.cluster_cache(*(node(n).gpus(4) for n in NODES))
    with TestClient(apps.create_app(fakes.make_deps(cache)), raise_server_exceptions=False) as c:
        yield c


LONG = "n" * (limits.MAX_NAME + 1)
OVER_LONG = [
    ("/filter", {"Pod": _pod("p"), "NodeNames": [*NODES, LONG]}, "$.NodeNames[3]"),
    ("/prioritize", {"Pod": _pod("p"), "NodeNames": [LONG]}, "$.NodeNames[0]"),
    ("/score", {"Pod": _pod("p"), "NodeNames": [LONG] * 2}, "$.NodeNames[0]"),
    ("/filter", {"Pod": _pod("p", uid="u" * (limits.MAX_UID + 1)), "NodeNames": NODES}, "$.Pod.metadata.uid"),
    ("/filter", {"Pod": _pod("p", namespace="x" * 64), "NodeNames": NODES}, "$.Pod.metadata.namespace"),
    ("/filter", {"Pod": _pod("p" * 254), "NodeNames": NODES}, "$.Pod.metadata.name"),
    ("/bind", {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": LONG}, "$.Node"),
    ("/bind", {"PodName": "p", "PodNamespace": "default", "PodUID": "u" * 254, "Node": "n0"}, "$.PodUID"),
    (
        "/preempt",
        {"Pod": _pod("p"), "NodeNameToMetaVictims": {LONG: {"Pods": []}}},
        "$.NodeNameToMetaVictims",
    ),
]


@pytest.mark.parametrize(("verb", "body", "field"), OVER_LONG, ids=[f"{v} {f}" for v, _, f in OVER_LONG])
def test_a_name_longer_than_kubernetes_allows_is_a_400_naming_the_field(
    plain: TestClient, verb: str, body: dict[str, Any], field: str
) -> None:
    r = plain.post(verb, content=json.dumps(body))
    assert r.status_code == 400, r.text
    assert field in r.text and "length" in r.text


def test_names_at_the_limit_are_answered(plain: TestClient) -> None:
    edge = "n" * limits.MAX_NAME
    r = plain.post("/filter", content=json.dumps({"Pod": _pod("p"), "NodeNames": [*NODES, edge]}))
    assert r.status_code == 200, r.text
    assert r.json()["FailedAndUnresolvableNodes"][edge] == status.NODE_UNREGISTERED
