"""The learned-workload settings in ``gpuslice serve``: flags, env, YAML, validation, and the fallback
substituted for learning policies while the histogram is untrusted (real ``ClusterCache``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from starlette.testclient import TestClient

from gpuslice.cache import cache as caches
from gpuslice.cache import shapes
from gpuslice.codec import keys, pod_devices, resources
from gpuslice.extender import config
from gpuslice.extender.http import app as apps
from gpuslice.framework import cycle, logs, nominations, profile, registry, scheduling, view
from gpuslice.model import config as model_config
from gpuslice.model import requests
from gpuslice.policy import api
from tests.unit.builders import node, uuid
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit

LOG = logs.Log(0)
HOST = (64000, 262144)


def settings_cache(**workload: object) -> caches.ClusterCache:
    """Nodes a (2 cards, card 0 has 20000 MiB taken), b (1 card, 60000 taken), c (4 cards, 0 and 1
    have 40000 taken) and n (3 cards, card 2 has 40000 taken), learning with ``workload`` settings."""
    s = model_config.WorkloadSettings(**workload)  # type: ignore[arg-type]
    cache = caches.ClusterCache(shapes.ShapeHistogram(s), nominator=nominations.Nominator())
    for name, cards in (("a", 2), ("b", 1), ("c", 4), ("n", 3)):
        cache.upsert_node(node(name).gpus(cards).host(*HOST).inventory())
    fakes.charge(cache, "x/a", "a", (0, 20000, 30))
    fakes.charge(cache, "x/b", "b", (0, 60000, 50))
    fakes.charge(cache, "x/c", "c", (0, 40000, 50), (1, 40000, 50))
    fakes.charge(cache, "x/n", "n", (2, 40000, 10))
    return cache


POD = resources.parse_pod(fakes.gpu_pod("p", mem=16000, cores=25))
ABC = ["a", "b", "c"]


def answer(
    cache: caches.ClusterCache, policies: profile.Profile, pod: requests.PodRequest = POD
) -> list[str]:
    return scheduling.filter_nodes(cycle.Cycle.of(policies, cache.snapshot(), pod), ABC, LOG).feasible


def build(node: str, card: str, choice: str = "extender", fallback: str = "bestfit") -> profile.Profile:
    return profile.Profile.build(node, card, choice=choice, fallback=fallback)


def context(snap: view.Snapshot, pod: requests.PodRequest = POD) -> api.Context:
    """The context the extender judges ``pod`` with on ``snap`` (no clock, no job label)."""
    return cycle.Cycle.of(profile.Profile.build("spread", "spread"), snap, pod).ctx


def test_untrusted_fgd_node_choice_is_the_fallbacks() -> None:
    cache = settings_cache(min_count=2, fallback="bestfit", drift=0.0)
    fgd = build("fgd", "fgd", "extender", "bestfit")
    # untrusted (nothing observed): fgd answers as bestfit does, b (the tightest fit)
    assert cache.snapshot().workload is None
    assert answer(cache, fgd) == answer(cache, profile.Profile.build("bestfit", "bestfit")) == ["b"]
    # fgd with no workload ("pod") measures against the pod's own shape and answers a instead
    assert answer(cache, build("fgd", "fgd", "extender", "pod")) == ["a"]
    # two requests observed: trusted, fgd scores against the learned workload itself
    shape = scheduling.shape(cache.snapshot(), POD, ABC)
    cache.observe_request(shape)
    cache.observe_request(shape)
    assert cache.snapshot().workload is not None
    snap = cache.snapshot()
    assert cycle.Cycle.of(fgd, snap, POD).node.name == "fgd"
    assert answer(cache, fgd) == answer(cache, build("fgd", "fgd", "extender", "pod"))


def test_node_policy_without_context_or_not_learning_is_kept() -> None:
    cache = settings_cache(min_count=5)
    snap = cache.snapshot()
    assert snap.workload is None

    def acting(p: profile.Profile, pod: requests.PodRequest = POD) -> str:
        return cycle.Cycle.of(p, snap, pod).node.name

    p = build("fgd-lookahead", "spread", "extender", "binpack")
    assert acting(p) == "binpack"
    assert p.node(POD, trusted=True).name == "fgd-lookahead"  # trusted: no substitution
    assert acting(build("spread", "spread", "extender", "binpack")) == "spread"
    assert acting(build("fgd", "fgd", "extender", "pod")) == "fgd"
    # a per-pod override naming a learning policy falls back too
    override = resources.parse_pod(
        fakes.gpu_pod("o", mem=16000, annotations={keys.NODE_SCHEDULER_POLICY: "fgd"})
    )
    assert acting(build("spread", "spread", "extender", "binpack"), override) == "binpack"


def test_learning_card_policy_chooses_by_the_context() -> None:
    cache = settings_cache(min_count=1, drift=0.0)
    snap = cache.snapshot()
    state = snap.nodes["n"]
    req = POD.containers[0]
    assert req is not None
    fgd = build("fgd", "fgd", "extender", "bestfit")
    untrusted_cycle = cycle.Cycle.of(fgd, snap, POD)
    untrusted, card = untrusted_cycle.ctx, untrusted_cycle.cards
    assert untrusted.workload is None
    assert fgd.card(POD, trusted=True).name == "fgd" and card.name == "bestfit"
    # node n: cards 0 and 1 free, card 2 has 40000 of 81920 MiB taken. bestfit takes the tightest
    # card (2); fgd with the pod's own shape keeps card 2's room and takes card 0
    assert card.choose_cards(state, req, (0, 1, 2), untrusted) == (2,)
    pod_only = build("fgd", "fgd", "extender", "pod").card(POD, trusted=False)
    assert pod_only.name == "fgd"  # workload_fallback: pod, no substitution
    assert pod_only.choose_cards(state, req, (0, 1, 2), untrusted) == (0,)
    cache.observe_request(scheduling.shape(snap, POD, ["n"]))
    trusted_cycle = cycle.Cycle.of(fgd, cache.snapshot(), POD)
    trusted, card = trusted_cycle.ctx, trusted_cycle.cards
    assert trusted.workload is not None
    assert card.choose_cards(state, req, (0, 1, 2), trusted) == pod_only.choose_cards(
        state, req, (0, 1, 2), trusted
    )


def test_bind_takes_the_fallbacks_cards_until_trusted() -> None:
    s = config.Settings(node_policy="fgd", card_policy="fgd", workload_period_s=0, workload_min_count=2)
    cache = settings_cache(**{f: getattr(s.workload, f) for f in s.workload.__struct_fields__})
    binder = fakes.FakeBinder()
    deps = fakes.make_deps(cache, binder, s)

    def place(name: str) -> str:
        pod = fakes.gpu_pod(name, mem=16000, cores=25)
        assert c.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": ["n"]}).json()[
            "NodeNames"
        ] == ["n"]
        bind = {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}", "Node": "n"}
        assert c.post("/bind", json=bind).json() == {"Error": ""}
        assert c.portal is not None
        c.portal.call(binder.release, "n")  # the device plugin's Allocate done: the node lock goes
        return pod_devices.decode(binder.annotations[f"default/{name}"][keys.DEVICES_ALLOCATED])[0][0].uuid

    with TestClient(apps.create_app(deps)) as c:
        # one request observed (< 2): bestfit's card, the partly used card 2
        assert place("p1") == uuid("n", 2)
        assert cache.snapshot().workload is None
        # the second request makes the workload trusted before p2 is scored: fgd's own choice
        snap_before = cache.snapshot()
        fgd = build("fgd", "fgd", "extender", "pod").card(POD, trusted=True)
        got = place("p2")
        assert cache.snapshot().workload is not None
    ctx = context(cache.snapshot())
    req = POD.containers[0]
    assert req is not None
    expected = fgd.choose_cards(snap_before.nodes["n"], req, (0, 1, 2), ctx)
    assert expected is not None and got == uuid("n", expected[0])


# ----------------------------------------------------------------------------- settings


def test_defaults_come_from_the_one_place() -> None:
    s = config.Settings()
    assert s.workload == model_config.DEFAULT_WORKLOAD
    assert set(model_config.WORKLOAD_SETTINGS) <= set(config.FIELDS)


def test_flags_env_and_yaml_set_the_workload(tmp_path: Path) -> None:
    got = config.parse(
        ["--workload-decay", "0.99", "--workload-window", "500", "--workload-min-count", "7"], environ={}
    ).workload
    assert (got.decay, got.window, got.min_count) == (0.99, 500, 7)
    env = {"GPUSLICE_WORKLOAD_FALLBACK": "pod", "GPUSLICE_WORKLOAD_DRIFT": "0.1"}
    got = config.parse([], environ=env).workload
    assert (got.fallback, got.drift) == ("pod", 0.1)
    f = tmp_path / "c.yaml"
    f.write_text("workload-decay: 1\nworkload_window: 300\nworkload-fallback: binpack\n")
    got = config.parse(["--config", str(f), "--workload-window", "200"], environ={}).workload
    assert (got.decay, got.window, got.fallback) == (1.0, 200, "binpack")  # flags over the file


@pytest.mark.parametrize(
    ("values", "setting"),
    [
        ({"workload_decay": 0}, "workload_decay"),
        ({"workload_decay": 1.5}, "workload_decay"),
        ({"workload_decay": "nan"}, "workload_decay"),
        ({"workload_window": -1}, "workload_window"),
        ({"workload_min_count": -3}, "workload_min_count"),
        ({"workload_drift": 1.01}, "workload_drift"),
        ({"workload_drift": -0.1}, "workload_drift"),
        ({"workload_fallback": "best-fit"}, "workload_fallback"),
    ],
)
def test_invalid_workload_settings_name_the_setting(values: dict[str, object], setting: str) -> None:
    with pytest.raises(config.ConfigError, match=f"{setting}: "):
        config.validate(values)
    s = model_config.workload_settings(values)
    problems = registry.workload_errors(s)
    assert [p.setting for p in problems] == [setting]
    assert isinstance(problems[0], ValueError)


def test_every_registered_policy_and_pod_are_valid_fallbacks() -> None:
    for name in (*registry.names(), model_config.WORKLOAD_FALLBACK_POD):
        assert registry.workload_errors(model_config.WorkloadSettings(fallback=name)) == []
        assert config.validate({"workload_fallback": name}).workload.fallback == name


def test_wrong_type_names_the_setting() -> None:
    with pytest.raises(model_config.WorkloadSettingError) as err:
        model_config.workload_settings({"workload_window": 2.5})
    assert err.value.setting == "workload_window"
    with pytest.raises(config.ConfigError, match="workload_window"):
        config.validate({"workload_window": "many"})


def test_policies_refuse_an_unknown_fallback() -> None:
    with pytest.raises(api.UnknownPolicyError):
        build("fgd", "spread", "extender", "nope")


def test_chart_defaults_equal_the_extenders() -> None:
    # the chart passes every setting explicitly; its defaults must be the ones in model.config
    values = yaml.safe_load((Path(__file__).parents[3] / "charts/gpuslice/values.yaml").read_text())
    chart = values["policy"]["workload"]
    d = model_config.DEFAULT_WORKLOAD
    assert chart == {
        "decay": d.decay,
        "window": d.window,
        "minCount": d.min_count,
        "fallback": d.fallback,
        "drift": d.drift,
    }


def test_policy_context_carries_the_cards_per_model() -> None:
    # fgd-lookahead weighs model-pinned shapes by the share of cards they can use: the context the
    # extender scores with must carry the cache's count (2 + 1 + 4 + 3 A100 cards, then a T4 node)
    cache = settings_cache()
    assert context(cache.snapshot()).capacity == ((node("x").gpus(1).inventory().devices[0].type, 10),)
    cache.upsert_node(node("t").gpus(2, model="Tesla T4").host(*HOST).inventory())
    got = dict(context(cache.snapshot()).capacity)
    assert got["Tesla T4"] == 2 and sum(got.values()) == 12
