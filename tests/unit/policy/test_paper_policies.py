"""Score arithmetic of the five FGD-paper baselines (fgd-experiment.md section 6) on hand-built nodes."""

from __future__ import annotations

import numpy as np
import pytest

from gpuslice.framework import registry
from gpuslice.model import nodes
from gpuslice.policy import api, paper, shares
from tests.unit.sim_builders import sim_pod, sim_state

pytestmark = pytest.mark.unit

CTX = api.EMPTY_CONTEXT


def score(policy: api.Policy, state: shares.TaggedNodeState, pod_args: dict[str, int]) -> int:
    return policy.score_node(state, sim_pod(**pod_args).request, CTX).score


@pytest.mark.parametrize(
    ("free", "cpu_free", "pod", "expected"),
    [
        # dot = (32000/128000)(4000/128000) + (2000/8000)(500/8000) = 0.0078125 + 0.015625 = 0.0234375
        # int(100 * (1 - 0.0234375 / 2)) = int(98.83) = 98
        ((1000, 1000), 32000, {"cpu": 4000, "share": 500, "count": 1}, 98),
        # dot = 1 * 1 + 1 * 1 = 2 -> int(100 * 0) = 0
        ((1000,) * 8, 128000, {"cpu": 128000, "share": 1000, "count": 8}, 0),
        # CPU-only: dot = 0.5 * 0.5 + (500/8000) * 0 = 0.25 -> int(100 * 0.875) = 87
        ((500,), 64000, {"cpu": 64000}, 87),
    ],
    ids=["share-on-empty-2gpu", "full-node-pod", "cpu-only"],
)
def test_dotprod(free: tuple[int, ...], cpu_free: int, pod: dict[str, int], expected: int) -> None:
    state = sim_state(free, cpu=128000, cpu_free=cpu_free)
    assert score(paper.DotProd(), state, pod) == expected


@pytest.mark.parametrize(
    ("free", "tags", "pod", "expected"),
    [
        # b = 25 * (8000 - 8000) // 8000 = 0; no GPU pods on the node -> b + 25
        ((1000,) * 8, (), {"share": 500, "count": 1}, 25),
        # b = 25 * (8000 - 1530) // 8000 = 161750 // 8000 = 20; only share-gpu here -> b + 75
        ((1000, 530), ("share-gpu",), {"share": 470, "count": 1}, 95),
        # a 1-gpu pod on a node holding only share-gpu pods -> b = 20
        ((1000, 530), ("share-gpu",), {"share": 1000, "count": 1}, 20),
        # b = 25 * (8000 - 530) // 8000 = 23; share-gpu among others -> b + 50
        ((0, 530), ("share-gpu", "1-gpu"), {"share": 300, "count": 1}, 73),
        # CPU-only pods score 0 everywhere
        ((1000,), (), {"cpu": 1000}, 0),
    ],
    ids=["empty-node", "same-tag-only", "other-tag", "tag-among-others", "cpu-only"],
)
def test_clustering(free: tuple[int, ...], tags: tuple[str, ...], pod: dict[str, int], expected: int) -> None:
    assert score(paper.GpuClustering(), sim_state(free, tags=tags), pod) == expected


def test_clustering_tags_from_usage_without_tag_record() -> None:
    # an untagged state: a card with one exclusive task reads as a 1-gpu pod, a partial card as sharing
    state = sim_state((0, 530))
    plain = shares.tagged(state, ())
    assert shares.node_tags(plain) == frozenset()
    untagged = nodes.NodeState(inventory=state.inventory, usage=state.usage)
    assert shares.node_tags(untagged) == {"1-gpu", "share-gpu"}


@pytest.mark.parametrize(
    ("free", "pod", "expected"),
    [
        # all 8 free: max(33 - 8, 8) = 25
        ((1000,) * 8, {"share": 500, "count": 1}, 25),
        # all 2 free: max(33 - 2, 2) = 31
        ((1000, 1000), {"share": 1000, "count": 1}, 31),
        # picks the 530 card, u = 0: max(100 - (530 * 100 // 1000) // 10, 50) = 100 - 53 // 10 = 95
        ((1000, 530), {"share": 470, "count": 1}, 95),
        # picks a free card on a used node, u = 1: max(50 - 1, 33) = 49
        ((1000, 530), {"share": 1000, "count": 1}, 49),
        # u = 2: max(50 - 2, 33) = 48
        ((1000, 1000, 0, 0), {"share": 1000, "count": 2}, 48),
        # picks one 600 card: 100 - (60 // 10) = 94
        ((600, 600, 1000), {"share": 500, "count": 1}, 94),
        # CPU-only: 0
        ((600,), {}, 0),
    ],
    ids=[
        "empty-8",
        "empty-2",
        "partial-card",
        "free-card-used-node",
        "two-free-cards",
        "tie-cards",
        "cpu-only",
    ],
)
def test_packing(free: tuple[int, ...], pod: dict[str, int], expected: int) -> None:
    assert score(paper.GpuPacking(), sim_state(free), pod) == expected


@pytest.mark.parametrize(
    ("free", "cpu_free", "pod", "expected"),
    [
        # s = 0.5 * 48000/128000 + 0.5 * 1000/8000 = 0.1875 + 0.0625 = 0.25 -> int(75.0) = 75
        ((1000, 1000), 64000, {"cpu": 16000, "share": 1000, "count": 1}, 75),
        # s = 0.5 * 112000/128000 + 0.5 * 7000/8000 = 0.875 -> int(12.5) = 12
        ((1000,) * 8, 128000, {"cpu": 16000, "share": 1000, "count": 1}, 12),
    ],
    ids=["small-node", "big-empty-node"],
)
def test_bestfit_raw(free: tuple[int, ...], cpu_free: int, pod: dict[str, int], expected: int) -> None:
    state = sim_state(free, cpu=128000, cpu_free=cpu_free)
    assert score(paper.BestFit(), state, pod) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # lo 12, hi 75: (75-12)*100//63 = 100, 0, (40-12)*100//63 = 2800//63 = 44
        ([75, 12, 40], [100, 0, 44]),
        # hi == lo -> 0 everywhere
        ([50, 50], [0, 0]),
        ([], []),
    ],
    ids=["spread", "all-equal", "empty"],
)
def test_bestfit_normalize(raw: list[int], expected: list[int]) -> None:
    got = api.Plugin.of(paper.BestFit()).normalize(np.array(raw, dtype=np.int64), CTX)
    assert got.tolist() == expected


def test_random_picks_exactly_one_candidate() -> None:
    ctx = api.Context(rng=np.random.default_rng(7))
    got = api.Plugin.of(paper.RandomPolicy()).normalize(np.zeros(5, dtype=np.int64), ctx)
    assert sorted(got.tolist()) == [0, 0, 0, 0, 100]
    # without a random source the first candidate wins
    assert api.Plugin.of(paper.RandomPolicy()).normalize(np.zeros(3, dtype=np.int64), CTX).tolist() == [
        100,
        0,
        0,
    ]


@pytest.mark.parametrize(
    ("free", "pod", "eligible", "expected"),
    [
        # sharing: least free card that fits, lowest index on ties
        ((1000, 600, 550, 550), {"share": 500, "count": 1}, (0, 1, 2, 3), (2,)),
        # whole cards: lowest-numbered fully free
        ((1000, 0, 1000, 1000), {"share": 1000, "count": 2}, (0, 2, 3), (0, 2)),
    ],
    ids=["share-best", "whole-lowest"],
)
def test_best_card_rule(
    free: tuple[int, ...], pod: dict[str, int], eligible: tuple[int, ...], expected: tuple[int, ...]
) -> None:
    state = sim_state(free)
    req = sim_pod(**pod).request.containers[0]
    assert req is not None
    assert paper.DotProd().choose_cards(state, req, eligible, CTX) == expected


def test_random_card_rule_draws_among_eligible() -> None:
    state = sim_state((1000, 600, 550))
    req = sim_pod(share=500, count=1).request.containers[0]
    assert req is not None
    ctx = api.Context(rng=np.random.default_rng(3))
    picks = {paper.RandomPolicy().choose_cards(state, req, (0, 1, 2), ctx) for _ in range(40)}
    assert picks == {(0,), (1,), (2,)}


@pytest.mark.parametrize("name", ["random", "dotprod", "clustering", "packing", "bestfit", "fgd"])
def test_registered(name: str) -> None:
    assert registry.get(name).name == name
