"""How the node policy's choice reaches kube-scheduler: ``node_choice`` extender, rank and blend."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from gpuslice.cache import cache as caches
from gpuslice.cache import shapes
from gpuslice.codec import keys
from gpuslice.extender import config, render
from gpuslice.extender.http import app as apps
from gpuslice.framework import cycle, profile, scheduling
from gpuslice.model import config as model_config
from gpuslice.policy import api, batch
from tests.unit import builders
from tests.unit.builders import node
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit


def _args(pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


def _cache(histogram: shapes.ShapeHistogram | None = None) -> caches.ClusterCache:
    # Four one-card 80 GiB nodes: "b-half" and "a-half" hold 40000 MiB each (equal binpack scores),
    # "c-free" is idle, "d-full" has 78000 MiB taken.
    cache = fakes.cluster_cache(
        node("c-free").gpus(1),
        node("b-half").gpus(1),
        node("a-half").gpus(1),
        node("d-full").gpus(1),
        histogram=histogram,
    )
    fakes.charge(cache, "other/b", "b-half", (0, 40000, 10))
    fakes.charge(cache, "other/a", "a-half", (0, 40000, 10))
    fakes.charge(cache, "other/d", "d-full", (0, 78000, 10))
    return cache


@pytest.fixture
def clients() -> Iterator[dict[str, TestClient]]:
    out: dict[str, TestClient] = {}
    stack = []
    for choice in model_config.NODE_CHOICES:
        deps = fakes.make_deps(_cache(), settings=config.Settings(node_choice=choice))
        c = TestClient(apps.create_app(deps))
        c.__enter__()
        stack.append(c)
        out[choice] = c
    yield out
    for c in stack:
        c.__exit__(None, None, None)


NAMES = ["c-free", "b-half", "d-full", "a-half", "ghost"]


def test_extender_filter_answers_the_best_node_alone_ties_to_the_lower_name(
    clients: dict[str, TestClient],
) -> None:
    pod = fakes.gpu_pod("p", mem=8000, cores=30)
    body = clients["extender"].post("/filter", json=_args(pod, NAMES)).json()
    # binpack: a-half and b-half end at 48000/81920 after the pod, c-free at 8000: the half-full
    # pair ties and the lower name wins; d-full (3920 MiB free) fails as before.
    assert body["NodeNames"] == ["a-half"]
    assert body["FailedNodes"] == {"d-full": "InsufficientGPUMemory"}
    assert body["FailedAndUnresolvableNodes"] == {"ghost": "NodeUnregistered"}
    # The other choices answer every feasible node.
    for choice in ("rank", "blend"):
        other = clients[choice].post("/filter", json=_args(pod, NAMES)).json()
        assert other["NodeNames"] == ["c-free", "b-half", "a-half"]


def test_extender_filter_follows_the_pod_policy_override(clients: dict[str, TestClient]) -> None:
    pod = fakes.gpu_pod("p", mem=8000, cores=30, annotations={keys.NODE_SCHEDULER_POLICY: "spread"})
    body = clients["extender"].post("/filter", json=_args(pod, NAMES)).json()
    assert body["NodeNames"] == ["c-free"]  # spread: the emptiest node


def test_rank_prioritize_answers_distinct_ranks_in_the_extender_order(clients: dict[str, TestClient]) -> None:
    pod = fakes.gpu_pod("p", mem=8000, cores=30)
    feasible = clients["rank"].post("/filter", json=_args(pod, NAMES)).json()["NodeNames"]
    scores = {
        h["Host"]: h["Score"] for h in clients["rank"].post("/prioritize", json=_args(pod, feasible)).json()
    }
    assert scores == {"a-half": 10, "b-half": 9, "c-free": 8}
    # Cold (no filter first) and with nodes the pod does not fit: those score 0 and take no rank.
    cold = fakes.gpu_pod("q", mem=8000, cores=30)
    body = clients["rank"].post("/prioritize", json=_args(cold, NAMES)).json()
    assert {h["Host"]: h["Score"] for h in body} == {
        "c-free": 8,
        "b-half": 9,
        "d-full": 0,
        "a-half": 10,
        "ghost": 0,
    }


def test_blend_prioritize_scales_the_policy_score(clients: dict[str, TestClient]) -> None:
    pod = fakes.gpu_pod("p", mem=8000, cores=30)
    body = clients["blend"].post("/prioritize", json=_args(pod, ["c-free", "b-half", "a-half"])).json()
    scores = [h["Score"] for h in body]
    # the two half-full nodes score alike, the idle one lower: ties survive, as before node_choice
    assert scores[1] == scores[2] > scores[0]


def test_extender_choice_is_the_first_of_the_blend_order_for_every_pod_size(
    clients: dict[str, TestClient],
) -> None:
    # Whatever the pod, the extender's answer is the node ``ranked`` puts first over blend's
    # internal scores (the same evaluation), so the two modes cannot disagree on the winner.
    for mem in (1000, 8000, 30000, 41000, 80000):
        pod = fakes.gpu_pod(f"p{mem}", mem=mem, cores=10)
        chosen = clients["extender"].post("/filter", json=_args(pod, NAMES)).json()["NodeNames"]
        feasible = clients["blend"].post("/filter", json=_args(pod, NAMES)).json()["NodeNames"]
        if not feasible:
            assert chosen == []
            continue
        rank = clients["rank"].post("/prioritize", json=_args(pod, feasible)).json()
        best = max(rank, key=lambda h: h["Score"])["Host"]
        assert chosen == [best]


def test_best_first_yields_every_position_once_best_first() -> None:
    names = ["n3", "n1", "n2", "n0"]
    scores = np.array([50, 70, 70, 10])
    assert list(batch.best_first(names, scores)) == [1, 2, 0, 3]
    assert list(batch.best_first([], np.array([], np.int64))) == []
    ranks = scheduling.rank_scores(names, np.array([50, 70, scheduling.UNFIT, 10]), 10)
    assert ranks.tolist() == [9, 10, 0, 8]
    many = [f"n{i:02d}" for i in range(15)]
    assert scheduling.rank_scores(many, np.zeros(15, np.int64), 10).tolist() == [
        *range(10, 0, -1),
        0,
        0,
        0,
        0,
        0,
    ]


def test_candidate_step_skips_unfit_nodes() -> None:
    # BestFit normalises over the nodes the pod fits; an unfit node neither moves the range nor
    # receives a score.
    policies = profile.Profile.build("bestfit", "spread")
    cyc = cycle.Cycle.detached(policies, builders.pod().gpu(1).obj(), api.EMPTY_CONTEXT, {})
    assert cyc.node is policies.by_name["bestfit"]
    out = cyc.stepped(np.array([20, scheduling.UNFIT, 60]))
    assert out.tolist() == [0, scheduling.UNFIT, 100]


@pytest.mark.parametrize(("choice", "weight"), [("extender", 1), ("rank", 51), ("blend", 1)])
def test_render_weight_follows_the_node_choice(choice: str, weight: int) -> None:
    ext = render.scheduler_config(node_choice=choice)["extenders"][0]
    assert ext["weight"] == weight
    assert render.scheduler_config(node_choice=choice, weight=7)["extenders"][0]["weight"] == 7


def test_rank_weight_outweighs_what_resource_plugins_can_add() -> None:
    # kube-scheduler adds rank x weight x 10; NodeResourcesFit, BalancedAllocation, ImageLocality
    # (weight 1 each) and PodTopologySpread (weight 2) can differ by at most 100 x 5 between nodes.
    assert render.RANK_WEIGHT * 10 > 100 * (1 + 1 + 1 + 2)


def test_unknown_node_choice_is_refused() -> None:
    with pytest.raises(config.ConfigError, match="node_choice"):
        config.validate({"node_choice": "best"})
    with pytest.raises(ValueError, match="node choice"):
        render.scheduler_config(node_choice="best")
    with pytest.raises(config.ConfigError, match="workload_period_s"):
        config.validate({"workload_period_s": -1})


@pytest.mark.parametrize(("period", "seen"), [(0, True), (3600, False)])
def test_workload_period_zero_scores_a_pod_against_its_own_shape(period: float, seen: bool) -> None:
    cache = _cache(shapes.ShapeHistogram(model_config.WorkloadSettings(min_count=1)))  # trusted at once
    deps = fakes.make_deps(cache, settings=config.Settings(workload_period_s=period))
    with TestClient(apps.create_app(deps)) as c:
        c.post("/filter", json=_args(fakes.gpu_pod("p", mem=8000, cores=30), NAMES))
    assert (cache.snapshot().workload is not None) is seen
