from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from gpuslice import explaincli
from gpuslice.cache import cache as caches
from gpuslice.extender.http import app as apps
from gpuslice.framework import cycle, explain, logs, pending, profile, scheduling
from gpuslice.kube import objects
from gpuslice.model import requests, status
from gpuslice.policy import quota as quotas
from tests.unit import builders as b
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit

POLICIES = profile.Profile.build("binpack", "spread", choice="rank")
LOG = logs.Log(0)


def cache_of(*registered: b.NodeBuilder) -> caches.ClusterCache:
    return fakes.cluster_cache(*registered)


def gpu3() -> caches.ClusterCache:
    """gpu-3: four 24 GiB cards with 20000, 20000, 18000 and 20000 MiB used (card 2 has 6576 free)."""
    cache = cache_of(b.node("gpu-3").gpus(4, memory=24576))
    for i, used in enumerate((20000, 20000, 18576, 20000)):
        fakes.charge(cache, f"other/p{i}", "gpu-3", (i, used, 10))
    return cache


def node_of(doc: explain.Explanation, name: str) -> explain.Node:
    return next(n for n in doc.nodes if n.name == name)


# ----- the sentences


def _memory() -> tuple[caches.ClusterCache, requests.PodRequest]:
    return gpu3(), b.pod().gpu(1, memory=8000).obj()


def _memory_two() -> tuple[caches.ClusterCache, requests.PodRequest]:
    return gpu3(), b.pod().gpu(2, memory=5000).obj()


def _count() -> tuple[caches.ClusterCache, requests.PodRequest]:
    return cache_of(b.node("gpu-3").gpus(2)), b.pod().gpu(4, memory=1000).obj()


def _type() -> tuple[caches.ClusterCache, requests.PodRequest]:
    return cache_of(b.node("gpu-3").gpus(2, model="T4")), b.pod().gpu(1, memory=1000).types("A100").obj()


def _nouse_type() -> tuple[caches.ClusterCache, requests.PodRequest]:
    return cache_of(b.node("gpu-3").gpus(2, model="T4")), b.pod().gpu(1).nouse_types("t4").obj()


def _cores() -> tuple[caches.ClusterCache, requests.PodRequest]:
    cache = cache_of(b.node("gpu-3").gpus(2))
    fakes.charge(cache, "other/a", "gpu-3", (0, 1000, 70), (1, 1000, 80))
    return cache, b.pod().gpu(1, memory=1000, cores=50).obj()


def _exclusive() -> tuple[caches.ClusterCache, requests.PodRequest]:
    cache = cache_of(b.node("gpu-3").gpus(2))
    fakes.charge(cache, "other/a", "gpu-3", (0, 1000, 0), (1, 1000, 0))
    return cache, b.pod().gpu(1, cores=100).obj()


def _slots() -> tuple[caches.ClusterCache, requests.PodRequest]:
    cache = cache_of(b.node("gpu-3").card(slots=1))
    fakes.charge(cache, "other/a", "gpu-3", (0, 1000, 10))
    return cache, b.pod().gpu(1, memory=1000).obj()


def _unhealthy() -> tuple[caches.ClusterCache, requests.PodRequest]:
    return cache_of(b.node("gpu-3").card(health=False)), b.pod().gpu(1).obj()


def _cordoned() -> tuple[caches.ClusterCache, requests.PodRequest]:
    return cache_of(b.node("gpu-3").gpus(2).cordon(0).cordon(1)), b.pod().gpu(1).obj()


def _uuid() -> tuple[caches.ClusterCache, requests.PodRequest]:
    return cache_of(b.node("gpu-3").gpus(1)), b.pod().gpu(1).uuids("GPU-other-0").obj()


def _numa_hint() -> tuple[caches.ClusterCache, requests.PodRequest]:
    return cache_of(b.node("gpu-3").card(numa=0).card(numa=0)), b.pod().gpu(1).numa(1).obj()


def _numa_bind() -> tuple[caches.ClusterCache, requests.PodRequest]:
    node = b.node("gpu-3").card(numa=0).card(numa=0).card(numa=1).card(numa=1)
    return cache_of(node), b.pod().gpu(3, memory=1000).numa_bind().obj()


def _quota() -> tuple[caches.ClusterCache, requests.PodRequest]:
    cache = cache_of(b.node("gpu-3").gpus(2, memory=24576))
    cache.set_quota("team", quotas.QuotaView(memory_limit=16000))
    fakes.charge(cache, "team/old", "gpu-3", (0, 12000, 0))
    return cache, b.pod().ns("team").gpu(1, memory=6000).obj()


def _quota_cards() -> tuple[caches.ClusterCache, requests.PodRequest]:
    cache = cache_of(b.node("gpu-3").gpus(4))
    cache.set_quota("team", quotas.QuotaView(count_limit=2))
    fakes.charge(cache, "team/old", "gpu-3", (0, 1000, 0))
    return cache, b.pod().ns("team").gpu(2, memory=1000).obj()


def _nvlink() -> tuple[caches.ClusterCache, requests.PodRequest]:
    # bridged pairs 0-1 and 2-3, card 3 full: 3 cards linked pairwise exist nowhere, 2 do
    cache = cache_of(b.node("gpu-3").gpus(4).topo(b.bridged("gpu-3", 4, [(0, 1), (2, 3)], gbps=100.0)))
    fakes.charge(cache, "other/full", "gpu-3", (3, 81920, 10))
    link = requests.TopologyRequirement(require_nvlink=True)
    return cache, msgspec.structs.replace(b.pod().gpu(3, memory=1000).obj(), topology=link)


def _bandwidth() -> tuple[caches.ClusterCache, requests.PodRequest]:
    # every pair is NVLink-bridged at 100 GB/s, the pod asks 200
    cache = cache_of(b.node("gpu-3").gpus(2).topo(b.bridged("gpu-3", 2, [(0, 1)], gbps=100.0)))
    link = requests.TopologyRequirement(min_bandwidth_gbps=200.0)
    return cache, msgspec.structs.replace(b.pod().gpu(2, memory=1000).obj(), topology=link)


SENTENCES = [
    (_memory, "needs 8000 MiB per card, largest free is 6000 MiB on gpu-3 card 2", "InsufficientGPUMemory"),
    (
        _memory_two,
        "needs 5000 MiB per card on 2 cards, the largest free are 6000, 4576 MiB on gpu-3 cards 2, 0",
        "InsufficientGPUMemory",
    ),
    (_count, "needs 4 cards, gpu-3 has 2", "InsufficientGPUCount"),
    (_type, "card type T4 excluded by nvidia.com/use-gputype=A100", "DeviceTypeMismatch"),
    (_nouse_type, "card type T4 excluded by nvidia.com/nouse-gputype=t4", "DeviceTypeMismatch"),
    (_cores, "needs 50 % cores per card, most free is 30 % on gpu-3 card 0", "InsufficientGPUCores"),
    (
        _exclusive,
        "needs a whole card (100 % cores) nobody uses, gpu-3 cards 0, 1 in use",
        "ExclusiveConflict",
    ),
    (
        _slots,
        "needs a free task slot on 1 card(s), every slot is taken on gpu-3 card 0",
        "GPUSlotsExhausted",
    ),
    (_unhealthy, "gpu-3 card 0 unhealthy", "DeviceUnhealthy"),
    (_cordoned, "gpu-3 cards 0, 1 cordoned (hami.io/device-cordon)", "DeviceCordoned"),
    (_uuid, "gpu-3 card 0 excluded by nvidia.com/use-gpuuuid=GPU-other-0", "UUIDFiltered"),
    (_numa_hint, "hami.io/numa-hint=1 asks NUMA node 1, gpu-3 has cards on 0", "NUMAUnsatisfied"),
    (
        _numa_bind,
        "needs 3 cards on one NUMA node (nvidia.com/numa-bind), at most 2 usable on gpu-3",
        "NUMAUnsatisfied",
    ),
    (_quota, "namespace quota: 12000 of 16000 MiB used, pod needs 6000", "QuotaExceeded"),
    (_quota_cards, "namespace quota: 1 of 2 cards used, pod needs 2", "QuotaExceeded"),
    (
        _nvlink,
        "needs 3 cards linked pairwise by NVLink (hami.io/gpu-topology-requirement), "
        "the largest such group of usable cards on gpu-3 is 2 (gpu-3 cards 0, 1)",
        "NVLinkRequired",
    ),
    (
        _bandwidth,
        "needs 2 cards linked pairwise by at least 200 GB/s (hami.io/gpu-topology-requirement), "
        "the largest such group of usable cards on gpu-3 is 1",
        "InsufficientGPUBandwidth",
    ),
]


@pytest.mark.parametrize(
    ("case", "sentence", "reason"), SENTENCES, ids=[s[2] + s[0].__name__ for s in SENTENCES]
)
def test_smallest_change_sentences(case: Any, sentence: str, reason: str) -> None:
    cache, pod = case()
    doc = explain.explain(cache.snapshot(), pod, POLICIES)
    node = node_of(doc, "gpu-3")
    assert not node.fits
    assert node.change == sentence
    assert doc.change == sentence
    assert reason in node.reasons
    assert doc.feasible == ()
    assert doc.summary == "fits on none of 1 nodes"


def test_node_level_reasons_are_the_filters() -> None:
    cache = cache_of(b.node("gpu-1").gpus(1), b.node("gpu-2").gpus(1))
    pod = b.pod().gpu(1, memory=1000).obj()
    invalid = {"gpu-9": "bad JSON"}
    excluded = {"gpu-2": status.NODE_HANDSHAKE_STALE}
    names = ["gpu-1", "gpu-2", "gpu-9", "cpu-1"]
    doc = explain.explain(cache.snapshot(), pod, POLICIES, invalid, excluded, names=names)
    assert [n.name for n in doc.nodes] == names
    assert doc.feasible == ("gpu-1",)
    assert node_of(doc, "gpu-2").change == (
        "gpu-2's device plugin stopped reporting (stale hami.io/node-handshake); restart it"
    )
    assert node_of(doc, "gpu-9").change == (
        "gpu-9's GPU registration (hami.io/node-nvidia-register) does not decode: bad JSON"
    )
    assert node_of(doc, "cpu-1").change == (
        "cpu-1 has no GPU registration (hami.io/node-nvidia-register): no device plugin registered cards"
    )
    assert node_of(doc, "cpu-1").code == "UnschedulableAndUnresolvable"
    assert node_of(doc, "gpu-2").code == "Unschedulable"
    assert doc.change == "" and doc.summary == "fits on 1 of 4 nodes"
    out = scheduling.filter_nodes(
        cycle.Cycle.of(POLICIES, cache.snapshot(), pod), names, LOG, invalid, excluded
    )
    for n in doc.nodes:
        if not n.fits:
            assert (out.failed | out.unresolvable)[n.name] == ",".join(n.reasons)


def test_default_nodes_are_registered_invalid_and_excluded() -> None:
    cache = cache_of(b.node("b").gpus(1), b.node("a").gpus(1))
    doc = explain.explain(
        cache.snapshot(), b.pod().gpu(1).obj(), POLICIES, ["z"], {"b": status.NODE_LOCK_HELD}
    )
    assert [n.name for n in doc.nodes] == ["a", "b", "z"]
    assert [n.fits for n in doc.nodes] == [True, False, False]


def test_fitting_node_shows_the_cards_it_would_get_and_why_others_not() -> None:
    cache = cache_of(b.node("gpu-3").gpus(3, memory=24576).unhealthy(2))
    fakes.charge(cache, "other/a", "gpu-3", (0, 20000, 0))
    doc = explain.explain(cache.snapshot(), b.pod().gpu(1, memory=8000, cores=30).obj(), POLICIES)
    node = node_of(doc, "gpu-3")
    assert node.fits and node.change == "" and node.container == 0
    assert [(c.index, c.reason, c.chosen) for c in node.cards] == [
        (0, "InsufficientGPUMemory", False),
        (1, "fits", True),
        (2, "DeviceUnhealthy", False),
    ]
    c0 = node.cards[0]
    assert (c0.memory_free_mib, c0.memory_total_mib, c0.slots_free, c0.slots_total) == (4576, 24576, 9, 10)
    assert doc.asks == (
        explain.Ask(container=0, kind="app", count=1, memory_mib=8000, memory_percent=None, cores=30),
    )


def test_second_app_container_is_judged_with_the_firsts_cards_taken() -> None:
    cache = cache_of(b.node("gpu-3").gpus(2, memory=81920))
    pod = b.pod().gpu(2, memory=50000).gpu(1, memory=40000).obj()
    doc = explain.explain(cache.snapshot(), pod, POLICIES)
    node = node_of(doc, "gpu-3")
    assert not node.fits and node.container == 1
    assert [c.memory_free_mib for c in node.cards] == [31920, 31920]
    assert node.change == "needs 40000 MiB per card, largest free is 31920 MiB on gpu-3 card 0"


def test_percentage_memory_sentence() -> None:
    cache = cache_of(b.node("gpu-3").gpus(1, memory=40000))
    fakes.charge(cache, "other/a", "gpu-3", (0, 30000, 0))
    doc = explain.explain(cache.snapshot(), b.pod().gpu(1, pct=50).obj(), POLICIES)
    assert doc.change == (
        "needs 50 % of a card's memory (20000 MiB on gpu-3 card 0), largest free is 10000 MiB on gpu-3 card 0"
    )


def test_pod_change_is_the_closest_node_and_prefers_what_freeing_can_fix() -> None:
    cache = cache_of(
        b.node("a").gpus(1, memory=24576),
        b.node("b").gpus(1, memory=24576),
        b.node("t4").gpus(1, memory=4096),
    )
    fakes.charge(cache, "o/a", "a", (0, 20000, 0))  # 4576 free
    fakes.charge(cache, "o/b", "b", (0, 18000, 0))  # 6576 free
    doc = explain.explain(cache.snapshot(), b.pod().gpu(1, memory=8000).obj(), POLICIES)
    assert node_of(doc, "t4").code == "UnschedulableAndUnresolvable"
    assert doc.change == "needs 8000 MiB per card, largest free is 6576 MiB on b card 0"


def test_gpuless_pod_fits_everywhere() -> None:
    cache = cache_of(b.node("a").gpus(1))
    doc = explain.explain(cache.snapshot(), b.pod().no_gpu().obj(), POLICIES)
    assert doc.feasible == ("a",) and doc.summary == "asks no GPU: the extender passes every node"


def test_json_round_trip() -> None:
    cache, pod = _quota()
    doc = explain.explain(cache.snapshot(), pod, POLICIES)
    assert explain.decode(explain.encode(doc)) == doc
    assert doc.quota == explain.Quota(
        count_limit=None,
        memory_limit_mib=16000,
        cores_limit=None,
        used_count=1,
        used_memory_mib=12000,
        used_cores=0,
    )


def test_render_prints_tables_and_the_change(capsys: pytest.CaptureFixture[str]) -> None:
    cache, pod = _memory()
    explaincli.render(explain.explain(cache.snapshot(), pod, POLICIES), width=200)
    out = capsys.readouterr().out
    assert "gpu-3: cards for container 0" in out
    assert "Smallest change: needs 8000 MiB per card, largest free is 6000 MiB on gpu-3 card 2" in out
    assert "6000/24576" in out


@pytest.mark.parametrize("arg", ["nopod", "/x", "ns/", "a/b/c"])
def test_cli_bad_argument_is_status_2(arg: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert explaincli.run([arg, "--extender", "http://127.0.0.1:9"]) == 2
    assert "expected NAMESPACE/POD" in capsys.readouterr().err


def test_cli_unreachable_extender_is_status_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert explaincli.run(["ns/p", "--extender", "http://127.0.0.1:9", "--timeout", "2"]) == 1
    assert "cannot reach the extender" in capsys.readouterr().err


# ----- agreement with the filter

MODELS = ("NVIDIA A100-SXM4-80GB", "Tesla T4")


@st.composite
def clusters(draw: st.DrawFn) -> tuple[caches.ClusterCache, list[str]]:
    builders_ = []
    charges: list[tuple[str, tuple[tuple[int, int, int], ...]]] = []
    for k in range(draw(st.integers(1, 4))):
        name = f"n{k}"
        node = b.node(name)
        ncards = draw(st.integers(1, 4))
        model = draw(st.sampled_from(MODELS))
        for i in range(ncards):
            node.card(
                model=model,
                memory=draw(st.sampled_from((16384, 24576, 81920))),
                slots=draw(st.integers(1, 4)),
                numa=i * 2 // ncards,
                health=draw(st.sampled_from((True, True, True, True, False))),
            )
        if draw(st.booleans()) and ncards > 1:
            node.cordon(draw(st.integers(0, ncards - 1)))
        builders_.append(node)
        for _ in range(draw(st.integers(0, 3))):
            i = draw(st.integers(0, ncards - 1))
            charges.append(
                (name, ((i, draw(st.integers(0, 16000)), draw(st.sampled_from((0, 20, 50, 100)))),))
            )
    cache = cache_of(*builders_)
    for j, (name, grants) in enumerate(charges):
        fakes.charge(cache, f"team/run{j}", name, *grants)
    if draw(st.booleans()):
        cache.set_quota(
            "team",
            quotas.QuotaView(
                count_limit=draw(st.none() | st.integers(0, 8)),
                memory_limit=draw(st.none() | st.integers(0, 60000)),
                cores_limit=draw(st.none() | st.integers(0, 400)),
            ),
        )
    names = [f"n{k}" for k in range(len(builders_))] + ["ghost", "bad"]
    return cache, names


@st.composite
def pods(draw: st.DrawFn) -> requests.PodRequest:
    pod = b.pod("p").ns("team")
    for _ in range(draw(st.integers(1, 2))):
        if draw(st.booleans()):
            pod.gpu(
                draw(st.integers(1, 3)),
                memory=draw(st.integers(0, 30000)),
                cores=draw(st.sampled_from((0, 30, 100))),
            )
        else:
            pod.gpu(
                draw(st.integers(1, 2)), pct=draw(st.integers(1, 100)), cores=draw(st.sampled_from((0, 50)))
            )
    if draw(st.booleans()):
        pod.init_gpu(1, memory=draw(st.integers(0, 30000)))
    sel = draw(st.sampled_from(("none", "a100", "t4", "numa")))
    if sel == "a100":
        pod.types("A100")
    elif sel == "t4":
        pod.nouse_types("T4")
    elif sel == "numa":
        pod.numa_bind()
    return pod.obj()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), pods(), st.sampled_from(("spread", "binpack", "mutex", "binpack,numa")))
def test_explain_agrees_with_the_filter(
    cluster: tuple[caches.ClusterCache, list[str]], pod: requests.PodRequest, card_policy: str
) -> None:
    cache, names = cluster
    policies = profile.Profile.build("binpack", card_policy, choice="rank")
    invalid = {"bad": "bad JSON"}
    excluded = {names[0]: status.NODE_LOCK_HELD} if len(names) > 3 else {}
    snap = cache.snapshot()
    out = scheduling.filter_nodes(cycle.Cycle.of(policies, snap, pod), names, LOG, invalid, excluded)
    doc = explain.explain(snap, pod, policies, invalid, excluded, names=names)
    assert list(doc.feasible) == out.feasible
    for n in doc.nodes:
        if n.fits:
            continue
        if n.code == "Unschedulable":
            assert out.failed[n.name] == ",".join(n.reasons)
        else:
            assert out.unresolvable[n.name] == ",".join(n.reasons)
        assert n.change
    if not doc.feasible:
        assert doc.change
    for n in doc.nodes:
        assert any(c.chosen for c in n.cards) == n.fits


# ----- the pending registry and the route


def test_pending_registry_keeps_only_pods_nothing_fits() -> None:
    now = [100.0]
    alive = {"team/a", "team/b", "team/c"}
    reg = pending.PendingPods(limit=2, alive=lambda key, uid: key in alive, clock=lambda: now[0])
    a = b.pod("a").ns("team").uid("ua").gpu(1).obj()
    reg.note(a, False, "0/3 nodes feasible")
    now[0] = 101.0
    reg.note(a, False, "0/3 nodes feasible, 3 InsufficientGPUMemory")
    entry = reg.get("team/a")
    assert entry is not None and (entry.first_seen, entry.last_seen) == (100.0, 101.0)
    assert entry.summary.endswith("InsufficientGPUMemory") and entry.request == a
    reg.note(b.pod("b").ns("team").uid("ub").gpu(1).obj(), False, "x")
    reg.note(b.pod("c").ns("team").uid("uc").gpu(1).obj(), False, "x")
    assert [p.key for p in reg.pods()] == ["team/b", "team/c"]  # bounded: the oldest noted went
    reg.note(b.pod("b").ns("team").uid("ub").gpu(1).obj(), True, "1/3 nodes feasible")
    assert [p.key for p in reg.pods()] == ["team/c"]
    alive.discard("team/c")
    assert reg.pods() == [] and len(reg) == 0


@pytest.fixture
def route_client() -> Iterator[tuple[TestClient, apps.Deps]]:
    cache, _ = _memory()
    deps = fakes.make_deps(cache)
    with TestClient(apps.create_app(deps), raise_server_exceptions=False) as c:
        yield c, deps


def test_filter_notes_a_pod_nothing_fits_and_the_route_explains_it(
    route_client: tuple[TestClient, apps.Deps],
) -> None:
    client, deps = route_client
    pod = fakes.gpu_pod("big", mem=8000, namespace="team", uid="u-big")
    r = client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": ["gpu-3"]})
    assert r.status_code == 200 and r.json()["NodeNames"] == []
    [entry] = deps.pending.pods()
    assert entry.key == "team/big" and entry.uid == "u-big"
    r = client.get("/explain", params={"pod": "team/big"})
    assert r.status_code == 200
    doc = explain.decode(r.content)
    assert doc.change == "needs 8000 MiB per card, largest free is 6000 MiB on gpu-3 card 2"
    expected = explain.explain(deps.cache.snapshot(), entry.request, deps.profile)
    assert doc == expected
    small = fakes.gpu_pod("big", mem=1000, namespace="team", uid="u-big")
    r = client.post("/filter", json={"Pod": small, "Nodes": None, "NodeNames": ["gpu-3"]})
    assert r.json()["NodeNames"] == ["gpu-3"]
    assert deps.pending.pods() == []


@pytest.mark.parametrize(("arg", "code"), [("", 400), ("nons", 400), ("a/b/c", 400), ("team/ghost", 404)])
def test_route_answers_bad_arguments_and_unknown_pods(
    route_client: tuple[TestClient, apps.Deps], arg: str, code: int
) -> None:
    client, _ = route_client
    r = client.get("/explain", params={"pod": arg})
    assert r.status_code == code, r.text


def test_route_reads_a_pod_that_is_not_pending(route_client: tuple[TestClient, apps.Deps]) -> None:
    client, deps = route_client
    raw = fakes.gpu_pod("running", mem=1000, namespace="team", uid="u-run")
    found = objects.decode_pod(json.dumps(raw).encode())

    async def read(namespace: str, name: str) -> objects.Pod | None:
        return found if (namespace, name) == ("team", "running") else None

    deps.read_pod = read
    r = client.get("/explain", params={"pod": "team/running"})
    assert r.status_code == 200, r.text
    doc = explain.decode(r.content)
    assert (doc.namespace, doc.name, doc.uid, doc.feasible) == ("team", "running", "u-run", ("gpu-3",))
    assert client.get("/explain", params={"pod": "team/other"}).status_code == 404


def test_render_without_rich_prints_plain_rows(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "rich.console", None)  # the server install has no rich
    cache, pod = _memory()
    explaincli.render(explain.explain(cache.snapshot(), pod, POLICIES))
    out = capsys.readouterr().out
    assert "  2 | NVIDIA A100-SXM4-80GB | 0 | 6000/24576 | 90/100 | 9/10 | InsufficientGPUMemory" in out
    assert out.rstrip().endswith(
        "Smallest change: needs 8000 MiB per card, largest free is 6000 MiB on gpu-3 card 2"
    )
