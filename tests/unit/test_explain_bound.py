"""Explaining a pod the cache already holds: judged with its own cards free, and where it runs."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from gpuslice import explaincli
from gpuslice.cache import cache as caches
from gpuslice.extender import holdings, parsing
from gpuslice.extender.http import app as apps
from gpuslice.framework import explain, gangs, profile
from gpuslice.kube import objects
from gpuslice.model import nodes, requests, status
from gpuslice.policy import quota as quotas
from tests.unit import builders as b
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit

POLICIES = profile.Profile.build("binpack", "spread", choice="rank")
MIB = 24576


def three() -> caches.ClusterCache:
    """node-a, node-b, node-c: one 24 GiB card each; a and c hold 10000 MiB of others, b holds ``huge``."""
    cache = fakes.cluster_cache(*(b.node(n).gpus(1, memory=MIB) for n in ("node-a", "node-b", "node-c")))
    fakes.charge(cache, "other/a", "node-a", (0, 10000, 10))
    fakes.charge(cache, "other/c", "node-c", (0, 10000, 10))
    fakes.charge(cache, "default/huge", "node-b", (0, 20000, 50), uid="u-huge")
    return cache


def huge() -> requests.PodRequest:
    return b.pod("huge").uid("u-huge").gpu(1, memory=20000, cores=50).obj()


def node_of(doc: explain.Explanation, name: str) -> explain.Node:
    return next(n for n in doc.nodes if n.name == name)


def test_held_reads_the_pods_charge_from_the_cache() -> None:
    cache = three()
    held = holdings.held(cache, "default/huge", "u-huge")
    uuid = b.uuid("node-b", 0)
    assert held == explain.Held(
        node="node-b", cards=(uuid,), reservation=((uuid, nodes.CardUsage(1, 20000, 50)),)
    )
    assert holdings.held(cache, "default/huge", "u-older") is None  # another pod of that name
    assert holdings.held(cache, "default/ghost") is None


def test_bound_pod_is_judged_without_its_own_cards() -> None:
    cache = three()
    snap = cache.snapshot()
    unaware = explain.explain(snap, huge(), POLICIES)
    assert unaware.summary == "fits on none of 3 nodes"  # its own 20000 MiB count against it
    held = holdings.held(cache, "default/huge", "u-huge")
    doc = explain.explain(snap, huge(), POLICIES, held=held)
    uuid = b.uuid("node-b", 0)
    assert (doc.bound_node, doc.bound_cards, doc.feasible) == ("node-b", (uuid,), ("node-b",))
    assert (
        doc.summary == f"bound to node-b on card {uuid}; with its own cards free it would fit on 1 of 3 nodes"
    )
    assert doc.change == ""
    [card] = node_of(doc, "node-b").cards
    assert (card.memory_free_mib, card.cores_free, card.chosen) == (MIB, 100, True)
    assert not node_of(doc, "node-a").fits and not node_of(doc, "node-c").fits
    assert node_of(doc, "node-a") == node_of(unaware, "node-a")  # the other nodes are untouched
    assert cache.snapshot().nodes["node-b"].usage[0].memory_mib == 20000  # the cache is untouched


def test_bound_pod_fitting_nowhere_else_and_its_quota_released() -> None:
    cache = three()
    cache.set_quota("default", quotas.QuotaView(count_limit=1))  # the pod itself uses the one card
    held = holdings.held(cache, "default/huge", "u-huge")
    doc = explain.explain(cache.snapshot(), huge(), POLICIES, held=held)
    assert doc.feasible == ("node-b",)
    assert doc.quota is not None and doc.quota.used_count == 0
    small = b.pod("huge").uid("u-huge").gpu(1, memory=1000).obj()
    doc = explain.explain(cache.snapshot(), small, POLICIES, held=held)
    assert doc.summary.endswith("with its own cards free it would fit on 3 of 3 nodes")


def test_pending_pod_explanation_and_json_are_unchanged() -> None:
    cache = three()
    pod = b.pod("new").uid("u-new").gpu(1, memory=20000).obj()
    doc = explain.explain(cache.snapshot(), pod, POLICIES)
    assert doc == explain.explain(cache.snapshot(), pod, POLICIES, held=None)
    assert (doc.bound_node, doc.bound_cards, doc.summary) == ("", (), "fits on none of 3 nodes")
    as_json = json.loads(explain.encode(doc))
    assert "bound_node" not in as_json and "bound_cards" not in as_json
    assert explain.decode(explain.encode(doc)) == doc
    bound = explain.explain(cache.snapshot(), huge(), POLICIES, held=holdings.held(cache, "default/huge"))
    assert explain.decode(explain.encode(bound)) == bound


def test_cli_rows_name_the_bound_node_and_its_cards(capsys: pytest.CaptureFixture[str]) -> None:
    cache = three()
    doc = explain.explain(cache.snapshot(), huge(), POLICIES, held=holdings.held(cache, "default/huge"))
    tables = explaincli.rows(doc)
    node_rows = {r[0]: r for r in tables[0][2]}
    assert node_rows["node-b"][1] == "yes" and node_rows["node-b"][4] == "bound here (cards 0); cards 0"
    assert explaincli.shown_nodes(doc)[0].name == "node-b"
    assert tables[1][0] == "node-b: cards for container 0" and tables[1][2][0][-1] == "fits (chosen) (held)"
    explaincli.render(doc, width=240)
    out = capsys.readouterr().out
    assert "Pod default/huge: bound to node-b on card" in out and "(held)" in out


@pytest.fixture
def client() -> Iterator[tuple[TestClient, apps.Deps]]:
    deps = fakes.make_deps(three())
    with TestClient(apps.create_app(deps), raise_server_exceptions=False) as c:
        yield c, deps


def _reader(raw: dict[str, object]) -> objects.Pod:
    return objects.decode_pod(json.dumps(raw).encode())


def test_route_explains_a_bound_pod(client: tuple[TestClient, apps.Deps]) -> None:
    c, deps = client
    found = _reader(fakes.gpu_pod("huge", mem=20000, cores=50, uid="u-huge"))

    async def read(namespace: str, name: str) -> objects.Pod | None:
        return found if (namespace, name) == ("default", "huge") else None

    deps.read_pod = read
    r = c.get("/explain", params={"pod": "default/huge"})
    assert r.status_code == 200, r.text
    doc = explain.decode(r.content)
    assert doc.bound_node == "node-b" and doc.feasible == ("node-b",)
    assert doc.summary.startswith("bound to node-b on card ")


def test_route_answers_an_invalid_request_with_the_parsers_words(
    client: tuple[TestClient, apps.Deps],
) -> None:
    c, deps = client
    raw = fakes.gpu_pod("bad", mem=4000, namespace="team")
    raw["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "lots"
    found = _reader(raw)
    parsed = parsing.request_of(found)
    assert isinstance(parsed, status.Status)
    assert parsed.code is status.Code.UNRESOLVABLE and parsed.reasons == (status.INVALID_REQUEST,)

    async def read(namespace: str, name: str) -> objects.Pod | None:
        return found

    deps.read_pod = read
    r = c.get("/explain", params={"pod": "team/bad"})
    assert (r.status_code, r.text) == (422, f"pod team/bad: invalid GPU request: {parsed.message}")


def test_the_cli_shows_a_gang_plan_and_who_waits() -> None:
    plan = gangs.PlanView(
        gang="ml/train",
        source="annotation",
        quorum=3,
        arrived=2,
        open=False,
        expires_in_s=41.0,
        slots=(
            gangs.SlotView("ml/a", "n1", ("GPU-1",), "waiting"),
            gangs.SlotView("ml/b", "n1", ("GPU-2",), "waiting"),
            gangs.SlotView("(not created yet)", "n2", ("GPU-3",), "planned"),
        ),
    )
    gang = explain.Gang(gang="ml/train", source="annotation", minimum=3, plan=plan, waiting=("ml/a", "ml/b"))
    lines = explaincli.gang_lines(gang)
    assert lines[0] == "  gang ml/train (annotation), minimum 3"
    assert "2/3 at the barrier" in lines[1]
    assert lines[-1] == "    (not created yet): planned on n2 (GPU-3)"
    assert explaincli.gang_lines(None) == []
    missing = explaincli.gang_lines(explain.Gang(gang="ml/x", source="pod-group", minimum=0))
    assert "unknown" in missing[0] and missing[-1] == "    no plan holds cards for it now"
