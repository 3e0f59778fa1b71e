"""The agent's annotations, decoded by the extender's codecs, give the topology-aware policy the right sets.

Pipeline under test: fake NVML shape -> discovery -> annotations (codec encoders) -> NodeInventory
(codec decoder, as the extender's feed does) -> ``topology-aware`` ``choose_cards``.
"""

from __future__ import annotations

import pytest

from gpuslice.agent import collect, discover, fake, publish
from gpuslice.codec import keys, node_inventory
from gpuslice.framework import registry
from gpuslice.model import nodes, requests
from gpuslice.policy import api

pytestmark = pytest.mark.unit


def decoded_state(shape: str, *, own_topology: bool = True) -> nodes.NodeState:
    found = discover.discover(
        collect.inventory(fake.FakeBackend(fake.shape(shape))), discover.RegistrationConfig()
    )
    ann = publish.topology_annotations(found, register=True)
    if not own_topology:  # a reader that has only HAMi's pair scores
        del ann[keys.GPU_TOPOLOGY]
    return nodes.empty_state(node_inventory.decode_node("n", ann))


def choose(state: nodes.NodeState, count: int, eligible: tuple[int, ...] | None = None) -> frozenset[int]:
    policy = registry.get("topology-aware")
    every = tuple(range(len(state.inventory.devices)))
    cards = policy.choose_cards(
        state,
        requests.ContainerRequest(count=count, memory_mib=1000),
        eligible or every,
        api.EMPTY_CONTEXT,
    )
    assert cards is not None and len(cards) == count
    return frozenset(cards)


NUMA0, NUMA1 = frozenset({0, 1, 2, 3}), frozenset({4, 5, 6, 7})

CASES = [
    # (shape, count, eligible, acceptable sets)
    # A100 PCIe, two sockets: 4 cards of one socket sum 2 x 50 (switch pairs) + 4 x 20 (NODE) = 180,
    # any set crossing sockets at most 2 x 50 + 4 x 10 = 140.
    ("a100-8-2numa", 4, None, (NUMA0, NUMA1)),
    # 2 cards: a pair under one PCIe switch (50) beats NODE (20) and SYSTEM (10).
    ("a100-8-2numa", 2, None, tuple(frozenset({i, i + 1}) for i in (0, 2, 4, 6))),
    # only cards 0, 2, 3, 5 free: {2, 3} share a switch.
    ("a100-8-2numa", 2, (0, 2, 3, 5), (frozenset({2, 3}),)),
    # 3 cards among 1, 4, 5, 6: {4, 5, 6} on socket 1 = 50 + 20 + 20 = 90 vs 50 + 10 + 10 = 70 with card 1.
    ("a100-8-2numa", 3, (1, 4, 5, 6), (frozenset({4, 5, 6}),)),
    # H100 SXM: every pair has 18 NVLinks (1800); within a socket NODE adds 20, across SYSTEM 10.
    ("h100-8", 4, None, (NUMA0, NUMA1)),
    ("h100-8", 8, None, (NUMA0 | NUMA1,)),
    # A40 pair with the bridge; L40S pair over PCIe: the only choice.
    ("a40-2", 2, None, (frozenset({0, 1}),)),
]


@pytest.mark.parametrize(
    ("shape", "count", "eligible", "best"),
    CASES,
    ids=[f"{c[0]}-{c[1]}of{'all' if c[2] is None else ''.join(map(str, c[2]))}" for c in CASES],
)
@pytest.mark.parametrize("own_topology", [True, False], ids=["gpu-topology", "pair-scores-only"])
def test_best_sets(
    shape: str,
    count: int,
    eligible: tuple[int, ...] | None,
    best: tuple[frozenset[int], ...],
    own_topology: bool,
) -> None:
    state = decoded_state(shape, own_topology=own_topology)
    assert choose(state, count, eligible) in best


def test_two_numa_node_keeps_a_socket_for_the_next_pod() -> None:
    # one 4-GPU pod on socket 0 leaves socket 1 whole for the next one
    state = decoded_state("a100-8-2numa")
    first = choose(state, 4)
    rest = tuple(i for i in range(8) if i not in first)
    assert choose(state, 4, rest) == frozenset(rest)
    assert {state.inventory.devices[i].numa for i in first} in ({0}, {1})


@pytest.mark.parametrize("hot", [0, 1, 2, 3])
def test_published_telemetry_steers_the_balanced_policy(hot: int) -> None:
    # one T4 at 86 C drawing 69 of 70 W: no thermal or power headroom, so balanced leaves it out
    b = fake.FakeBackend(fake.shape("t4-4"))
    b.set_telemetry(hot, temperature_c=86.0, power_draw_w=69.0)
    records = collect.inventory(b)
    ann = publish.topology_annotations(
        discover.discover(records, discover.RegistrationConfig()), register=True
    )
    ann |= publish.telemetry_annotation(
        discover.card_telemetry(records.gpus, collect.telemetry(b, records.gpus)), 0.0
    )
    state = nodes.empty_state(node_inventory.decode_node("n", ann))
    cards = registry.get("balanced").choose_cards(
        state, requests.ContainerRequest(count=3, memory_mib=100), (0, 1, 2, 3), api.EMPTY_CONTEXT
    )
    assert cards is not None and hot not in cards
