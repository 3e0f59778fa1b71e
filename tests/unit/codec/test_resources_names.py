"""Renamed GPU resources end to end in the codec, quota keys and the ``nvidia.com/cores`` alias."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.codec import errors, resources
from gpuslice.model import config, requests

pytestmark = pytest.mark.unit

UNSET = requests.MEMORY_PERCENTAGE_UNSET
VGPU, VMEM, VPCT, VCORES, VPRIO = (
    "example.com/vgpu",
    "example.com/vmem",
    "example.com/vmem-percentage",
    "example.com/vcores",
    "example.com/vprio",
)
RENAMED = config.ResourceNames(count=VGPU, memory=VMEM, memory_percentage=VPCT, cores=VCORES, priority=VPRIO)
CFG = config.RequestConfig(names=RENAMED)


def req(count: int, memory: int = 0, pct: int = UNSET, cores: int = 0) -> requests.ContainerRequest:
    return requests.ContainerRequest(count=count, memory_mib=memory, memory_percentage=pct, cores=cores)


def pod(*limits: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "containers": [{"name": f"c{i}", "resources": {"limits": lim}} for i, lim in enumerate(limits)]
        },
    }


@pytest.mark.parametrize(
    ("limits", "want"),
    [
        ({VGPU: "1", VMEM: "3000"}, req(1, memory=3000)),
        ({VGPU: "1"}, req(1, pct=100, cores=100)),  # a bare renamed card is exclusive
        ({VMEM: "3000"}, req(1, memory=3000)),  # the default count under the renamed name
        ({VGPU: "2", VPCT: "50", VCORES: "20"}, req(2, pct=50, cores=20)),
        ({VGPU: "1", VPCT: "0"}, req(1, pct=100)),  # the renamed percentage's 0 is unset too
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}, None),  # the old names mean nothing
        ({VGPU: "1", "nvidia.com/gpucores": "10"}, req(1, pct=100, cores=100)),
    ],
    ids=["count-and-memory", "bare", "memory-only", "share", "pct-0", "old-names", "old-cores-ignored"],
)
def test_renamed_resources_parse(limits: dict[str, str], want: requests.ContainerRequest | None) -> None:
    assert resources.parse_pod(pod(limits), CFG).containers == (want,)


def test_renamed_percentage_out_of_range_names_the_renamed_resource() -> None:
    with pytest.raises(errors.DecodeError) as caught:
        resources.parse_pod(pod({VGPU: "1"}, {VGPU: "1", VPCT: "150"}), CFG)
    assert (caught.value.annotation, caught.value.field) == (VPCT, "spec.containers[1]")
    # The default name is an ordinary resource now: no check, no effect.
    got = resources.parse_pod(pod({VGPU: "1", "nvidia.com/gpumem-percentage": "150"}), CFG)
    assert got.containers == (req(1, pct=100, cores=100),)


def test_webhook_limits_add_the_renamed_count() -> None:
    assert resources.webhook_limits({VCORES: "30"}, CFG) == {VCORES: "30", VGPU: "1"}
    assert resources.webhook_limits({"nvidia.com/gpucores": "30"}, CFG) == {"nvidia.com/gpucores": "30"}


# ----------------------------------------------------------------------------- quotas


def test_quota_keys_follow_the_configured_names() -> None:
    hard = {f"requests.{VGPU}": "4", f"limits.{VMEM}": "20000", VCORES: "150", "nvidia.com/gpu": "1"}
    q = resources.parse_quota(hard, config.RequestConfig(names=RENAMED, memory_factor=2))
    assert (q.count, q.memory_mib, q.cores) == (4, 40000, 150)
    # The default names (and the alias: cores are renamed) limit nothing here.
    other = {"nvidia.com/gpu": "1", "limits.nvidia.com/gpumem": "1", "nvidia.com/cores": "1"}
    assert resources.parse_quota(other, CFG).unlimited


@pytest.mark.parametrize(
    ("hard", "cores"),
    [
        ({"nvidia.com/cores": "200"}, 200),
        ({"requests.nvidia.com/cores": "200"}, 200),
        ({"limits.nvidia.com/cores": "200"}, 200),
        ({"nvidia.com/cores": "200", "limits.nvidia.com/gpucores": "150"}, 150),  # smallest wins
        ({"limits.nvidia.com/cores": "90", "nvidia.com/gpucores": "150"}, 90),
        ({"requests.nvidia.com/cores": "300", "requests.nvidia.com/gpucores": "300"}, 300),
    ],
)
def test_nvidia_cores_is_an_alias_of_the_default_cores_resource(hard: dict[str, str], cores: int) -> None:
    q = resources.parse_quota(hard)
    assert (q.count, q.memory_mib, q.cores) == (None, None, cores)


def test_the_alias_follows_only_the_default_cores_name() -> None:
    hard = {"nvidia.com/cores": "50", "example.com/vcores": "80"}
    # Another resource renamed, cores kept: the alias still reads.
    only_count = config.RequestConfig(names=config.ResourceNames(count=VGPU))
    assert resources.parse_quota(hard, only_count).cores == 50
    # Cores renamed: only the configured name.
    only_cores = config.RequestConfig(names=config.ResourceNames(cores=VCORES))
    assert resources.parse_quota(hard, only_cores).cores == 80
    # A configured resource named nvidia.com/cores is that resource, never the cores alias.
    taken = config.RequestConfig(names=config.ResourceNames(memory="nvidia.com/cores"))
    q = resources.parse_quota({"nvidia.com/cores": "50"}, taken)
    assert (q.memory_mib, q.cores) == (50, None)


def test_bad_alias_quantity_is_a_decode_error() -> None:
    with pytest.raises(errors.DecodeError):
        resources.parse_quota({"limits.nvidia.com/cores": "lots"})


# ----------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    "name",
    [
        "nvidia.com/gpu",
        "example.com/vgpu",
        "a/b",
        "hami.io/x_y.z-1",
        "sub.domain.example.com/" + "x" * 63,
        "d" * 244 + "/x",
    ],
)
def test_valid_extended_resource_names(name: str) -> None:
    assert config.extended_resource_problem(name) is None


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("gpu", "domain prefix"),
        ("", "domain prefix"),
        ("kubernetes.io/gpu", "reserved for native"),
        ("foo.kubernetes.io/gpu", "reserved for native"),
        ("requests.example.com/gpu", "requests."),
        ("Example.com/gpu", "DNS subdomain"),
        ("example..com/gpu", "DNS subdomain"),
        ("/gpu", "DNS subdomain"),
        ("d" * 245 + "/x", "DNS subdomain"),
        ("example.com/", "name after /"),
        ("example.com/-gpu", "name after /"),
        ("example.com/" + "x" * 64, "name after /"),
        ("example.com/a/b", "name after /"),
        ("example.com/g pu", "name after /"),
    ],
)
def test_invalid_extended_resource_names(name: str, fragment: str) -> None:
    problem = config.extended_resource_problem(name)
    assert problem is not None and fragment in problem


def test_resource_name_problems_name_each_setting_and_duplicates() -> None:
    assert config.resource_name_problems(config.ResourceNames()) == []
    assert config.resource_name_problems(RENAMED) == []
    got = config.resource_name_problems(config.ResourceNames(count="gpu", cores="nvidia.com/gpumem"))
    assert got == [
        "resource_count_name: 'gpu' is not an extended-resource name: needs a domain prefix such as "
        "example.com/ (a name without one is a native resource)",
        "resource_memory_name and resource_core_name must differ, got 'nvidia.com/gpumem' for each",
    ]


def test_names_from_settings() -> None:
    assert config.resource_names({}) == config.ResourceNames()
    assert config.resource_names({"resource_count_name": VGPU, "other": "x"}) == config.ResourceNames(
        count=VGPU
    )
    assert RENAMED.all() == (VGPU, VMEM, VPCT, VCORES, VPRIO)
    assert set(config.NAME_SETTINGS.values()) == set(config.ResourceNames.__struct_fields__)
