"""topology-aware: exact card-set choice (against brute force), strategies, node scores."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.framework import registry
from gpuslice.model import nodes, requests, topology
from gpuslice.policy import api, batch, cardsets, columns
from gpuslice.policy import topology as topo_policy
from tests.unit.builders import node, pod
from tests.unit.policy import strategies

pytestmark = pytest.mark.unit

S = cardsets.Strategy
P = topology.PcieLevel
CTX = api.EMPTY_CONTEXT


def brute(
    w: cardsets.Weights, cand: tuple[int, ...], k: int, strategy: cardsets.Strategy, bonus: tuple[int, ...]
) -> tuple[int, ...]:
    """Every combination, scored from scratch, ties to the smallest sorted set."""
    best_key = max(
        cardsets.value(w, cand, c, strategy, bonus) for c in itertools.combinations(sorted(cand), k)
    )
    return min(
        c
        for c in itertools.combinations(sorted(cand), k)
        if cardsets.value(w, cand, c, strategy, bonus) == best_key
    )


@st.composite
def matrices(draw: st.DrawFn, n: int = 8) -> cardsets.Weights:
    m = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            m[i][j] = m[j][i] = draw(st.sampled_from((10, 20, 30, 40, 50, 60, 110, 150, 250)))
    return tuple(tuple(r) for r in m)


@settings(max_examples=300, deadline=None)
@given(
    w=matrices(),
    cand=st.sets(st.integers(0, 7), min_size=1, max_size=8),
    k=st.integers(1, 8),
    strategy=st.sampled_from(list(S)),
    bonus=st.tuples(*[st.integers(0, 200)] * 8),
)
def test_exact_matches_brute_force_on_8_gpus(
    w: cardsets.Weights, cand: set[int], k: int, strategy: cardsets.Strategy, bonus: tuple[int, ...]
) -> None:
    c = tuple(sorted(cand))
    k = min(k, len(c))
    assert cardsets.best(w, c, k, strategy, bonus) == brute(w, c, k, strategy, bonus)


def islands(n: int) -> cardsets.Weights:
    """Two NVLink islands (cards < n/2 and >= n/2): 100 * 2 + 50 inside, 10 across."""
    h = n // 2
    return tuple(
        tuple(0 if i == j else 250 if (i < h) == (j < h) else 10 for j in range(n)) for i in range(n)
    )


@pytest.mark.parametrize("n", [12, 16])
def test_local_search_beyond_exact_limit_keeps_islands(n: int) -> None:
    # 4 cards from one island: links = 6 pairs * 250 = 1500, the best possible
    got = cardsets.best(islands(n), tuple(range(n)), 4, S.HIGHEST_BANDWIDTH)
    assert len(set(got)) == 4
    assert cardsets.links(islands(n), got) == 1500
    # only island B cards 8.. and one of A are free: all 4 from B
    cand = (0, *range(n // 2, n))
    assert all(c >= n // 2 for c in cardsets.best(islands(n), cand, 4, S.HIGHEST_BANDWIDTH))


CHOICES = [
    # (id, weights, candidates, k, strategy, expected)
    # islands of 4 on 8 cards; free: 0,1 (A) and 4,5,6 (B)
    ("hb-takes-best-pair", islands(8), (0, 1, 4, 5, 6), 2, S.HIGHEST_BANDWIDTH, (0, 1)),
    # lowest fragmentation keeps B's triple intact: leaving {4,5,6} = 3 * 250 = 750
    ("lf-keeps-triple", islands(8), (0, 1, 4, 5, 6), 2, S.LOWEST_FRAGMENTATION, (0, 1)),
    # one card: HAMi's rule, lowest summed score to the others: card 0 sums 250 + 10 * 3 = 280,
    # card 4 sums 250 * 2 + 10 * 2 = 520 -> take 0 (0 and 1 tie, lowest index)
    ("lf-single-card", islands(8), (0, 1, 4, 5, 6), 1, S.LOWEST_FRAGMENTATION, (0,)),
    # highest bandwidth for one card falls back to the same secondary key
    ("hb-single-card", islands(8), (0, 1, 4, 5, 6), 1, S.HIGHEST_BANDWIDTH, (0,)),
    # 3 cards: only B has 3
    ("hb-triple", islands(8), (0, 1, 4, 5, 6), 3, S.HIGHEST_BANDWIDTH, (4, 5, 6)),
    # no topology: all equal -> lowest indices
    ("neutral", tuple((0,) * 4 for _ in range(4)), (3, 1, 2), 2, S.HIGHEST_BANDWIDTH, (1, 2)),
]


@pytest.mark.parametrize(
    ("w", "cand", "k", "strategy", "expected"), [c[1:] for c in CHOICES], ids=[c[0] for c in CHOICES]
)
def test_choices(
    w: cardsets.Weights, cand: tuple[int, ...], k: int, strategy: cardsets.Strategy, expected: tuple[int, ...]
) -> None:
    assert cardsets.best(w, cand, k, strategy) == expected


def test_balanced_utilization_prefers_idle_cards() -> None:
    # all pairs equal (SYSTEM, 10); card 0 and 1 half used: bonus for 2 cards = 50 * free ratio
    # idle cards 2,3 earn 50 each, cards 0,1 earn 25: choose (2, 3)
    state = (
        node("n").gpus(4, memory=1000).uniform_topo(P.SYSTEM).used(0, memory=500).used(1, memory=500).state()
    )
    pol = registry.get("topology-aware:balanced-utilization")
    req = requests.ContainerRequest(count=2, memory_mib=100)
    assert pol.choose_cards(state, req, (0, 1, 2, 3), CTX) == (2, 3)
    # highest bandwidth ignores usage: lowest indices
    assert registry.get("topology-aware").choose_cards(state, req, (0, 1, 2, 3), CTX) == (0, 1)


def dgx_like() -> nodes.NodeState:
    """8 cards, NUMA 0 = 0..3 and NUMA 1 = 4..7, NVLink (2 links) inside each half, SYSTEM across."""
    b = node("d").gpus(8, per_numa=4)
    inv = b.inventory()
    uuids = tuple(d.uuid for d in inv.devices)
    same = [[(i < 4) == (j < 4) for j in range(8)] for i in range(8)]
    t = topology.Topology(
        uuids=uuids,
        nvlinks=tuple(tuple(2 if same[i][j] and i != j else 0 for j in range(8)) for i in range(8)),
        pcie=tuple(
            tuple(P.INTERNAL if i == j else P.SINGLE if same[i][j] else P.SYSTEM for j in range(8))
            for i in range(8)
        ),
        p2p=tuple(tuple(i != j and same[i][j] for j in range(8)) for i in range(8)),
    )
    return b.topo(t).state()


SCORES = [
    # (id, state, pod, expected score)
    # 4 cards in one half: numa 100, pcie SINGLE 2 * (50 - 10) = 80, p2p NVLink 100
    # (50 * 100 + 30 * 80 + 20 * 100) // 100 = 94
    ("one-island", dgx_like(), pod().gpu(4, memory=1).obj(), 94),
    # 8 cards: 2 NUMA nodes -> numa 100 * 4 // 8 = 50; 28 pairs, 12 inside (80, NVLink 100), 16 across
    # (0, p2p 0): pcie 12 * 80 // 28 = 34, p2p 12 * 100 // 28 = 42; (2500 + 1020 + 840) // 100 = 43
    ("whole-node", dgx_like(), pod().gpu(8, memory=1).obj(), 43),
    # one card: numa 100, pcie = p2p = 100 -> 100
    ("single", dgx_like(), pod().gpu(1, memory=1).obj(), 100),
    # no topology, 2 cards on one NUMA: (5000 + 30 * 50 + 20 * 50) // 100 = 75
    ("no-topology", node("n").gpus(2).state(), pod().gpu(2, memory=1).obj(), 75),
    # 3 of the half 0..3 are full: the pod's 2 cards straddle: one per half? No: 4..7 are free, it
    # picks 2 in the second half -> 94
    (
        "avoids-busy-half",
        node("d")
        .gpus(8, per_numa=4)
        .topo(dgx_like().inventory.topology)  # type: ignore[arg-type]
        .used(0, memory=81920)
        .used(1, memory=81920)
        .used(2, memory=81920)
        .state(),
        pod().gpu(2, memory=1).obj(),
        94,
    ),
]


@pytest.mark.parametrize(("state", "req", "expected"), [s[1:] for s in SCORES], ids=[s[0] for s in SCORES])
def test_node_scores(state: nodes.NodeState, req: requests.PodRequest, expected: int) -> None:
    assert registry.get("topology-aware").score_node(state, req, CTX).score == expected


def test_asymmetric_links_count_as_weaker_side() -> None:
    uuids = ("a", "b")
    t = topology.Topology(
        uuids=uuids,
        nvlinks=((0, 4), (1, 0)),
        pcie=((P.INTERNAL, P.SYSTEM), (P.SYSTEM, P.INTERNAL)),
        p2p=((False, True), (True, False)),
    )
    state = node("n").card(uuid_="a").card(uuid_="b").topo(t).state()
    # min(10 + 400, 10 + 100) = 110
    assert topo_policy.weights(state)[0][1] == 110


def test_unknown_args_rejected() -> None:
    with pytest.raises(ValueError, match="no args"):
        registry.get("topology-aware", {"x": 1})


@st.composite
def topo_states(draw: st.DrawFn, name: str) -> nodes.NodeState:
    """A random node, with no topology, a full one, or one missing a card; links may be asymmetric."""
    base = draw(strategies.node_states(name=name, host=False))
    uuids = tuple(d.uuid for d in base.inventory.devices)
    kind = draw(st.sampled_from(("none", "full", "partial")))
    if kind == "none" or not uuids:
        return base
    listed = uuids if kind == "full" else uuids[1:]
    n = len(listed)
    nv = [[0 if i == j else draw(st.sampled_from((0, 0, 1, 2))) for j in range(n)] for i in range(n)]
    lv = [[P.INTERNAL if i == j else draw(st.sampled_from(list(P))) for j in range(n)] for i in range(n)]
    t = topology.Topology(
        uuids=listed,
        nvlinks=tuple(tuple(r) for r in nv),
        pcie=tuple(tuple(r) for r in lv),
        p2p=tuple(tuple(i != j and lv[i][j] <= P.HOSTBRIDGE for j in range(n)) for i in range(n)),
    )
    inv = msgspec.structs.replace(base.inventory, topology=t)
    return msgspec.structs.replace(base, inventory=inv)


@pytest.mark.parametrize("name", ["topology-aware", *(f"topology-aware:{s.value}" for s in S)])
@settings(max_examples=120, deadline=None)
@given(
    states=st.lists(st.integers(), min_size=1, max_size=5).flatmap(
        lambda ids: st.tuples(*[topo_states(f"n{i}") for i in range(len(ids))])
    ),
    req=strategies.simple_pods(),
)
def test_score_columns_matches_score_node(
    name: str, states: tuple[nodes.NodeState, ...], req: requests.PodRequest
) -> None:
    pol = registry.get(name)
    by_name = {s.name: s for s in states}
    cols = columns.build(list(states))
    ev = batch.evaluate(by_name, cols, list(by_name), req, pol, pol)
    for i, s in enumerate(states):
        if ev.feasible[i]:
            assert ev.scores[i] == pol.score_node(s, req, CTX).score


def test_balanced_utilization_scores_its_own_choice_in_batch() -> None:
    # cards 0,1 share a switch (pair score 50) but are half used; cards 2,3 meet at NODE (20), idle
    # highest bandwidth takes (0, 1): numa 100, pcie 80, p2p 50 -> (5000 + 2400 + 1000) // 100 = 84
    # balanced-utilization: (0, 1) = 50 + 25 + 25 = 100 < (2, 3) = 20 + 50 + 50 = 120 -> (2, 3):
    # pcie 2 * (50 - 40) = 20, p2p 0 -> (5000 + 600 + 0) // 100 = 56
    lv = [
        [P.INTERNAL, P.SINGLE, P.SYSTEM, P.SYSTEM],
        [P.SINGLE, P.INTERNAL, P.SYSTEM, P.SYSTEM],
        [P.SYSTEM, P.SYSTEM, P.INTERNAL, P.NODE],
        [P.SYSTEM, P.SYSTEM, P.NODE, P.INTERNAL],
    ]
    b = node("n").gpus(4, memory=1000).used(0, memory=500).used(1, memory=500)
    uuids = tuple(d.uuid for d in b.inventory().devices)
    t = topology.Topology(
        uuids=uuids,
        nvlinks=tuple((0,) * 4 for _ in range(4)),
        pcie=tuple(tuple(r) for r in lv),
        p2p=tuple(tuple(i != j and lv[i][j] <= P.HOSTBRIDGE for j in range(4)) for i in range(4)),
    )
    state = b.topo(t).state()
    req = pod().gpu(2, memory=100).obj()
    cols = columns.build([state])
    for name, expected in (("topology-aware", 84), ("topology-aware:balanced-utilization", 56)):
        pol = registry.get(name)
        assert pol.score_node(state, req, CTX).score == expected
        assert batch.evaluate({"n": state}, cols, ["n"], req, pol, pol).scores[0] == expected
