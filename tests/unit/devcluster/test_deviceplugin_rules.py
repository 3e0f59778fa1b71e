"""The device plugin's pure rules: replica lists, annotation entries, HAMi's answer, preferences."""

from __future__ import annotations

import pytest

from gpuslice.agent import collect, discover, fake
from gpuslice.model import allocations
from gpuslice_dev.deviceplugin import entries, inventory, podview, preferred, responses

pytestmark = pytest.mark.unit

A = "GPU-00000000-0000-0000-0000-00000000000a"
B = "GPU-00000000-0000-0000-0000-00000000000b"


def shape_inventory(name: str, health: dict[int, bool] | None = None, split: int = 10) -> inventory.Inventory:
    backend = fake.FakeBackend(fake.shape(name))
    return inventory.build(collect.inventory(backend), discover.RegistrationConfig(split_count=split), health)


# ----- ListAndWatch


def test_every_card_is_split_count_replicas_with_numa() -> None:
    inv = shape_inventory("a100-8-2numa", split=3)
    devices = inventory.kubelet_devices(inv, 3)
    # 8 cards x 3 replicas, in card order, IDs <UUID>-<i>
    assert len(devices) == 24
    first = inv.cards[0]
    assert [d.ID for d in devices[:3]] == [f"{first.uuid}-0", f"{first.uuid}-1", f"{first.uuid}-2"]
    assert {d.health for d in devices} == {"Healthy"}
    # a100-8-2numa: cards 0-3 on NUMA 0, 4-7 on NUMA 1
    assert [d.topology.nodes[0].ID for d in devices[::3]] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_numa_is_left_out_when_unknown_or_switched_off() -> None:
    t4 = shape_inventory("t4-4")  # the VM shape: sysfs says -1
    assert all(not d.HasField("topology") for d in inventory.kubelet_devices(t4, 2))
    a100 = shape_inventory("a100-8-2numa")
    assert all(not d.HasField("topology") for d in inventory.kubelet_devices(a100, 2, numa_topology=False))


def test_an_unhealthy_card_marks_all_its_replicas_and_its_registration() -> None:
    inv = shape_inventory("a40-2", health={1: False}, split=2)
    devices = inventory.kubelet_devices(inv, 2)
    assert [d.health for d in devices] == ["Healthy", "Healthy", "Unhealthy", "Unhealthy"]
    assert '"health":true' in inv.registration() and inv.registration().count('"health":true') == 1


def test_registration_is_hamis_json() -> None:
    inv = shape_inventory("a40-2", split=4)
    value = inv.registration()
    assert value.startswith('[{"id":"GPU-') and '"count":4' in value and '"type":"NVIDIA A40"' in value
    assert '"devmem":46068' in value and '"devcore":100' in value and '"mode":"hami-core"' in value


@pytest.mark.parametrize(
    ("device_id", "card"),
    [
        (f"{A}-0", A),
        (f"{A}-12", A),
        (A, A),
        (f"{A}::3", A),
        ("MIG-1234", "MIG-1234"),
        (f"{A}-x", f"{A}-x"),
    ],
    ids=["replica", "two-digit", "card", "annotated", "other", "not-a-number"],
)
def test_physical_id(device_id: str, card: str) -> None:
    assert inventory.physical_id(device_id) == card


# ----- vgpu-devices-to-allocate


def test_entries_are_taken_in_order_and_blanked_in_place() -> None:
    value = f";{A},NVIDIA,3000,30:{B},NVIDIA,3000,30:;;{A},NVIDIA,1000,0:;"
    first = entries.pop_next(value)
    assert first is not None and first.position == 1
    assert [g.uuid for g in first.grants] == [A, B] and first.grants[0].memory_mib == 3000
    assert first.remaining == f";;;{A},NVIDIA,1000,0:;"
    second = entries.pop_next(first.remaining)
    assert second is not None and second.position == 3 and second.remaining == ";;;;"
    assert entries.pop_next(second.remaining) is None
    assert entries.has_pending(first.remaining) and not entries.has_pending(second.remaining)


def test_a_malformed_entry_is_an_error() -> None:
    with pytest.raises(ValueError):
        entries.pop_next(f"{A},NVIDIA,lots,0:;")


# ----- HAMi's answer

PATHS = responses.Paths(hami_dir="/h/vgpu", dev_dir="/d", lock_dir="/h/lock", hook_path="/usr/local")


def container(*grants: tuple[str, int, int], disabled: bool = False) -> responses.Container:
    return responses.Container(
        pod_uid="uid-1",
        name="main",
        grants=tuple(allocations.DeviceGrant(uuid=u, memory_mib=m, cores=c) for u, m, c in grants),
        control_disabled=disabled,
    )


def test_envs_follow_hami() -> None:
    c = container((A, 3000, 30), (B, 5000, 40))
    env = responses.envs(c, responses.Options(), PATHS, "cache-id")
    assert env == {
        "NVIDIA_VISIBLE_DEVICES": f"{A},{B}",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "5000m",
        "CUDA_DEVICE_SM_LIMIT": "30",  # the first card's cores
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/cache-id.cache",
        "LIBCUDA_LOG_LEVEL": "1",
    }
    scaled = responses.envs(
        c, responses.Options(memory_scaling=2, libcuda_log_level="", disable_core_limit=True), PATHS, "x"
    )
    assert scaled["CUDA_OVERSUBSCRIBE"] == "true" and "LIBCUDA_LOG_LEVEL" not in scaled
    assert scaled["GPU_CORE_UTILIZATION_POLICY"] == "disable"


def test_mounts_follow_hami() -> None:
    mounts = responses.mounts(container((A, 1, 1)), PATHS, lambda p: False)
    assert [(m.container_path, m.host_path, m.read_only) for m in mounts] == [
        ("/usr/local/vgpu/libvgpu.so", "/h/vgpu/libvgpu.so", True),
        ("/usr/local/vgpu", "/h/vgpu/containers/uid-1_main", False),
        ("/tmp/vgpulock", "/h/lock", False),
        ("/etc/ld.so.preload", "/h/vgpu/ld.so.preload", True),
    ]
    disabled = responses.mounts(container((A, 1, 1), disabled=True), PATHS, lambda p: False)
    assert "/etc/ld.so.preload" not in [m.container_path for m in disabled]
    licensed = responses.mounts(container((A, 1, 1)), PATHS, lambda p: p == "/h/vgpu/license")
    assert [m.container_path for m in licensed][-2:] == ["/tmp/license", "/usr/bin/vgpuvalidator"]


def test_device_specs_are_the_present_control_nodes_then_one_per_card() -> None:
    present = {"/d/nvidiactl", "/d/nvidia-uvm"}
    specs = responses.device_specs(container((B, 1, 1), (A, 1, 1)), {A: 0, B: 3}, PATHS, present.__contains__)
    assert [(s.container_path, s.host_path, s.permissions) for s in specs] == [
        ("/dev/nvidiactl", "/d/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", "/d/nvidia-uvm", "rw"),
        ("/dev/nvidia3", "/d/nvidia3", "rw"),
        ("/dev/nvidia0", "/d/nvidia0", "rw"),
    ]
    none = responses.container_response(
        container((A, 1, 1)), responses.Options(pass_device_specs=False), PATHS, {A: 0}, "id", lambda p: True
    )
    assert len(none.devices) == 0 and none.envs["NVIDIA_VISIBLE_DEVICES"] == A


@pytest.mark.parametrize(
    ("value", "disabled"),
    [("true", True), ("1", True), ("True", True), ("false", False), ("yes", False), ("", False)],
)
def test_cuda_disable_control_is_go_parse_bool(value: str, disabled: bool) -> None:
    c = podview.Container(name="c", env=(podview.EnvVar(name="CUDA_DISABLE_CONTROL", value=value),))
    assert podview.control_disabled(c) is disabled


def test_containers_are_init_first() -> None:
    pod = podview.Pod(
        spec=podview.Spec(
            init_containers=(podview.Container(name="i0"),),
            containers=(podview.Container(name="c0"), podview.Container(name="c1")),
        )
    )
    found = [podview.container_at(pod, i) for i in range(4)]
    assert [c.name if c else None for c in found] == ["i0", "c0", "c1", None]


# ----- GetPreferredAllocation

ORDER = {A: 0, B: 1}


def grants(*uuids: str) -> allocations.ContainerAllocation:
    return tuple(allocations.DeviceGrant(uuid=u, memory_mib=1, cores=1) for u in uuids)


def test_preferred_takes_replicas_of_the_annotated_cards() -> None:
    available = [f"{A}-0", f"{A}-1", f"{B}-0", f"{B}-1"]
    assert preferred.choose(available, [], 1, grants(B), ORDER) == [f"{B}-0"]
    assert preferred.choose(available, [], 2, grants(B, A), ORDER) == [f"{B}-0", f"{A}-0"]
    # kubelet's must-include counts for the card it belongs to
    assert preferred.choose(available, [f"{A}-1"], 2, grants(A, B), ORDER) == [f"{A}-1", f"{B}-0"]


def test_preferred_without_annotation_spreads_over_cards() -> None:
    available = [f"{B}-1", f"{A}-0", f"{B}-0", f"{A}-1"]
    assert preferred.choose(available, [], 2, None, ORDER) == [f"{A}-0", f"{B}-0"]
    assert preferred.choose(available, [f"{A}-1"], 2, None, ORDER) == [f"{A}-1", f"{B}-0"]
    # more than the cards: second replicas come last
    assert preferred.choose(available, [], 3, None, ORDER) == [f"{A}-0", f"{B}-0", f"{A}-1"]


def test_preferred_falls_back_when_the_annotation_cannot_be_served() -> None:
    available = [f"{A}-0", f"{A}-1"]
    # the annotated card has no free replica: HAMi would not answer; gpuslice spreads instead
    assert preferred.choose(available, [], 1, grants(B), ORDER) == [f"{A}-0"]
    with pytest.raises(preferred.NoPreference):
        preferred.from_annotation(available, [], grants(B), 1)
    with pytest.raises(preferred.NoPreference):
        preferred.from_annotation(available, [], grants(A), 2)
