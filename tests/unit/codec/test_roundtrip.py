"""Property tests: decode(encode(x)) == x for every codec gpuslice writes."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gpuslice.codec import instants, locks, pod_devices, registrations, telemetry, topology
from gpuslice.model import allocations, devices, nodes
from gpuslice.model import topology as model_topology
from tests.unit.codec import strategies

pytestmark = pytest.mark.unit


@strategies.RELAXED
@given(strategies.json_cards)
def test_registration_json_roundtrip(cards: list[devices.GpuDevice]) -> None:
    encoded = registrations.encode_json(cards)
    assert registrations.decode(encoded) == tuple(cards)


@strategies.RELAXED
@given(strategies.legacy_cards)
def test_registration_legacy_roundtrip(cards: list[devices.GpuDevice]) -> None:
    # A value starting with '[' is JSON by the decoding rule, so the first UUID may not start so.
    assume(not cards or not cards[0].uuid.lstrip().startswith("["))
    encoded = registrations.encode_legacy(cards)
    # An empty list encodes to '' which HAMi rejects ("missing device separator"); ':' is empty.
    assert registrations.decode(encoded or ":") == tuple(cards)


@pytest.mark.parametrize(
    ("uuid", "type_"),
    [("GPU-0", "a,b"), ("GPU-0", "a:b"), (" [GPU-0", "T4")],
    ids=["comma", "colon", "reads-as-json"],
)
def test_legacy_encoder_refuses_what_it_cannot_carry(uuid: str, type_: str) -> None:
    with pytest.raises(ValueError, match="legacy registration"):
        registrations.encode_legacy([devices.GpuDevice(uuid=uuid, type=type_)])


@strategies.RELAXED
@given(strategies.container_lists)
def test_pod_devices_roundtrip(containers: tuple[allocations.ContainerAllocation, ...]) -> None:
    encoded = pod_devices.encode(containers)
    # HAMi's split keeps the empty entry after the final ';' (and '' is one empty container).
    assert pod_devices.decode(encoded) == containers + ((),)
    assert pod_devices.decode_for_containers(encoded, len(containers)) == containers
    assert pod_devices.decode_for_containers(encoded) == containers


@strategies.RELAXED
@given(strategies.container_lists, st.integers(0, 3), strategies.instants)
def test_allocation_rebuilt_from_bind_annotations(
    containers: tuple[allocations.ContainerAllocation, ...], init: int, now: dt.datetime
) -> None:
    init = min(init, len(containers))
    alloc = allocations.PodAllocation(node="node-a", containers=containers, init_count=init)
    annotations = pod_devices.bind_annotations(alloc, now)
    rebuilt = pod_devices.allocation_from_annotations(
        annotations, init_count=init, container_count=len(containers)
    )
    if containers:
        assert rebuilt == alloc
    else:  # nothing to allocate: HAMi writes no device keys, so there is nothing to rebuild
        assert rebuilt is None


@strategies.RELAXED
@given(strategies.topologies(), st.booleans(), st.data())
def test_topology_annotation_roundtrip(
    topo: model_topology.Topology, with_numa: bool, data: st.DataObject
) -> None:
    numa = tuple(data.draw(st.lists(st.integers(0, 7), min_size=len(topo.uuids), max_size=len(topo.uuids))))
    encoded = topology.encode_topology(topo, numa if with_numa else None)
    assert topology.decode_topology(encoded) == topology.TopologyAnnotation(
        topology=topo, numa=numa if with_numa else None
    )


@strategies.RELAXED
@given(strategies.topologies(proper_diagonal=True))
def test_pair_scores_keep_links_and_pcie_levels(topo: model_topology.Topology) -> None:
    # Every HAMi score is 100 x links + a level score in 10..60, so both come back exactly.
    scores = topology.decode_pair_scores(topology.encode_pair_scores(topo))
    derived = topology.topology_from_pair_scores(scores, topo.uuids)
    assert derived.uuids == topo.uuids
    assert derived.nvlinks == topo.nvlinks
    assert derived.pcie == topo.pcie


@strategies.RELAXED
@given(strategies.instants, strategies.text_without(",", 30), strategies.text_without(",", 30))
def test_lock_roundtrip(now: dt.datetime, namespace: str, name: str) -> None:
    lock = locks.decode(locks.encode(now, namespace, name))
    assert lock == locks.NodeLock(taken=now.replace(microsecond=0), namespace=namespace, name=name)
    assert locks.is_owner(locks.encode(now, namespace, name), namespace, name)


@strategies.RELAXED
@given(strategies.instants)
def test_legacy_lock_roundtrip(now: dt.datetime) -> None:
    lock = locks.decode(instants.format_rfc3339(now))
    assert lock == locks.NodeLock(taken=now.replace(microsecond=0))
    assert not lock.has_owner


@strategies.RELAXED
@given(strategies.telemetry_cards, strategies.instants)
def test_telemetry_roundtrip(cards: list[nodes.CardTelemetry], now: dt.datetime) -> None:
    decoded = telemetry.decode(telemetry.encode(cards, now))
    assert decoded == telemetry.TelemetryAnnotation(timestamp=now.replace(microsecond=0), cards=tuple(cards))
