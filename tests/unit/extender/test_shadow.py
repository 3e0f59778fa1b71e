from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from starlette.testclient import TestClient

from gpuslice.cache import cache as caches
from gpuslice.cache import shapes
from gpuslice.extender import config
from gpuslice.extender.http import app as apps
from gpuslice.extender.ops import shadow
from gpuslice.policy import decisions
from gpuslice.sim import shadowreport
from tests.unit.builders import node, uuid
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit

# n-free: one idle 80 GiB card. n-half: one card with 40000 MiB used. n-two: two idle cards.
# Live: binpack (node) + spread (cards). binpack puts a pod on the fullest node (n-half); the
# shadow "spread" node policy puts it on an emptier one, the shadow "binpack" agrees with live.
NAMES = ["n-free", "n-half", "n-two"]


def _cache(histogram: shapes.ShapeHistogram | None = None) -> caches.ClusterCache:
    cache = fakes.cluster_cache(
        node("n-free").gpus(1), node("n-half").gpus(1), node("n-two").gpus(2), histogram=histogram
    )
    fakes.charge(cache, "other/half", "n-half", (0, 40000, 10))
    return cache


@dataclasses.dataclass
class Env:
    cache: caches.ClusterCache
    deps: apps.Deps
    shadow: shadow.Shadow
    client: TestClient
    record: Path
    binder: fakes.FakeBinder

    def schedule(self, name: str, mem: int, names: list[str] = NAMES) -> str:
        """Filter and bind one pod, then play its device plugin (release the node lock)."""
        chosen = _schedule(self.client, name, mem, names)
        assert self.client.portal is not None
        self.client.portal.call(self.binder.release, chosen)  # on the app's loop, where binds run
        return chosen


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    cache = _cache()
    settings = config.Settings(shadow_policies="spread,binpack", shadow_record=str(tmp_path / "rec.jsonl"))
    binder = fakes.FakeBinder()
    deps = fakes.make_deps(cache, binder, settings)
    sh = shadow.build(settings, deps.profile, deps.metrics, cache)
    assert sh is not None
    deps.shadow = sh
    deps.flow.on_bound.add(sh.bound)
    with TestClient(apps.create_app(deps), raise_server_exceptions=False) as c:
        yield Env(cache, deps, sh, c, tmp_path / "rec.jsonl", binder)
    sh.close()


def _schedule(client: TestClient, name: str, mem: int, names: list[str] = NAMES) -> str:
    pod = fakes.gpu_pod(name, mem=mem, cores=10)
    r = client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": names})
    assert r.status_code == 200, r.text
    chosen: list[str] = r.json()["NodeNames"]
    assert len(chosen) == 1, r.json()
    bind = {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}", "Node": chosen[0]}
    r = client.post("/bind", json=bind)
    assert r.json() == {"Error": ""}, r.json()
    return chosen[0]


def _counted(deps: apps.Deps, policy: str, agreement: str) -> float:
    value = deps.metrics.registry.get_sample_value(
        "gpuslice_shadow_decisions_total", {"policy": policy, "agreement": agreement}
    )
    return value or 0.0


def test_a_bound_pod_is_compared_with_every_shadow_policy(env: Env) -> None:
    live = env.schedule("p1", 8000, [*NAMES, "cpu-only"])  # a node without GPUs is offered too
    assert live == "n-half"  # binpack: the fullest node
    (decision,) = [r for r in env.shadow.records() if isinstance(r, decisions.Decision)]
    assert decision.candidates is None  # every GPU node of the start record, and no other
    summary = env.client.get("/shadow").json()
    assert summary["decisions"] == 1
    spread, binpack = summary["policies"]["spread"], summary["policies"]["binpack"]
    # spread (node level) prefers an idle node: another node, a positive score delta.
    assert spread["decisions"] == 1 and spread["node_agreement"] == 0.0 and spread["card_agreement"] == 0.0
    assert spread["mean_score_delta"] > 0
    (miss,) = spread["recent_disagreements"]
    assert miss["pod"] == "default/p1" and miss["live_node"] == "n-half" and miss["node"] != "n-half"
    assert miss["live_cards"] == [[uuid("n-half", 0)]]
    # binpack at node and card level: the same node, its only card.
    assert binpack["node_agreement"] == 1.0 and binpack["card_agreement"] == 1.0
    assert binpack["mean_score_delta"] == 0 and binpack["recent_disagreements"] == []
    assert _counted(env.deps, "spread", "none") == 1
    assert _counted(env.deps, "binpack", "cards") == 1
    assert _counted(env.deps, "binpack", "node") == 0
    body = env.client.get("/metrics").text
    assert 'gpuslice_shadow_score_delta_count{policy="spread"} 1.0' in body


def test_same_node_other_cards_counts_as_node_agreement(env: Env) -> None:
    # Only n-two offered: both policies take it; live cards "spread" vs shadow "binpack" on a
    # node where one card is already used differ.
    first = env.schedule("p1", 8000, ["n-two"])
    second = env.schedule("p2", 8000, ["n-two"])
    assert first == second == "n-two"
    alloc1 = env.cache.pod_allocation("default/p1")
    alloc2 = env.cache.pod_allocation("default/p2")
    assert alloc1 is not None and alloc2 is not None
    live_cards = {g.uuid for g in alloc1.containers[0]} | {g.uuid for g in alloc2.containers[0]}
    assert live_cards == {uuid("n-two", 0), uuid("n-two", 1)}  # spread: one pod per card
    bound = [r for r in env.shadow.records() if isinstance(r, decisions.Decision)]
    choice = {c.policy: c for c in bound[1].shadows}
    # binpack (cards) would stack the second pod on the first one's card.
    assert choice["binpack"].node == "n-two"
    assert choice["binpack"].cards == ((next(iter({g.uuid for g in alloc1.containers[0]})),),)
    assert choice["binpack"].agreement == decisions.AGREE_NODE
    assert bound[1].candidates == ("n-two",)
    assert _counted(env.deps, "binpack", "node") == 1


def test_record_holds_start_decisions_departures_and_replays(env: Env) -> None:
    env.schedule("p1", 8000)
    env.schedule("p2", 30000)
    env.cache.remove_pod("default/p1")
    env.shadow.capacity_freed("n-half")
    lines = env.record.read_bytes().splitlines()
    records = shadowreport.decode(lines)
    kinds = [type(r).__name__ for r in records]
    assert kinds == ["Start", "Decision", "Decision", "Departure"]
    start = records[0]
    assert isinstance(start, decisions.Start)
    # The state before the first pod: n-half carries the other pod only.
    usage = {s.name: [u.memory_mib for u in s.usage] for s in start.nodes}
    assert usage == {"n-free": [0], "n-half": [40000], "n-two": [0, 0]}
    assert (start.node_policy, start.card_policy, start.shadow_policies) == (
        "binpack",
        "spread",
        ("spread", "binpack"),
    )
    # The served record is the file's.
    served = env.client.get("/shadow/decisions")
    assert served.headers["content-type"].startswith("application/x-ndjson")
    assert served.content.splitlines() == lines
    report = shadowreport.replay(records)
    live = report.results[0]
    assert live.live and live.placed == 2 and live.unplaced == 0
    for r in records[1:3]:
        assert isinstance(r, decisions.Decision)
        assert live.placements[r.uid] == (r.node, decisions.cards_of(r.allocation))
    by_name = {r.policy: r for r in report.results if not r.live}
    # Replayed on the live state as it was, the first choice of each shadow is its online one.
    first = records[1]
    assert isinstance(first, decisions.Decision)
    for choice in first.shadows:
        assert by_name[choice.policy].placements[first.uid] == (choice.node, choice.cards)
    assert by_name["binpack"].node_agreement == 1.0
    assert report.departures == 1


def test_capacity_freed_records_only_pods_that_left(env: Env) -> None:
    env.schedule("p1", 8000)
    env.shadow.capacity_freed("n-half")  # still held: nothing left
    assert env.shadow.departures == 0
    env.cache.remove_pod("default/p1")
    env.shadow.capacity_freed("n-half")
    env.shadow.capacity_freed("n-half")  # recorded once
    assert env.shadow.departures == 1
    (dep,) = [r for r in env.shadow.records() if isinstance(r, decisions.Departure)]
    assert (dep.key, dep.uid) == ("default/p1", "uid-p1")


def test_pod_overrides_do_not_steer_the_shadow(env: Env) -> None:
    pod = fakes.gpu_pod("p1", mem=8000, annotations={"hami.io/node-scheduler-policy": "spread"})
    r = env.client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": NAMES})
    (chosen,) = r.json()["NodeNames"]
    bind = {"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": chosen}
    assert env.client.post("/bind", json=bind).json() == {"Error": ""}
    (decision,) = [r for r in env.shadow.records() if isinstance(r, decisions.Decision)]
    choice = {c.policy: c for c in decision.shadows}
    assert choice["binpack"].node == "n-half"  # the shadow binpack ignores the pod's "spread"


def test_shadow_off_costs_nothing_and_says_so() -> None:
    cache = _cache()
    deps = fakes.make_deps(cache, fakes.FakeBinder())
    assert shadow.build(deps.settings, deps.profile, deps.metrics, cache) is None
    with TestClient(apps.create_app(deps)) as c:
        assert c.get("/shadow").json() == {"enabled": False}
        assert c.get("/shadow/decisions").status_code == 404


def test_settings_flag_env_and_unknown_names(tmp_path: Path) -> None:
    assert config.parse(["--shadow-policy", "fgd-lookahead, fgd,fgd"]).shadow_names == (
        "fgd-lookahead",
        "fgd",
    )
    assert config.parse([], {"GPUSLICE_SHADOW_POLICIES": "fgd"}).shadow_names == ("fgd",)
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("shadow-policies: bestfit\nshadow-record: /tmp/x.jsonl\n")
    got = config.parse(["--config", str(yaml_file)], {})
    assert (got.shadow_names, got.shadow_record) == (("bestfit",), "/tmp/x.jsonl")
    with pytest.raises(config.ConfigError, match="shadow_policies: unknown policy 'nope'"):
        config.parse(["--shadow-policy", "fgd,nope"], {})
    with pytest.raises(config.ConfigError, match="shadow_record needs shadow_policies"):
        config.parse(["--shadow-record", "x.jsonl"], {})


def test_records_round_trip_between_writer_and_reader(env: Env) -> None:
    # extender.shadow writes policy.decisions records; sim.shadowreport reads them back unchanged.
    env.schedule("p1", 8000)
    written = list(env.shadow.records())
    assert {type(r) for r in written} >= {decisions.Start, decisions.Decision}
    assert shadowreport.decode(env.shadow.jsonl().splitlines()) == written
    info: Any = msgspec.inspect.type_info(decisions.Decision)
    assert info.tag == "decision"
    line = shadow.ENCODER.encode(decisions.Departure(time=1.0, key="ns/p", uid="u"))
    assert msgspec.json.decode(line)["type"] == "departure"
    assert shadowreport.decode([line]) == [decisions.Departure(time=1.0, key="ns/p", uid="u")]


def test_learning_shadow_records_its_workload_and_replays_alike(tmp_path: Path) -> None:
    settings = config.Settings(
        shadow_policies="fgd-lookahead", workload_min_count=1, workload_period_s=0, workload_drift=0
    )
    cache = _cache(shapes.ShapeHistogram(settings.workload))
    binder = fakes.FakeBinder()
    deps = fakes.make_deps(cache, binder, settings)
    sh = shadow.build(settings, deps.profile, deps.metrics, cache)
    assert sh is not None
    deps.shadow = sh
    deps.flow.on_bound.add(sh.bound)
    with TestClient(apps.create_app(deps), raise_server_exceptions=False) as c:
        env = Env(cache, deps, sh, c, tmp_path / "none", binder)
        for k, mem in enumerate((8000, 30000, 8000)):
            env.schedule(f"p{k}", mem)
        records = shadowreport.decode(sh.jsonl().splitlines())
    workloads = [r for r in records if isinstance(r, decisions.Workload)]
    assert workloads and all(w.workload is not None for w in workloads)  # trusted from the first pod
    bound = [r for r in records if isinstance(r, decisions.Decision)]
    assert len(bound) == 3 and all(len(d.shadows) == 1 for d in bound)
    report = shadowreport.replay(records)
    fgd = report.results[1]
    first = bound[0]
    assert fgd.placements[first.uid] == (first.shadows[0].node, first.shadows[0].cards)
    assert fgd.online_node_agreement is not None
