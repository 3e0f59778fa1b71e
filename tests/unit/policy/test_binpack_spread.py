"""binpack and spread: node scores (weighted usage after placement) and card choice."""

from __future__ import annotations

import pytest

from gpuslice.framework import registry
from gpuslice.model import nodes, requests
from gpuslice.policy import api
from tests.unit.builders import node, pod

pytestmark = pytest.mark.unit

CTX = api.EMPTY_CONTEXT

SCORES = [
    # (id, state, pod, binpack score); spread = 100 - binpack
    # empty 2 x 10000 MiB: mem (0 + 5000) / 20000 = 0.25, cores (0 + 50) / 200 = 0.25
    # 100 * (0.6 * 0.25 + 0.4 * 0.25) = 25
    ("empty", node().gpus(2, memory=10000).state(), pod().gpu(1, memory=5000, cores=50).obj(), 25),
    # used 10000 + 5000 of 20000 = 0.75, cores 0 + 0 of 200 = 0: 100 * 0.6 * 0.75 = 45
    ("used", node().gpus(2, memory=10000).used(0, memory=10000).state(), pod().gpu(1, memory=5000).obj(), 45),
    # over-full ratio capped at 1: mem min(1, 30000/20000) = 1, cores 200/200 = 1: 100
    (
        "capped",
        node().gpus(2, memory=10000).used(0, memory=20000, cores=100).used(1, cores=100).state(),
        pod().gpu(1, memory=10000).obj(),
        100,
    ),
    # percentage 50 % of the first card (10000) = 5000 per card x 2 cards = 10000 of 20000 = 0.5
    # cores 2 x 30 = 60 of 200 = 0.3: 100 * (0.6 * 0.5 + 0.4 * 0.3) = 42
    ("percentage", node().gpus(2, memory=10000).state(), pod().gpu(2, pct=50, cores=30).obj(), 42),
    # no cards: 0
    ("no-cards", node().state(), pod().no_gpu().obj(), 0),
    # init peak 8000 vs app sum 2000 + 2000 = 4000: 8000 / 20000 = 0.4, 100 * 0.6 * 0.4 = 24
    (
        "init-peak",
        node().gpus(2, memory=10000).state(),
        pod().init_gpu(1, memory=8000).gpu(1, memory=2000).gpu(1, memory=2000).obj(),
        24,
    ),
]


@pytest.mark.parametrize(("state", "req", "expected"), [s[1:] for s in SCORES], ids=[s[0] for s in SCORES])
def test_node_scores(state: nodes.NodeState, req: requests.PodRequest, expected: int) -> None:
    assert registry.get("binpack").score_node(state, req, CTX).score == expected
    assert registry.get("spread").score_node(state, req, CTX).score == 100 - expected


def test_weights_from_args() -> None:
    # memory only: 5000 / 20000 = 0.25 -> 25 (cores ignored)
    state = node().gpus(2, memory=10000).state()
    req = pod().gpu(1, memory=5000, cores=100).obj()
    assert registry.get("binpack", {"memory": 1, "cores": 0}).score_node(state, req, CTX).score == 25
    with pytest.raises(ValueError, match="unknown"):
        registry.get("binpack", {"slots": 1})


CARDS = [
    # (id, state, request, eligible, binpack pick, spread pick)
    # card usage after request: c0 0.6*0.5=0.3, c1 0.6*(0.5+0.5)=0.6, c2 0.6*0.5+0.4*0.5=0.5
    (
        "by-usage",
        node().gpus(3, memory=10000).used(1, memory=5000).used(2, cores=50).state(),
        requests.ContainerRequest(count=1, memory_mib=5000),
        (0, 1, 2),
        (1,),
        (0,),
    ),
    (
        "ties-by-index",
        node().gpus(4).state(),
        requests.ContainerRequest(count=2, memory_mib=1),
        (3, 1, 2),
        (1, 2),
        (1, 2),
    ),
    (
        "only-eligible",
        node().gpus(3, memory=10000).used(1, memory=9000).state(),
        requests.ContainerRequest(count=1, memory_mib=1),
        (0, 2),
        (0,),
        (0,),
    ),
]


@pytest.mark.parametrize(
    ("state", "req", "eligible", "bp", "sp"), [c[1:] for c in CARDS], ids=[c[0] for c in CARDS]
)
def test_card_choice(
    state: nodes.NodeState,
    req: requests.ContainerRequest,
    eligible: tuple[int, ...],
    bp: tuple[int, ...],
    sp: tuple[int, ...],
) -> None:
    assert registry.get("binpack").choose_cards(state, req, eligible, CTX) == bp
    assert registry.get("spread").choose_cards(state, req, eligible, CTX) == sp


def test_hami_card_score_weights_from_context() -> None:
    # card 0: 3 of 10 slots used, no memory; card 1: 1 slot, 6000 of 10000 MiB
    # weights slot=5, core=0, memory=1, request 1000 MiB (slots count the new task):
    #   card 0: 5 * 4/10 + 1000/10000 = 2.1, card 1: 5 * 2/10 + 7000/10000 = 1.7
    #   -> binpack takes 0, spread takes 1
    # without weights (0.6 memory, 0.4 cores): card 1 is fuller -> binpack takes 1
    state = node().gpus(2, memory=10000).used(0, slots=3).used(1, memory=6000).state()
    req = requests.ContainerRequest(count=1, memory_mib=1000)
    ctx = api.Context(card_weights=requests.ScoringWeights(slot=5, core=0, memory=1))
    assert registry.get("binpack").choose_cards(state, req, (0, 1), ctx) == (0,)
    assert registry.get("spread").choose_cards(state, req, (0, 1), ctx) == (1,)
    assert registry.get("binpack").choose_cards(state, req, (0, 1), CTX) == (1,)
