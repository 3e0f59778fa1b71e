"""Annotation values from discoveries: decoded by the extender's codecs, they give back the model."""

from __future__ import annotations

import datetime as dt
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from gpuslice.agent import backend, collect, discover, fake, publish
from gpuslice.codec import keys, node_inventory, telemetry, topology
from gpuslice.model import nodes

pytestmark = pytest.mark.unit

NAMES = sorted(n for n in fake.SHAPES if n != "none")


def found(name: str, health: dict[int, bool] | None = None) -> discover.Discovery:
    return discover.discover(
        collect.inventory(fake.FakeBackend(fake.shape(name))), discover.RegistrationConfig(), health
    )


@pytest.mark.parametrize("name", NAMES)
def test_annotations_decode_to_the_discovery(name: str) -> None:
    d = found(name)
    ann = publish.topology_annotations(d, register=True)
    assert set(ann) == {keys.NODE_REGISTER, keys.NODE_PAIR_SCORE, keys.GPU_TOPOLOGY}
    inv = node_inventory.decode_node("n", ann)
    assert inv.devices == d.devices
    assert inv.topology == d.topology
    own = topology.decode_topology(ann[keys.GPU_TOPOLOGY])
    assert own.numa == (None if name == "t4-4" else tuple(x.numa for x in d.devices))  # T4 VM: NUMA unknown
    scores = topology.decode_pair_scores(ann[keys.NODE_PAIR_SCORE])
    assert d.topology is not None
    u = d.topology.uuids
    assert scores == {u[i]: {u[j]: d.scores[i][j] for j in range(len(u)) if j != i} for i in range(len(u))}


def test_pair_scores_alone_rebuild_links_and_levels() -> None:
    # a cluster that reads only HAMi's annotation still gets NVLink counts and PCIe levels back
    d = found("h100-8")
    ann = publish.topology_annotations(d, register=False)
    assert keys.NODE_REGISTER not in ann
    rebuilt = topology.topology_from_pair_scores(topology.decode_pair_scores(ann[keys.NODE_PAIR_SCORE]))
    assert d.topology is not None
    assert rebuilt.nvlinks == d.topology.nvlinks and rebuilt.pcie == d.topology.pcie


def test_unhealthy_card_in_registration() -> None:
    ann = publish.topology_annotations(found("t4-4", {1: False}), register=True)
    inv = node_inventory.decode_node("n", ann)
    assert [x.health for x in inv.devices] == [True, False, True, True]


def test_no_gpus() -> None:
    d = found("none")
    assert publish.topology_annotations(d, register=False) == {}
    assert publish.topology_annotations(d, register=True) == {keys.NODE_REGISTER: "[]"}


def test_malformed_value_is_never_published() -> None:
    with mock.patch.object(topology, "encode_topology", return_value='{"v":1,"uuids":["a"]}'):
        ann = publish.topology_annotations(found("a40-2"), register=True)
    assert keys.GPU_TOPOLOGY not in ann
    assert {keys.NODE_REGISTER, keys.NODE_PAIR_SCORE} <= set(ann)


CHANGES = [
    # (current, desired, remove, expected patch)
    ({}, {"a": "1"}, (), {"a": "1"}),
    ({"a": "1"}, {"a": "1"}, (), {}),
    ({"a": "1", "x": "keep"}, {"a": "2"}, (), {"a": "2"}),
    ({"a": "1", "b": "2"}, {}, ("b", "c"), {"b": None}),
    ({"b": "2"}, {"b": "3"}, ("b",), {"b": "3"}),
]


@pytest.mark.parametrize(
    ("current", "desired", "remove", "patch"), CHANGES, ids=["add", "same", "change", "remove", "wanted-wins"]
)
def test_changes(
    current: dict[str, str], desired: dict[str, str], remove: tuple[str, ...], patch: dict[str, str | None]
) -> None:
    assert publish.changes(current, desired, remove) == patch


T0 = dt.datetime(2026, 11, 30, 1, 0, tzinfo=dt.UTC).timestamp()
CARD = nodes.CardTelemetry(uuid="GPU-a", temperature_c=40.0, power_draw_w=100.0, power_limit_w=300.0)
OLD = telemetry.encode((CARD,), T0)


@pytest.mark.parametrize(
    ("current", "cards", "now", "due"),
    [
        (None, (CARD,), T0, True),
        ("garbage", (CARD,), T0, True),
        (telemetry.encode((CARD,), T0), (CARD,), T0 + 299, False),  # same readings, 299 s < 300 s old
        (telemetry.encode((CARD,), T0), (CARD,), T0 + 300, True),  # stale
        (OLD, (replace(CARD, temperature_c=41.9),), T0 + 1, False),  # 1.9 C < 2 C step
        (OLD, (replace(CARD, temperature_c=42.0),), T0 + 1, True),
        (OLD, (replace(CARD, power_draw_w=114.9),), T0 + 1, False),  # 14.9 W < 5% of 300 W
        (OLD, (replace(CARD, power_draw_w=115.0),), T0 + 1, True),
        (OLD, (replace(CARD, utilization_pct=3.0),), T0 + 1, True),  # a reading appears
        (OLD, (CARD, replace(CARD, uuid="GPU-b")), T0 + 1, True),  # a card appears
    ],
    ids=[
        "none",
        "malformed",
        "unchanged",
        "stale",
        "jitter-temp",
        "temp",
        "jitter-power",
        "power",
        "new-reading",
        "new-card",
    ],
)
def test_telemetry_changed(
    current: str | None, cards: tuple[nodes.CardTelemetry, ...], now: float, due: bool
) -> None:
    assert publish.telemetry_changed(current, cards, now, max_age_s=300) is due


def test_telemetry_annotation_round_trip() -> None:
    b = fake.FakeBackend(fake.shape("l40s-2"))
    cards = discover.card_telemetry(b.gpus(), collect.telemetry(b, b.gpus()))
    ann = publish.telemetry_annotation(cards, T0)
    assert node_inventory.node_telemetry(ann) == cards


text = st.text(min_size=0, max_size=12)


@given(
    names=st.lists(
        st.tuples(text, text, st.sampled_from(["00000000:18:00.0", "0000:AB:00.1", "junk", ""])), max_size=5
    ),
    levels=st.lists(st.sampled_from([None, 0, 10, 20, 30, 40, 50, 7]), min_size=25, max_size=25),
    numa=st.lists(st.one_of(st.none(), st.integers(-2, 3)), min_size=5, max_size=5),
    memory=st.integers(0, 200_000),
)
def test_whatever_nvml_says_annotations_decode(
    names: list[tuple[str, str, str]], levels: list[int | None], numa: list[int | None], memory: int
) -> None:
    """Odd names, repeated or empty UUIDs, malformed bus ids, unknown levels: never a malformed value."""
    gpus = tuple(
        backend.GpuRecord(index=i, uuid=u, name=n, memory_total_mib=memory, pci_bus_id=bus, numa_node=numa[i])
        for i, (u, n, bus) in enumerate(names)
    )
    pairs = tuple(
        backend.PairRecord(a=a, b=b, common_ancestor=levels[a * 5 + b])
        for a in range(len(gpus))
        for b in range(len(gpus))
        if a != b
    )
    records = collect.Records(gpus=gpus, nvlinks=tuple(() for _ in gpus), pairs=pairs)
    d = discover.discover(records, discover.RegistrationConfig())
    ann = publish.topology_annotations(d, register=True)
    assert set(ann) == (
        {keys.NODE_REGISTER} | ({keys.NODE_PAIR_SCORE, keys.GPU_TOPOLOGY} if d.devices else set())
    )
    if d.devices:
        inv = node_inventory.decode_node("n", ann)
        assert inv.devices == d.devices and inv.topology == d.topology
    else:
        assert ann[keys.NODE_REGISTER] == "[]"
