"""parse_pod / generate_request / parse_quota, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.codec import errors, keys, pod_selectors, resources
from gpuslice.model import config, requests

pytestmark = pytest.mark.unit

UNSET = requests.MEMORY_PERCENTAGE_UNSET
GPU, MEM, PCT, CORES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
)
NO_WEBHOOK = config.RequestConfig(exclusive_whole_card=False)


def ctr(limits: dict[str, Any] | None = None, requests_: dict[str, Any] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if limits is not None:
        res["limits"] = limits
    if requests_ is not None:
        res["requests"] = requests_
    return {"name": "c", "resources": res}


def pod(
    *containers: dict[str, Any],
    init: tuple[dict[str, Any], ...] = (),
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": "u-1"}
    if annotations is not None:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"metadata": meta, "spec": spec}


def req(count: int, memory: int = 0, pct: int = UNSET, cores: int = 0) -> requests.ContainerRequest:
    return requests.ContainerRequest(count=count, memory_mib=memory, memory_percentage=pct, cores=cores)


CONTAINER_CASES = [
    # (id, container, config, expected request)
    ("whole-card", ctr({GPU: "1"}), None, req(1, pct=100, cores=100)),
    ("whole-card-int-from-yaml", ctr({GPU: 2}), None, req(2, pct=100, cores=100)),
    ("whole-card-no-webhook", ctr({GPU: "1"}), NO_WEBHOOK, req(1, pct=100)),
    ("gpumem", ctr({GPU: "1", MEM: "3000"}), None, req(1, memory=3000)),
    ("gpumem-only-gets-default-count", ctr({MEM: "3000"}), None, req(1, memory=3000)),
    ("gpumem-only-no-webhook", ctr({MEM: "3000"}), NO_WEBHOOK, None),
    ("percentage", ctr({GPU: "1", PCT: "50"}), None, req(1, pct=50)),
    ("percentage-100-is-whole-card", ctr({GPU: "1", PCT: "100"}), None, req(1, pct=100, cores=100)),
    ("percentage-only", ctr({PCT: "25"}), None, req(1, pct=25)),
    ("cores", ctr({GPU: "1", CORES: "30"}), None, req(1, pct=100, cores=30)),
    ("cores-only", ctr({CORES: "30"}), None, req(1, pct=100, cores=30)),
    ("explicit-zero-cores-shares", ctr({GPU: "1", CORES: "0"}), None, req(1, pct=100, cores=0)),
    ("gpumem-and-cores", ctr({GPU: "2", MEM: "4000", CORES: "25"}), None, req(2, memory=4000, cores=25)),
    ("requests-only", ctr(None, {GPU: "1", MEM: "2000"}), None, req(1, memory=2000)),
    ("limits-win", ctr({GPU: "1", MEM: "1000"}, {GPU: "1", MEM: "2000"}), None, req(1, memory=1000)),
    # gpumem is MiB; a binary suffix is just a number: 1Gi = 2^30 = 1073741824 (still < MaxInt32).
    ("quantity-1Gi", ctr({GPU: "1", MEM: "1Gi"}), None, req(1, memory=1073741824)),
    ("quantity-2e3", ctr({GPU: "1", MEM: "2e3"}), None, req(1, memory=2000)),
    ("quantity-2k", ctr({GPU: "1", MEM: "2k"}), None, req(1, memory=2000)),
    # (a count or gpumem that is no integer, e.g. 500m = 0.5, is refused: test_request_bounds.py)
    ("count-zero", ctr({GPU: "0"}), None, None),
    ("no-gpu", ctr({"cpu": "1"}), None, None),
    ("no-resources", {"name": "c"}, None, None),
    (
        "memory-factor-and-default-memory",
        ctr({GPU: "1", MEM: "1000"}),
        config.RequestConfig(memory_factor=4),
        req(1, memory=4000),
    ),
    # default_memory 512 applies; memory is then not whole-card, so no 100 cores.
    ("default-memory", ctr({GPU: "1"}), config.RequestConfig(default_memory=512), req(1, memory=512)),
    (
        "default-cores-overridden",
        ctr({GPU: "1"}),
        config.RequestConfig(default_cores=20),
        req(1, pct=100, cores=100),
    ),
    (
        "default-cores",
        ctr({GPU: "1", MEM: "100"}),
        config.RequestConfig(default_cores=20),
        req(1, memory=100, cores=20),
    ),
]


@pytest.mark.parametrize(
    ("container", "cfg", "want"), [c[1:] for c in CONTAINER_CASES], ids=[c[0] for c in CONTAINER_CASES]
)
def test_container_request(
    container: dict[str, Any], cfg: config.RequestConfig | None, want: requests.ContainerRequest | None
) -> None:
    got = resources.parse_pod(pod(container), cfg or config.DEFAULT_REQUEST_CONFIG)
    assert got.containers == (want,)


def test_multi_container_and_init_containers_keep_order() -> None:
    p = pod(
        ctr({GPU: "1", MEM: "1000"}),
        ctr({"cpu": "1"}),
        ctr({GPU: "2", PCT: "50"}),
        init=(ctr({GPU: "1", MEM: "500"}), ctr()),
    )
    got = resources.parse_pod(p)
    assert got.init_count == 2
    assert got.containers == (req(1, memory=500), None, req(1, memory=1000), None, req(2, pct=50))
    assert got.app_containers == (req(1, memory=1000), None, req(2, pct=50))
    assert (got.namespace, got.name, got.uid) == ("ns", "p", "u-1")
    assert got.wants_gpu and got.max_count == 2


def test_host_resources_are_max_of_init_and_app_sum() -> None:
    p = pod(
        ctr({"cpu": "1", "memory": "1Gi"}),
        ctr(None, {"cpu": "500m", "memory": "512Mi"}),
        init=(ctr({"cpu": "2", "memory": "100Mi"}),),
    )
    got = resources.parse_pod(p)
    assert got.cpu_milli == 2000  # max(init 2000, app 1000 + 500)
    assert got.memory_mib == 1536  # max(init 100, app 1024 + 512)


def test_metadata_defaults() -> None:
    got = resources.parse_pod({"spec": {"containers": [ctr({GPU: "1"})]}})
    assert (got.namespace, got.name, got.uid) == ("default", "", "")


SELECTOR_CASES = [
    ("none", {}, requests.Selectors()),
    ("hami-type", {keys.USE_GPU_TYPE: "A100,V100"}, requests.Selectors(use_types=("A100", "V100"))),
    ("alias-type", {keys.GPU_TYPE: "H100"}, requests.Selectors(use_types=("H100",))),
    (
        "both-type-sets-merged",
        {keys.USE_GPU_TYPE: "A100, V100,", keys.GPU_TYPE: "V100,H100"},
        requests.Selectors(use_types=("A100", "V100", "H100")),
    ),
    ("nouse-type", {keys.NOUSE_GPU_TYPE: "T4"}, requests.Selectors(nouse_types=("T4",))),
    (
        "uuids-both-sets",
        {
            keys.USE_GPU_UUID: "GPU-a",
            keys.GPU_UUID_INCLUDE: "GPU-b",
            keys.NOUSE_GPU_UUID: "GPU-c",
            keys.GPU_UUID_EXCLUDE: "GPU-d,GPU-c",
        },
        requests.Selectors(use_uuids=("GPU-a", "GPU-b"), nouse_uuids=("GPU-c", "GPU-d")),
    ),
    ("numa-bind-true", {keys.NUMA_BIND: "true"}, requests.Selectors(numa_bind=True)),
    ("numa-bind-go-bool", {keys.NUMA_BIND: "1"}, requests.Selectors(numa_bind=True)),
    ("numa-bind-garbage-is-false", {keys.NUMA_BIND: "yes"}, requests.Selectors()),
    ("numa-hint", {keys.NUMA_HINT: "1"}, requests.Selectors(numa_node=1)),
    ("numa-hint-empty", {keys.NUMA_HINT: " "}, requests.Selectors()),
    ("mode", {keys.VGPU_MODE: "hami-core"}, requests.Selectors(mode="hami-core")),
    ("empty-values", {keys.USE_GPU_TYPE: "", keys.VGPU_MODE: ""}, requests.Selectors()),
]


@pytest.mark.parametrize(
    ("annotations", "want"), [c[1:] for c in SELECTOR_CASES], ids=[c[0] for c in SELECTOR_CASES]
)
def test_selectors(annotations: dict[str, str], want: requests.Selectors) -> None:
    assert resources.parse_pod(pod(ctr({GPU: "1"}), annotations=annotations)).selectors == want


def test_policy_overrides() -> None:
    got = resources.parse_pod(
        pod(
            ctr(),
            annotations={keys.NODE_SCHEDULER_POLICY: "spread", keys.GPU_SCHEDULER_POLICY: "binpack,numa"},
        )
    )
    assert (got.node_policy, got.card_policy) == ("spread", "binpack,numa")
    plain = resources.parse_pod(pod(ctr()))
    assert (plain.node_policy, plain.card_policy) == (None, None)


@pytest.mark.parametrize("hint", ["abc", "-1", "1.5", "0x1", "1 2"])
def test_bad_numa_hint_names_the_annotation(hint: str) -> None:
    with pytest.raises(errors.DecodeError) as info:
        resources.parse_pod(pod(ctr({GPU: "1"}), annotations={keys.NUMA_HINT: hint}))
    assert info.value.annotation == keys.NUMA_HINT


@pytest.mark.parametrize(
    ("limits", "resource"),
    [
        ({GPU: "one"}, GPU),
        ({GPU: "1", MEM: "1 Gi"}, MEM),
        ({GPU: "1", CORES: True}, CORES),
        ({"cpu": "x"}, "cpu"),
    ],
    ids=["count-word", "gpumem-space", "cores-bool", "cpu-garbage"],
)
def test_garbage_quantity_names_the_resource(limits: dict[str, Any], resource: str) -> None:
    with pytest.raises(errors.DecodeError) as info:
        resources.parse_pod(pod(ctr(limits)))
    assert info.value.annotation == resource


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"metadata": "x"}, "metadata"),
        ({"spec": {"containers": {}}}, "spec.containers"),
        ({"spec": {"containers": [1]}}, "spec.containers[0]"),
        ({"spec": {"containers": [{"resources": []}]}}, "spec.containers[0].resources"),
    ],
    ids=["metadata", "containers-not-list", "container-not-object", "resources-not-object"],
)
def test_malformed_pod_structure(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(errors.DecodeError) as info:
        resources.parse_pod(bad)
    assert (info.value.annotation, info.value.field) == ("pod", field)


def test_non_string_annotation_names_its_key() -> None:
    with pytest.raises(errors.DecodeError) as info:
        resources.parse_pod({"metadata": {"annotations": {keys.NUMA_HINT: 1}}})
    assert info.value.annotation == keys.NUMA_HINT


QUOTA_CASES = [
    ("empty", {}, 1, resources.QuotaLimits()),
    ("limits-gpumem", {"limits.nvidia.com/gpumem": "10000"}, 1, resources.QuotaLimits(memory_mib=10000)),
    (
        "smallest-form-wins",
        {"requests.nvidia.com/gpumem": "8000", "limits.nvidia.com/gpumem": "10000"},
        1,
        resources.QuotaLimits(memory_mib=8000),
    ),
    ("count-requests", {"requests.nvidia.com/gpu": "4"}, 1, resources.QuotaLimits(count=4)),
    ("count-bare", {"nvidia.com/gpu": "4", "cpu": "10"}, 1, resources.QuotaLimits(count=4)),
    ("cores", {"limits.nvidia.com/gpucores": "300"}, 1, resources.QuotaLimits(cores=300)),
    ("memory-factor", {"limits.nvidia.com/gpumem": "1000"}, 4, resources.QuotaLimits(memory_mib=4000)),
    ("zero-blocks", {"limits.nvidia.com/gpumem": "0"}, 1, resources.QuotaLimits(memory_mib=0)),
    ("1k", {"limits.nvidia.com/gpucores": "1k"}, 1, resources.QuotaLimits(cores=1000)),
]


@pytest.mark.parametrize(
    ("hard", "factor", "want"), [c[1:] for c in QUOTA_CASES], ids=[c[0] for c in QUOTA_CASES]
)
def test_parse_quota(hard: dict[str, str], factor: int, want: resources.QuotaLimits) -> None:
    got = resources.parse_quota(hard, config.RequestConfig(memory_factor=factor))
    assert got == want
    assert got.unlimited == (want == resources.QuotaLimits())


def test_parse_quota_garbage() -> None:
    with pytest.raises(errors.DecodeError) as info:
        resources.parse_quota({"limits.nvidia.com/gpumem": "lots"})
    assert info.value.annotation == "limits.nvidia.com/gpumem"


WEIGHT_CASES = [
    ("absent", {}, None),
    ("empty", {keys.DEVICE_SCORING_WEIGHTS: " "}, None),
    (
        "example",
        {keys.DEVICE_SCORING_WEIGHTS: "slot=1,core=1,memory=3"},
        pod_selectors.ScoringWeights(memory=3.0),
    ),
    (
        "any-order-spaces",
        {keys.DEVICE_SCORING_WEIGHTS: " memory = 5, slot=0 ,core=2"},
        pod_selectors.ScoringWeights(slot=0.0, core=2.0, memory=5.0),
    ),
]


@pytest.mark.parametrize(
    ("annotations", "want"), [c[1:] for c in WEIGHT_CASES], ids=[c[0] for c in WEIGHT_CASES]
)
def test_scoring_weights(annotations: dict[str, str], want: pod_selectors.ScoringWeights | None) -> None:
    assert pod_selectors.scoring_weights(annotations) == want


@pytest.mark.parametrize(
    "value",
    [
        "slot=1,core=1",
        "slot=1,core=1,memory=1,slot=2",
        "slot=1,core=1,mem=1",
        "slot=0,core=0,memory=0",
        "slot=-1,core=1,memory=1",
        "slot",
        "slot=1.5,core=1,memory=1",
        "slot=1,core=1,memory=",
        "slot=1,core=1,memory=+2",
    ],
    ids=[
        "missing-memory",
        "repeated",
        "unknown-key",
        "all-zero",
        "negative",
        "no-equals",
        "decimal",
        "empty",
        "sign",
    ],
)
def test_bad_scoring_weights(value: str) -> None:
    with pytest.raises(errors.DecodeError) as info:
        pod_selectors.scoring_weights({keys.DEVICE_SCORING_WEIGHTS: value})
    assert info.value.annotation == keys.DEVICE_SCORING_WEIGHTS
