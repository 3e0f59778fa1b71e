"""topology-aware on the batch path: the vectorised scores are exactly score_node's, for every strategy."""

from __future__ import annotations

import itertools

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.framework import registry
from gpuslice.model import devices, nodes, requests, status, topology
from gpuslice.policy import api, batch, cardsets, columns, fit, quota, vectorfit
from tests.unit.builders import node, pod
from tests.unit.policy import strategies

pytestmark = pytest.mark.unit

S = cardsets.Strategy
P = topology.PcieLevel
CTX = api.EMPTY_CONTEXT
NAMES = ["topology-aware", *(f"topology-aware:{s.value}" for s in S)]


def random_topology(draw: st.DrawFn, uuids: tuple[str, ...]) -> topology.Topology:
    """Random NVLink counts and PCIe levels; links may be asymmetric."""
    n = len(uuids)
    nv = [[0 if i == j else draw(st.sampled_from((0, 0, 1, 2, 12))) for j in range(n)] for i in range(n)]
    lv = [[P.INTERNAL if i == j else draw(st.sampled_from(list(P))) for j in range(n)] for i in range(n)]
    return topology.Topology(
        uuids=uuids,
        nvlinks=tuple(tuple(r) for r in nv),
        pcie=tuple(tuple(r) for r in lv),
        p2p=tuple(tuple(i != j and draw(st.booleans()) for j in range(n)) for i in range(n)),
    )


def islands(uuids: tuple[str, ...]) -> topology.Topology:
    """Two NVLink islands, one PCIe switch each, SYSTEM across (a DGX-like board)."""
    n = len(uuids)
    same = [[(i < n // 2) == (j < n // 2) for j in range(n)] for i in range(n)]
    return topology.Topology(
        uuids=uuids,
        nvlinks=tuple(tuple(2 if same[i][j] and i != j else 0 for j in range(n)) for i in range(n)),
        pcie=tuple(
            tuple(P.INTERNAL if i == j else P.SINGLE if same[i][j] else P.SYSTEM for j in range(n))
            for i in range(n)
        ),
        p2p=tuple(tuple(i != j and same[i][j] for j in range(n)) for i in range(n)),
    )


@st.composite
def topo_nodes(draw: st.DrawFn, name: str, shared: str) -> nodes.NodeState:
    """Up to 12 mostly usable cards on up to 4 NUMA nodes; no topology, a shared board, a random or a
    partial one. A few cards are unhealthy, cordoned, full or busy so candidate sets vary."""
    n = draw(st.integers(0, 12))
    mem = draw(st.sampled_from((24000, 81920)))
    split = draw(st.integers(1, 4))
    devs, usage, cordoned = [], [], set()
    for i in range(n):
        u = f"GPU-{name}-{i}"
        devs.append(
            devices.GpuDevice(
                uuid=u,
                index=i,
                type=draw(st.sampled_from(("NVIDIA A100", "NVIDIA A100", "NVIDIA V100"))),
                memory_mib=mem,
                split_count=split,
                numa=draw(st.integers(0, 3)),
                health=draw(st.integers(0, 9)) > 0,
                mode=draw(st.sampled_from((devices.MODE_HAMI_CORE,) * 4 + (devices.MODE_MPS,))),
            )
        )
        if draw(st.integers(0, 15)) == 0:
            cordoned.add(u)
        slots = draw(st.sampled_from((0, 0, 0, 1, split)))
        usage.append(
            nodes.CardUsage(
                slots=slots,
                memory_mib=0 if slots == 0 else draw(st.integers(0, mem)),
                cores=0 if slots == 0 else draw(st.sampled_from((0, 10, 50, 100))),
            )
        )
    uuids = tuple(d.uuid for d in devs)
    kind = draw(st.sampled_from(("none", "shared", "shared", "random", "partial")))
    topo: topology.Topology | None = None
    if uuids and kind == "shared":
        topo = islands(uuids) if shared == "islands" else topology.uniform(uuids, P.HOSTBRIDGE, 1)
    elif uuids and kind == "random":
        topo = random_topology(draw, uuids)
    elif uuids and kind == "partial":
        topo = random_topology(draw, uuids[1:])
    return nodes.NodeState(
        inventory=nodes.NodeInventory(
            name=name,
            devices=tuple(devs),
            cordoned=frozenset(cordoned),
            cpu_milli=draw(st.sampled_from((0, 8000))),
            topology=topo,
        ),
        usage=tuple(usage),
    )


@st.composite
def topo_pods(draw: st.DrawFn) -> requests.PodRequest:
    """Fast-path pods of 1 to 8 cards."""
    count = draw(st.sampled_from((1, 2, 2, 3, 4, 4, 6, 8)))
    if draw(st.booleans()):
        c = requests.ContainerRequest(
            count=count,
            memory_mib=draw(st.sampled_from((1, 500, 4000, 20000))),
            cores=draw(st.sampled_from((0, 10, 30, 100))),
        )
    else:
        c = requests.ContainerRequest(count=count, memory_percentage=draw(st.sampled_from((10, 25, 50))))
    return requests.PodRequest(
        name="p",
        containers=(c,),
        cpu_milli=draw(st.sampled_from((0, 1000))),
        selectors=draw(st.sampled_from(strategies.FAST_SELECTORS)),
    )


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=150, deadline=None)
@given(
    states=st.tuples(st.integers(1, 8), st.sampled_from(("islands", "uniform"))).flatmap(
        lambda a: st.tuples(*[topo_nodes(f"n{i}", a[1]) for i in range(a[0])])
    ),
    req=topo_pods(),
    card_value=st.sampled_from(("same", "binpack", "mutex", "spread,topology-aware")),
    qv=st.one_of(st.none(), st.builds(quota.QuotaView, count_limit=st.sampled_from((2, 8)))),
)
def test_batch_scores_equal_score_node(
    name: str,
    states: tuple[nodes.NodeState, ...],
    req: requests.PodRequest,
    card_value: str,
    qv: quota.QuotaView | None,
) -> None:
    pol = registry.get(name)
    card = pol if card_value == "same" else registry.card_policy(card_value)
    by_name = {s.name: s for s in states}
    cols = columns.build(list(states))
    names = [s.name for s in states] + ["ghost"]
    if vectorfit.request_of(req, qv) is None:
        qv = None
    assert vectorfit.request_of(req, qv) is not None
    ev = batch.evaluate(by_name, cols, names, req, pol, card, CTX, qv)
    slow = batch.evaluate(by_name, None, names, req, pol, card, CTX, qv)
    assert list(ev.feasible) == list(slow.feasible)
    assert list(ev.scores) == list(slow.scores)
    assert ev.failures == slow.failures
    for i, s in enumerate(states):
        assert bool(ev.feasible[i]) == fit.place(s, req, card, CTX, qv).status.ok
        if ev.feasible[i]:
            assert ev.scores[i] == pol.score_node(s, req, CTX).score
    assert ev.failures["ghost"][0] == status.Status(status.Code.UNRESOLVABLE, (status.NODE_UNREGISTERED,))


@st.composite
def weight_rows(
    draw: st.DrawFn,
) -> tuple[cardsets.Weights, list[tuple[int, ...]], list[tuple[int, ...]], int]:
    n = draw(st.integers(2, 10))
    m = [[0] * n for _ in range(n)]
    for i, j in itertools.combinations(range(n), 2):
        m[i][j] = m[j][i] = draw(st.sampled_from((0, 10, 20, 50, 60, 110, 250)))
    k = draw(st.integers(2, n))
    cands = draw(st.lists(st.sets(st.integers(0, n - 1), min_size=k), min_size=1, max_size=6))
    bonus = [draw(st.tuples(*[st.integers(0, 200)] * n)) for _ in cands]
    return tuple(tuple(r) for r in m), [tuple(sorted(c)) for c in cands], bonus, k


@settings(max_examples=300, deadline=None)
@given(case=weight_rows(), strategy=st.sampled_from(list(S)), width_extra=st.integers(0, 2))
def test_best_many_equals_best(
    case: tuple[cardsets.Weights, list[tuple[int, ...]], list[tuple[int, ...]], int],
    strategy: cardsets.Strategy,
    width_extra: int,
) -> None:
    w, cands, bonus, k = case
    n = len(w)
    width = n + width_extra  # padding positions are never candidates
    sets = cardsets.combos(width, k)
    if sets is None:
        return
    weights = np.zeros((1, width, width))
    weights[0, :n, :n] = np.array(w)
    inside = cardsets.inside_links(w, sets)[None, :]
    ok = np.zeros((len(cands), width), bool)
    b = np.zeros((len(cands), width))
    for r, c in enumerate(cands):
        ok[r, list(c)] = True
        b[r, :n] = bonus[r]
    tables = cardsets.pairs(weights, inside)
    pick = cardsets.best_many(tables, np.zeros(len(cands), np.int64), ok, strategy, b, sets)
    for r, c in enumerate(cands):
        assert tuple(sets.positions[pick[r]]) == cardsets.best(w, c, k, strategy, bonus[r])


def test_combos_are_lexicographic_and_bounded() -> None:
    sets = cardsets.combos(5, 2)
    assert sets is not None
    assert [tuple(c) for c in sets.positions] == list(itertools.combinations(range(5), 2))
    assert sets.members.sum(axis=1).tolist() == [2.0] * 10
    assert cardsets.combos(16, 8) is None  # 12870 subsets: rows take cardsets.best one by one
    assert cardsets.combos(3, 4) is None


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("count", [2, 4])
def test_wide_node_with_many_candidates_takes_local_search(name: str, count: int) -> None:
    # 16 idle cards: more than cardsets.EXACT_LIMIT candidates -> cardsets.best's local search;
    # the 8-card node has at most 8 -> the enumerated path; the 40-card node -> fit.place.
    wide = node("wide").gpus(16)
    wide = wide.topo(islands(tuple(d.uuid for d in wide.inventory().devices)))
    small = node("small").gpus(8).used(0, memory=40000).used(5, memory=70000)
    small = small.topo(islands(tuple(d.uuid for d in small.inventory().devices)))
    states = {"wide": wide.state(), "small": small.state(), "huge": node("huge").gpus(40).state()}
    pol = registry.get(name)
    req = pod().gpu(count, memory=20000).obj()
    ev = batch.evaluate(states, columns.build(states), list(states), req, pol, pol)
    assert ev.feasible.all()
    for i, s in enumerate(states.values()):
        assert ev.scores[i] == pol.score_node(s, req, CTX).score


def test_links_of_a_new_snapshot_are_not_mixed_up() -> None:
    # the same links id 0 stands for different tables in two column sets built one after the other
    pol = registry.get("topology-aware")
    req = pod().gpu(2, memory=100).obj()
    for level, expected in ((P.SINGLE, 100 * 50 // 100 + (30 * 80 + 20 * 50) // 100), (P.SYSTEM, 50)):
        b = node("n").gpus(4)
        state = b.topo(topology.uniform(tuple(d.uuid for d in b.inventory().devices), level)).state()
        ev = batch.evaluate({"n": state}, columns.build([state]), ["n"], req, pol, pol)
        assert ev.scores[0] == pol.score_node(state, req, CTX).score == expected


def test_one_card_scores_full_marks() -> None:
    pol = registry.get("topology-aware:lowest-fragmentation")
    b = node("n").gpus(4).used(1, memory=1000)
    state = b.topo(islands(tuple(d.uuid for d in b.inventory().devices))).state()
    req = pod().gpu(1, memory=100).obj()
    assert pol.score_node(state, req, CTX).score == 100
    assert batch.evaluate({"n": state}, columns.build([state]), ["n"], req, pol, pol).scores[0] == 100


@st.composite
def busy_boards(draw: st.DrawFn, name: str) -> nodes.NodeState:
    """8 usable cards with varied free memory (so balanced-utilization's bonus varies) on a board."""
    b = node(name).gpus(8, memory=81920, slots=4)
    for i in range(8):
        used = draw(st.sampled_from((0, 0, 4096, 20000, 40960, 60000, 81000)))
        if used:
            b.used(i, memory=used)
    uuids = tuple(d.uuid for d in b.inventory().devices)
    t = draw(st.sampled_from(("islands", "uniform", "random")))
    topo = islands(uuids) if t == "islands" else topology.uniform(uuids) if t == "uniform" else None
    if topo is None:
        topo = random_topology(draw, uuids)
    state = b.topo(topo).state()
    devs = tuple(msgspec.structs.replace(d, numa=draw(st.integers(0, 1))) for d in state.inventory.devices)
    return msgspec.structs.replace(state, inventory=msgspec.structs.replace(state.inventory, devices=devs))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None)
@given(
    states=st.lists(st.integers(), min_size=1, max_size=6).flatmap(
        lambda ids: st.tuples(*[busy_boards(f"n{i}") for i in range(len(ids))])
    ),
    count=st.integers(2, 5),
)
def test_score_columns_on_busy_boards(name: str, states: tuple[nodes.NodeState, ...], count: int) -> None:
    pol = registry.get(name)
    req = pod().gpu(count, memory=500).obj()
    cols = columns.build(list(states))
    got = batch.evaluate({s.name: s for s in states}, cols, [s.name for s in states], req, pol, pol)
    for i, s in enumerate(states):
        assert got.feasible[i]
        assert got.scores[i] == pol.score_node(s, req, CTX).score


@pytest.mark.parametrize("strategy", [S.HIGHEST_BANDWIDTH, S.LOWEST_FRAGMENTATION])
@pytest.mark.parametrize("k", [2, 3, 5])
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_lookup_answers_every_mask(strategy: cardsets.Strategy, k: int, data: st.DataObject) -> None:
    n = data.draw(st.integers(k, 9))
    m = [[0] * n for _ in range(n)]
    for i, j in itertools.combinations(range(n), 2):
        m[i][j] = m[j][i] = data.draw(st.sampled_from((0, 10, 20, 50, 60, 110, 250)))
    w = tuple(tuple(r) for r in m)
    width = n + data.draw(st.integers(0, 1))
    lut = cardsets.lookup(w, width, k, strategy)
    sets = cardsets.combos(width, k)
    assert lut is not None
    assert sets is not None
    for mask in range(1 << n):
        cand = tuple(i for i in range(n) if mask >> i & 1)
        if len(cand) < k:
            assert lut[mask] == -1
        else:
            assert tuple(sets.positions[lut[mask]]) == cardsets.best(w, cand, k, strategy)
    assert cardsets.lookup(w, width, k, S.BALANCED_UTILIZATION) is None
