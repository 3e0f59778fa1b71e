"""Registration, topology, telemetry, node inventory, pod devices and quantities: worked examples."""

from __future__ import annotations

import datetime as dt
from fractions import Fraction

import pytest

from gpuslice.codec import (
    errors,
    keys,
    node_inventory,
    pod_devices,
    quantity,
    registrations,
    telemetry,
    topology,
)
from gpuslice.model import allocations, devices, mig, nodes
from gpuslice.model import topology as model_topology

pytestmark = pytest.mark.unit

P = model_topology.PcieLevel
V100 = "NVIDIA-Tesla V100-PCIE-32GB"
REGISTER = (
    '[{"id":"GPU-a","count":10,"devmem":32768,"devcore":100,"type":"'
    + V100
    + '","mode":"hami-core","health":true},'
    '{"id":"GPU-b","index":1,"count":10,"devmem":32768,"devcore":100,"type":"' + V100 + '","numa":1,'
    '"mode":"hami-core","health":true}]'
)
CARD_A = devices.GpuDevice(uuid="GPU-a", type=V100, memory_mib=32768, mode="hami-core")
CARD_B = devices.GpuDevice(uuid="GPU-b", index=1, type=V100, memory_mib=32768, numa=1, mode="hami-core")


def test_registration_json_protocol_example_round_trips_byte_for_byte() -> None:
    assert registrations.decode(REGISTER) == (CARD_A, CARD_B)
    assert registrations.encode_json([CARD_A, CARD_B]) == REGISTER


def test_registration_json_tolerates_nulls_unknown_keys_and_mig_profiles() -> None:
    value = (
        ' [{"id":"GPU-m","index":null,"count":7,"devmem":40000,"devcore":100,'
        '"type":"NVIDIA A100","mode":"mig",'
        '"migProfiles":[{"name":"1g.10gb","memoryMB":10000,"core":14,"sliceCount":1,"placements":[]}],'
        '"health":true,"devicevendor":"NVIDIA"}]'
    )
    (card,) = registrations.decode(value)
    profile = mig.Profile(name="1g.10gb", memory_mib=10000, cores=14, slice_count=1, placements=())
    assert card == devices.GpuDevice(
        uuid="GPU-m",
        split_count=7,
        memory_mib=40000,
        type="NVIDIA A100",
        mode="mig",
        health=True,
        mig_profiles=(profile,),
    )


@pytest.mark.parametrize(
    ("placement", "field"),
    [
        ('{"start":-1,"size":1}', "[0].migProfiles[0].placements[0].start"),
        ('{"start":0,"size":4294967296}', "[0].migProfiles[0].placements[0].size"),
    ],
)
def test_registration_mig_placement_errors_name_the_field(placement: str, field: str) -> None:
    value = f'[{{"id":"GPU-m","mode":"mig","migProfiles":[{{"name":"1g.5gb","placements":[{placement}]}}]}}]'
    with pytest.raises(errors.DecodeError) as info:
        registrations.decode(value)
    assert (info.value.annotation, info.value.field) == (keys.NODE_REGISTER, field)


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ('[{"id":"GPU-a","devmem":2147483648}]', "[0].devmem"),
        ('[{"id":"GPU-a","count":"10"}]', "json"),
        ('[{"id":"GPU-a"}', "json"),
        ("[null]", "json"),
    ],
    ids=["int32-overflow", "string-count", "truncated", "null-card"],
)
def test_registration_json_errors(value: str, field: str) -> None:
    with pytest.raises(errors.DecodeError) as info:
        registrations.decode(value)
    assert (info.value.annotation, info.value.field) == (keys.NODE_REGISTER, field)


def test_registration_legacy_protocol_example() -> None:
    value = f"GPU-a,10,32768,100,{V100},0,true:GPU-b,10,32768,100,{V100},1,False:"
    a, b = registrations.decode(value)
    assert a == devices.GpuDevice(uuid="GPU-a", type=V100, memory_mib=32768)
    assert (b.numa, b.health, b.mode, b.index) == (1, False, "hami-core", 0)


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        (
            "GPU-a,2147483648,1,1,T,0,true:",
            'invalid count field: strconv.ParseInt: parsing "2147483648": value out of range',
        ),
        ("GPU-a, 10,1,1,T,0,true:", 'invalid count field: strconv.ParseInt: parsing " 10": invalid syntax'),
        ("GPU-a,1_0,1,1,T,0,true:", 'invalid count field: strconv.ParseInt: parsing "1_0": invalid syntax'),
        ("GPU-a,10,1,1,T,0,yes:", 'invalid health field: strconv.ParseBool: parsing "yes": invalid syntax'),
    ],
    ids=["int32-range", "leading-space", "underscore", "bool"],
)
def test_registration_legacy_go_number_rules(value: str, detail: str) -> None:
    with pytest.raises(errors.DecodeError) as info:
        registrations.decode(value)
    assert info.value.detail == detail


# --- topology ------------------------------------------------------------------------------------

SCORES = (
    '[{"uuid":"GPU-a","score":{"GPU-b":650,"GPU-c":20}},{"uuid":"GPU-b","score":{"GPU-a":650,"GPU-c":20}},'
    '{"uuid":"GPU-c","score":{"GPU-a":20,"GPU-b":20}}]'
)


def test_topology_from_pair_scores() -> None:
    topo = topology.topology_from_pair_scores(
        topology.decode_pair_scores(SCORES), ("GPU-a", "GPU-b", "GPU-c")
    )
    # 650 = 6 NVLinks x 100 + 50 (single PCIe switch); 20 = no NVLink, same CPU (NODE).
    assert topo.nvlinks == ((0, 6, 0), (6, 0, 0), (0, 0, 0))
    assert topo.pcie == (
        (P.INTERNAL, P.SINGLE, P.NODE),
        (P.SINGLE, P.INTERNAL, P.NODE),
        (P.NODE, P.NODE, P.INTERNAL),
    )
    assert topo.p2p == ((False, True, False), (True, False, False), (False, False, False))
    assert topo.pair_score(0, 1) == 650 and topo.pair_score(1, 2) == 20


def test_topology_from_pair_scores_fills_gaps() -> None:
    # GPU-z is only a score target; a missing or zero (asymmetric) score reads as SYSTEM, no link.
    scores = topology.decode_pair_scores('[{"uuid":"GPU-a","score":{"GPU-z":0}}]')
    topo = topology.topology_from_pair_scores(scores, ("GPU-b", "GPU-a"))
    assert topo.uuids == ("GPU-b", "GPU-a", "GPU-z")
    assert topo.pcie[1][2] == P.SYSTEM and topo.nvlinks[1][2] == 0
    assert topo.pcie[0][1] == P.SYSTEM


def test_encode_score_matrix_keeps_given_scores() -> None:
    # The agent scores asymmetric NVLink pairs 0, as HAMi's plugin does; the matrix is kept as given.
    value = topology.encode_score_matrix(("GPU-a", "GPU-b"), ((0, 0), (0, 0)))
    assert value == '[{"uuid":"GPU-a","score":{"GPU-b":0}},{"uuid":"GPU-b","score":{"GPU-a":0}}]'
    assert topology.decode_pair_scores(value) == {"GPU-a": {"GPU-b": 0}, "GPU-b": {"GPU-a": 0}}
    with pytest.raises(ValueError, match="2x2"):
        topology.encode_score_matrix(("GPU-a", "GPU-b"), ((0,),))


def test_pair_scores_first_entry_wins() -> None:
    scores = topology.decode_pair_scores(
        '[{"uuid":"a","score":{"b":10}},{"uuid":"a","score":{"b":60}},{"uuid":"b"}]'
    )
    assert scores == {"a": {"b": 10}, "b": {}}


def test_topology_annotation_example() -> None:
    topo = model_topology.uniform(("GPU-a", "GPU-b"), P.SINGLE, nvlinks=12)
    value = topology.encode_topology(topo, (0, 0))
    assert value == (
        '{"v":1,"uuids":["GPU-a","GPU-b"],"nvlink":[[0,12],[12,0]],"pcie":[[0,10],[10,0]],'
        '"p2p":[[0,1],[1,0]],"numa":[0,0]}'
    )
    assert topology.decode_topology(value) == topology.TopologyAnnotation(topology=topo, numa=(0, 0))
    assert '"numa"' not in topology.encode_topology(topo)


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ('{"v":2,"uuids":[],"nvlink":[],"pcie":[],"p2p":[]}', "v"),
        ('{"v":1,"uuids":["a"],"nvlink":[[0,1]],"pcie":[[0]],"p2p":[[0]]}', "nvlink"),
        ('{"v":1,"uuids":["a"],"nvlink":[[-1]],"pcie":[[0]],"p2p":[[0]]}', "nvlink"),
        ('{"v":1,"uuids":["a"],"nvlink":[[0]],"pcie":[[15]],"p2p":[[0]]}', "pcie"),
        ('{"v":1,"uuids":["a"],"nvlink":[[0]],"pcie":[[0]],"p2p":[[2]]}', "p2p"),
        ('{"v":1,"uuids":["a","a"],"nvlink":[],"pcie":[],"p2p":[]}', "uuids"),
        ('{"v":1,"uuids":["a"],"nvlink":[[0]],"pcie":[[0]],"p2p":[[0]],"numa":[]}', "numa"),
        ('{"v":1,"uuids":["a"]}', "json"),
    ],
    ids=[
        "version",
        "not-square",
        "negative-links",
        "unknown-level",
        "p2p-not-bit",
        "duplicate",
        "numa-length",
        "missing",
    ],
)
def test_topology_annotation_errors(value: str, field: str) -> None:
    with pytest.raises(errors.DecodeError) as info:
        topology.decode_topology(value)
    assert (info.value.annotation, info.value.field) == (keys.GPU_TOPOLOGY, field)


# --- telemetry and node inventory ----------------------------------------------------------------

T0 = dt.datetime(2026, 11, 30, 1, 2, 3, tzinfo=dt.UTC)


def test_telemetry_example() -> None:
    card = nodes.CardTelemetry(uuid="GPU-a", temperature_c=41.0, utilization_pct=12.5, memory_used_mib=2048)
    value = telemetry.encode([card], T0)
    assert value == (
        '{"v":1,"ts":"2026-11-30T01:02:03Z",'
        '"cards":[{"uuid":"GPU-a","temp":41.0,"util":12.5,"memUsed":2048}]}'
    )
    assert telemetry.decode(value) == telemetry.TelemetryAnnotation(timestamp=T0, cards=(card,))


@pytest.mark.parametrize(
    ("value", "field"),
    [('{"v":1,"ts":"yesterday"}', "ts"), ('{"v":3,"ts":"2026-11-30T01:02:03Z"}', "v"), ("{", "json")],
    ids=["timestamp", "version", "json"],
)
def test_telemetry_errors(value: str, field: str) -> None:
    with pytest.raises(errors.DecodeError) as info:
        telemetry.decode(value)
    assert (info.value.annotation, info.value.field) == (keys.GPU_TELEMETRY, field)


def test_decode_node_with_every_annotation() -> None:
    own = model_topology.uniform(("GPU-a", "GPU-b"), P.SINGLE, nvlinks=4)
    annotations = {
        keys.NODE_REGISTER: REGISTER,
        keys.DEVICE_CORDON: " GPU-b, ,GPU-x,",
        keys.NODE_PAIR_SCORE: '[{"uuid":"GPU-a","score":{"GPU-b":20}}]',
        keys.GPU_TOPOLOGY: topology.encode_topology(own),
        keys.GPU_TELEMETRY: telemetry.encode([nodes.CardTelemetry(uuid="GPU-a", temperature_c=50.0)], T0),
    }
    inv = node_inventory.decode_node("n1", annotations)
    assert inv.name == "n1" and inv.devices == (CARD_A, CARD_B)
    assert inv.cordoned == frozenset({"GPU-b", "GPU-x"})
    assert inv.topology == own  # gpuslice's own annotation wins over the pair scores
    assert inv.telemetry == (nodes.CardTelemetry(uuid="GPU-a", temperature_c=50.0),)


def test_decode_node_minimal_and_legacy() -> None:
    inv = node_inventory.decode_node("n", {keys.NODE_REGISTER: "GPU-a,10,1000,100,T4,0,true:"})
    assert inv.topology is None and inv.cordoned == frozenset() and inv.telemetry == ()
    assert inv.devices[0].uuid == "GPU-a"


def test_decode_node_pair_scores_follow_registration_order() -> None:
    inv = node_inventory.decode_node(
        "n", {keys.NODE_REGISTER: REGISTER, keys.NODE_PAIR_SCORE: '[{"uuid":"GPU-b","score":{"GPU-a":120}}]'}
    )
    assert inv.topology is not None
    assert inv.topology.uuids == ("GPU-a", "GPU-b")
    assert inv.topology.nvlinks[1][0] == 1 and inv.topology.pcie[1][0] == P.NODE


def test_decode_node_bad_telemetry_is_ignored_but_bad_topology_fails() -> None:
    inv = node_inventory.decode_node("n", {keys.NODE_REGISTER: REGISTER, keys.GPU_TELEMETRY: "{oops"})
    assert inv.telemetry == ()
    with pytest.raises(errors.DecodeError) as info:
        node_inventory.decode_node("n", {keys.NODE_REGISTER: REGISTER, keys.GPU_TOPOLOGY: "{oops"})
    assert info.value.annotation == keys.GPU_TOPOLOGY


def test_decode_node_missing_registration() -> None:
    with pytest.raises(errors.AnnotationMissing) as info:
        node_inventory.decode_node("n", {})
    assert info.value.annotation == keys.NODE_REGISTER


# --- pod devices ---------------------------------------------------------------------------------


def g(uuid: str, mem: int, cores: int) -> allocations.DeviceGrant:
    return allocations.DeviceGrant(uuid=uuid, memory_mib=mem, cores=cores)


def test_bind_annotations_protocol_example() -> None:
    # init container without GPU; app container with 2 cards at 3000 MiB / 30 %; app container without GPU
    alloc = allocations.PodAllocation(
        node="node-1", containers=((), (g("GPU-a", 3000, 30), g("GPU-b", 3000, 30)), ()), init_count=1
    )
    devices_value = ";GPU-a,NVIDIA,3000,30:GPU-b,NVIDIA,3000,30:;;"
    assert pod_devices.bind_annotations(alloc, 1705054796.9) == {
        keys.VGPU_NODE: "node-1",
        keys.VGPU_TIME: "1705054796",
        keys.DEVICES_TO_ALLOCATE: devices_value,
        keys.DEVICES_ALLOCATED: devices_value,
        keys.BIND_PHASE: "allocating",
        keys.BIND_TIME: "1705054796",
    }


def test_allocation_from_pod_after_the_plugin_blanked_to_allocate() -> None:
    pod = {
        "metadata": {
            "annotations": {
                keys.VGPU_NODE: "node-1",
                keys.DEVICES_TO_ALLOCATE: ";;",
                keys.DEVICES_ALLOCATED: "GPU-a,NVIDIA,1000,10:;GPU-a,NVIDIA,2000,20:;",
            }
        },
        "spec": {"initContainers": [{"name": "i"}], "containers": [{"name": "a"}, {"name": "b"}]},
    }
    alloc = pod_devices.allocation_from_pod(pod)
    assert alloc == allocations.PodAllocation(
        node="node-1", containers=((g("GPU-a", 1000, 10),), (g("GPU-a", 2000, 20),), ()), init_count=1
    )


def test_allocation_absent_without_node_or_devices() -> None:
    assert pod_devices.allocation_from_annotations({keys.DEVICES_ALLOCATED: "GPU-a,NVIDIA,1,1:;"}) is None
    assert pod_devices.allocation_from_annotations({keys.VGPU_NODE: "n"}) is None


def test_more_entries_than_containers_is_an_error() -> None:
    with pytest.raises(errors.DecodeError) as info:
        pod_devices.decode_for_containers(";GPU-a,NVIDIA,1,1:;", 1)
    assert info.value.annotation == keys.DEVICES_ALLOCATED
    assert pod_devices.decode_for_containers(";;;", 1) == ((),)


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("GPU-a,NVIDIA,100:;", "[0][0]"),
        ("GPU-a,NVIDIA,x,1:;", "[0][0].memory"),
        (";GPU-a,NVIDIA,1,9999999999:", "[1][0].cores"),
    ],
    ids=["three-fields", "memory-not-int", "cores-overflow"],
)
def test_pod_devices_errors(value: str, field: str) -> None:
    with pytest.raises(errors.DecodeError) as info:
        pod_devices.decode(value, keys.DEVICES_TO_ALLOCATE)
    assert (info.value.annotation, info.value.field) == (keys.DEVICES_TO_ALLOCATE, field)


def test_pod_devices_ignore_segments_without_comma_and_extra_fields() -> None:
    assert pod_devices.decode("junk:GPU-a,NVIDIA,1,2,extra:") == ((g("GPU-a", 1, 2),),)


# --- quantities ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "exact", "value", "as_int"),
    [
        ("1", Fraction(1), 1, 1),
        ("500m", Fraction(1, 2), 1, None),
        ("-500m", Fraction(-1, 2), -1, None),
        ("1Gi", Fraction(2**30), 2**30, 2**30),
        ("2e3", Fraction(2000), 2000, 2000),
        ("1.5k", Fraction(1500), 1500, 1500),
        (".5", Fraction(1, 2), 1, None),
        ("+3.", Fraction(3), 3, 3),
        ("1E", Fraction(10**18), 10**18, 10**18),
        ("12Ei", Fraction(12 * 2**60), 12 * 2**60, None),
        ("1e-3", Fraction(1, 1000), 1, None),
        ("100n", Fraction(1, 10**7), 1, None),
    ],
)
def test_quantity(text: str, exact: Fraction, value: int, as_int: int | None) -> None:
    q = quantity.parse(text, "r")
    assert q == exact
    assert quantity.value(q) == value
    assert quantity.as_int64(q) == as_int


@pytest.mark.parametrize("text", ["", " 1", "1 ", "1e", "1.2.3", "Gi", "1Ki1", "1g", "0x10", "1e1000", "१"])
def test_quantity_garbage(text: str) -> None:
    with pytest.raises(errors.DecodeError) as info:
        quantity.parse(text, "nvidia.com/gpumem")
    assert info.value.annotation == "nvidia.com/gpumem"
