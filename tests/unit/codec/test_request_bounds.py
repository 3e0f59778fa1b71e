"""Every quantity that enters arithmetic has a bound, checked where it is decoded (``model.limits``).

A value past its bound is a ``DecodeError`` naming the resource or annotation and the field; a
value at the bound decodes. The property at the end: whatever numbers a pod carries, ``parse_pod``
either refuses it or returns a request whose every number lies within the bounds.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslice.cache import shapes
from gpuslice.codec import errors, keys, node_inventory, registrations, resources, topology
from gpuslice.model import config, devices, limits, requests
from gpuslice.policy import shares

pytestmark = pytest.mark.unit

GPU, MEM, PCT, CORES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
)


def container(limits_: dict[str, Any], requests_: dict[str, Any] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {"limits": limits_}
    if requests_ is not None:
        res["requests"] = requests_
    return {"name": "c", "resources": res}


def pod(*containers: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"containers": list(containers)}}


def refused(
    p: dict[str, Any], cfg: config.RequestConfig = config.DEFAULT_REQUEST_CONFIG
) -> errors.DecodeError:
    with pytest.raises(errors.DecodeError) as info:
        resources.parse_pod(p, cfg)
    return info.value


# (limits, resource named, field named)
PAST_A_BOUND = [
    ({GPU: str(limits.MAX_CARDS + 1)}, GPU),
    ({GPU: "2147483647"}, GPU),
    ({GPU: "-1"}, GPU),
    ({GPU: "500m"}, GPU),  # not an integer: HAMi drops the request, gpuslice names it
    ({GPU: "1", MEM: "2147483648"}, MEM),
    ({GPU: "1", MEM: "16Gi"}, MEM),  # gpumem is MiB: 16Gi reads as 17179869184 MiB
    ({GPU: "1", MEM: "500m"}, MEM),
    ({GPU: "1", MEM: "-5"}, MEM),
    ({GPU: "1", CORES: "2147483648"}, CORES),
    ({GPU: "1", CORES: "-1"}, CORES),
    ({GPU: "1", CORES: "1e30"}, CORES),
    ({GPU: "1", "cpu": "1e30"}, "cpu"),  # the fault run's pod: 10**33 millicores
    ({GPU: "1", "cpu": str(limits.MAX_CPU_MILLI // 1000 + 1)}, "cpu"),
    ({GPU: "1", "cpu": "-1"}, "cpu"),
    ({GPU: "1", "memory": "1e40"}, "memory"),
    ({GPU: "1", "memory": "2Ei"}, "memory"),  # 2**41 MiB
    ({"cpu": "1e30"}, "cpu"),  # a pod without GPUs is read too (its CPU is in FGD's workload)
]


@pytest.mark.parametrize(("limits_", "resource"), PAST_A_BOUND, ids=[str(c[0]) for c in PAST_A_BOUND])
def test_an_amount_past_its_bound_is_refused_naming_the_resource_and_container(
    limits_: dict[str, str], resource: str
) -> None:
    err = refused(pod(container({"cpu": "1"}), container(limits_)))
    assert err.annotation == resource
    assert err.field == "spec.containers[1]"
    assert resource in str(err)


def test_requests_are_checked_as_well_as_limits() -> None:
    err = refused(pod(container({GPU: "1"}, {GPU: "1", MEM: "99999999999"})))
    assert (err.annotation, err.field) == (MEM, "spec.containers[0]")


def test_init_containers_name_their_own_path() -> None:
    p = pod(container({GPU: "1"}))
    p["spec"]["initContainers"] = [container({GPU: "1", "cpu": "1e30"})]
    err = refused(p)
    assert (err.annotation, err.field) == ("cpu", "spec.initContainers[0]")


def test_values_at_the_bounds_decode() -> None:
    cpu_cores = limits.MAX_CPU_MILLI // 1000  # a whole number of cores at or below the bound
    got = resources.parse_pod(
        pod(
            container(
                {
                    GPU: str(limits.MAX_CARDS),
                    MEM: str(limits.MAX_CARD_MEMORY_MIB),
                    CORES: str(limits.MAX_CARD_CORES),
                    "cpu": str(cpu_cores),
                    "memory": f"{limits.MAX_MEMORY_MIB}Mi",
                }
            )
        )
    )
    assert got.containers == (
        requests.ContainerRequest(
            count=limits.MAX_CARDS, memory_mib=limits.MAX_CARD_MEMORY_MIB, cores=limits.MAX_CARD_CORES
        ),
    )
    assert (got.cpu_milli, got.memory_mib) == (cpu_cores * 1000, limits.MAX_MEMORY_MIB)


def test_the_memory_bound_follows_the_memory_factor() -> None:
    cfg = config.RequestConfig(memory_factor=4)
    high = limits.MAX_CARD_MEMORY_MIB // 4  # HAMi's MaxInt32 / memoryFactor
    assert resources.parse_pod(pod(container({GPU: "1", MEM: str(high)})), cfg).containers[0] is not None
    err = refused(pod(container({GPU: "1", MEM: str(high + 1)})), cfg)
    assert err.annotation == MEM and str(high) in str(err)


def test_a_pod_total_past_the_bound_is_refused_though_each_container_is_within() -> None:
    half = f"{limits.MAX_MEMORY_MIB // 2 + 1}Mi"
    err = refused(pod(container({"memory": half}), container({"memory": half})))
    assert (err.annotation, err.field) == ("memory", "spec")


def test_hami_own_reading_still_drops_the_request() -> None:
    # generate_request is HAMi's GenerateResourceRequests, checked by HAMi's own cases: it drops.
    cfg = config.DEFAULT_REQUEST_CONFIG
    assert resources.generate_request({GPU: "1", MEM: "16Gi"}, {}, cfg) is None


def test_annotations_larger_than_kubernetes_allows_are_refused() -> None:
    at = {"a": "x" * (limits.MAX_ANNOTATION_BYTES - 1)}
    assert resources.parse_pod(pod(container({GPU: "1"}), annotations=at)).wants_gpu
    err = refused(pod(container({GPU: "1"}), annotations={"a": "x" * limits.MAX_ANNOTATION_BYTES}))
    assert err.field == "metadata.annotations"


@pytest.mark.parametrize("key", [keys.GPU_SCHEDULER_POLICY, keys.NODE_SCHEDULER_POLICY])
def test_an_over_long_policy_annotation_is_refused_naming_it(key: str) -> None:
    long = ",".join(["binpack"] * 40)  # 319 characters, repeats of a valid name
    err = refused(pod(container({GPU: "1"}), annotations={key: long}))
    assert err.annotation == key


@pytest.mark.parametrize(
    ("allocatable", "resource"),
    [
        ({"cpu": "1e30"}, "cpu"),
        ({"memory": "2Ei"}, "memory"),
        ({"cpu": "2000000000", "memory": "1Gi"}, "cpu"),
    ],
)
def test_node_allocatable_past_the_bound_is_refused(allocatable: dict[str, str], resource: str) -> None:
    with pytest.raises(errors.DecodeError) as info:
        resources.allocatable_host(allocatable)
    assert (info.value.annotation, info.value.field) == (resource, "status.allocatable")


def test_a_registration_of_more_cards_than_any_node_has_is_refused() -> None:
    def cards(n: int) -> str:
        return registrations.encode_json(
            devices.GpuDevice(uuid=f"GPU-{i}", index=i, type="A100", memory_mib=1, cores=100, split_count=1)
            for i in range(n)
        )

    assert len(node_inventory.node_devices({keys.NODE_REGISTER: cards(limits.MAX_CARDS)})) == limits.MAX_CARDS
    with pytest.raises(errors.DecodeError) as info:
        node_inventory.node_devices({keys.NODE_REGISTER: cards(limits.MAX_CARDS + 1)})
    assert info.value.annotation == keys.NODE_REGISTER


# ----- the property: refused, or every number within its bound

amounts = st.one_of(
    st.integers(-(10**40), 10**40).map(str),
    st.sampled_from(["500m", "1e30", "16Gi", "2Ei", "0", "1", "1024", "1025", "2147483647", "2147483648"]),
    st.integers(0, 10**6).map(lambda n: f"{n}m"),
)
resource_names = st.sampled_from([GPU, MEM, PCT, CORES, "cpu", "memory"])
containers = st.dictionaries(resource_names, amounts, max_size=6).map(container)


def within(req: requests.PodRequest) -> bool:
    cards = [c for c in req.containers if c is not None]
    return (
        0 <= req.cpu_milli <= limits.MAX_CPU_MILLI
        and 0 <= req.memory_mib <= limits.MAX_MEMORY_MIB
        and all(0 < c.count <= limits.MAX_CARDS for c in cards)
        and all(0 <= c.memory_mib <= limits.MAX_CARD_MEMORY_MIB for c in cards)
        and all(0 <= c.cores <= limits.MAX_CARD_CORES for c in cards)
    )


@given(st.lists(containers, min_size=1, max_size=4), st.integers(1, 1 << 20))
def test_any_pod_is_refused_or_decodes_within_the_bounds(
    ctrs: list[dict[str, Any]], card_memory: int
) -> None:
    try:
        got = resources.parse_pod(pod(*ctrs))
    except errors.DecodeError:
        return
    assert within(got), got
    # and its shape is one the learned workload admits
    assert shapes.admissible(shares.shape_of(shares.demand(got, card_memory)))


def test_link_counts_and_pair_scores_past_any_card_are_refused() -> None:

    def annotation(links: int) -> str:
        return json.dumps(
            {
                "v": 1,
                "uuids": ["a", "b"],
                "nvlink": [[0, links], [links, 0]],
                "pcie": [[0, 40], [40, 0]],
                "p2p": [[1, 1], [1, 1]],
            }
        )

    assert (
        topology.decode_topology(annotation(limits.MAX_NVLINKS)).topology.pair_nvlinks(0, 1)
        == limits.MAX_NVLINKS
    )
    with pytest.raises(errors.DecodeError) as info:
        topology.decode_topology(annotation(limits.MAX_NVLINKS + 1))
    assert (info.value.annotation, info.value.field) == (keys.GPU_TOPOLOGY, "nvlink")
    ok = json.dumps([{"uuid": "a", "score": {"b": limits.MAX_PAIR_SCORE}}])
    assert topology.decode_pair_scores(ok) == {"a": {"b": limits.MAX_PAIR_SCORE}}
    with pytest.raises(errors.DecodeError) as info:
        topology.decode_pair_scores(json.dumps([{"uuid": "a", "score": {"b": 2**62}}]))
    assert (info.value.annotation, info.value.field) == (keys.NODE_PAIR_SCORE, "a")
