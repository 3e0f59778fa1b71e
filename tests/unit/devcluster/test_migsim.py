"""MIG in the stand-ins: the A100-40GB profile table, MIG fake nodes, and what ``Allocate`` records.

The runtime identity follows HAMi's ``annotateMigRuntimeInfo`` (device plugin ``server.go``):
every realised record gets ``migUUID``, ``gpuInstanceID`` and ``computeInstanceID`` together, so
the scheduler's decoder (HAMi's ``DecodeMigAllocations`` checks) accepts the value and sees each
record as realised.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

import msgspec
import pytest

from gpuslice.codec import keys, locks, mig_allocations, node_inventory, pod_devices, registrations
from gpuslice.kube import objects
from gpuslice.model import allocations, devices, mig
from gpuslice_dev import devcluster, migsim, nodesim
from gpuslice_dev.deviceplugin import allocator, inventory, responses
from gpuslice_dev.deviceplugin.v1beta1 import api_pb2
from tests.unit.kube import fakeapi

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def test_a100_40gb_table_is_the_mig_user_guides() -> None:
    by_name = {p.name: p for p in migsim.A100_40GB}
    assert {n: [(x.start, x.size) for x in p.placements] for n, p in by_name.items()} == {
        "1g.5gb": [(s, 1) for s in range(7)],
        "1g.10gb": [(0, 2), (2, 2), (4, 2), (6, 2)],
        "2g.10gb": [(0, 2), (2, 2), (4, 2)],
        "3g.20gb": [(0, 4), (4, 4)],
        "4g.20gb": [(0, 4)],
        "7g.40gb": [(0, 8)],
    }
    for p in migsim.A100_40GB:  # HAMi: ceil(SMs * 100 / full SMs), 14 SMs per compute slice, 98 in all
        assert p.cores == math.ceil(14 * p.slice_count * 100 / 98)
        assert math.ceil(p.memory_mib / 1024) == int(p.name.split(".")[1].removesuffix("gb"))
    assert [by_name[n].cores for n in ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")] == [
        15,
        29,
        43,
        58,
        100,
    ]
    assert mig.slices_of(migsim.A100_40GB) == migsim.A100_40GB_SLICES == 8
    assert migsim.instance_count(migsim.A100_40GB) == 7


def test_mixed_node_registers_mig_and_hami_core_cards() -> None:
    cards = nodesim.cards("mixed", count=3, memory_mib=40960, mig_cards={0, 2})
    assert [c.mode for c in cards] == ["mig", "hami-core", "mig"]
    assert [c.split_count for c in cards] == [7, 10, 7]
    assert cards[0].cores == 100 and cards[0].mig_profiles == migsim.A100_40GB
    assert cards[1].mig_profiles == ()
    # The registration round-trips through the scheduler's decoder, profiles included.
    back = registrations.decode_json(registrations.encode_json(cards))
    assert back == cards


def test_gpu_instance_ids_are_the_slice_tree_and_unique_per_placement() -> None:
    assert [migsim.gpu_instance_id(s, 1) for s in range(7)] == [7, 8, 9, 10, 11, 12, 13]
    assert migsim.gpu_instance_id(0, 8) == 0
    assert [migsim.gpu_instance_id(s, 4) for s in (0, 4)] == [1, 2]
    assert [migsim.gpu_instance_id(s, 2) for s in (0, 2, 4)] == [3, 4, 5]
    placements = {(x.start, x.size) for p in migsim.A100_40GB for x in p.placements}
    placements |= {(3, 3), (1, 2), (6, 4)}  # off the tree: still distinct
    ids = [migsim.gpu_instance_id(s, n) for s, n in placements]
    assert len(set(ids)) == len(ids) and min(ids) >= 0


def test_mig_uuids_are_nvidia_form_deterministic_and_distinct() -> None:
    a = migsim.mig_uuid("GPU-a", 0, 1)
    assert MIG_UUID.match(a)
    assert a == migsim.mig_uuid("GPU-a", 0, 1)
    assert (
        len(
            {
                a,
                migsim.mig_uuid("GPU-a", 1, 1),
                migsim.mig_uuid("GPU-b", 0, 1),
                migsim.mig_uuid("GPU-a", 0, 2),
            }
        )
        == 4
    )


def _records() -> list[mig_allocations.Record]:
    alloc = allocations.PodAllocation(
        node="n",
        containers=(
            (
                allocations.DeviceGrant("GPU-a", 4864, 15, mig=mig.Slice(6, 1, "1g.5gb")),
                allocations.DeviceGrant("GPU-a", 9984, 29, mig=mig.Slice(0, 2, "2g.10gb")),
            ),
            (allocations.DeviceGrant("GPU-b", 20096, 43, mig=mig.Slice(4, 4, "3g.20gb")),),
        ),
    )
    return mig_allocations.records_of(alloc)


def test_realise_fills_every_identity_and_the_scheduler_decodes_it() -> None:
    value = migsim.realised_value(mig_allocations.encode(_records()))
    assert value is not None
    got = mig_allocations.decode(value)  # HAMi's checks: all three or none
    assert all(r.realised and r.compute_instance == 0 for r in got)
    assert [r.gpu_instance for r in got] == [13, 3, 2]
    assert len({(r.gpu_uuid, r.gpu_instance) for r in got}) == 3
    assert [r.slice for r in got] == [r.slice for r in _records()]  # placements untouched
    raw = msgspec.json.decode(value)
    assert list(raw[0]) == [
        "containerIndex",
        "deviceIndex",
        "gpuUUID",
        "profile",
        "placement",
        "migUUID",
        "gpuInstanceID",
        "computeInstanceID",
    ]
    assert migsim.realised_value(value) is None  # already realised: nothing to write


def test_realise_only_the_served_containers_and_keeps_existing_identity() -> None:
    records = _records()
    first = migsim.realise(records, containers={1})
    assert [r.realised for r in first] == [False, False, True]
    again = migsim.realise([msgspec.structs.replace(first[2], gpu_instance=99)] + first[:2])
    assert again[0].gpu_instance == 99  # kept as the plugin recorded it
    assert all(r.realised for r in again)


def test_realise_uses_the_cards_slice_count() -> None:
    (r,) = [x for x in _records() if x.profile == "1g.5gb"]
    (done,) = migsim.realise([r], slices_of=lambda _u: 16)
    assert done.gpu_instance == 16 - 1 + 6


def _pod(annotations: dict[str, str]) -> objects.Pod:
    return msgspec.convert(
        {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "annotations": annotations}}, objects.Pod
    )


def _node(cards: tuple[devices.GpuDevice, ...]) -> objects.Node:
    ann = {
        keys.NODE_REGISTER: registrations.encode_json(cards),
        keys.NODE_HANDSHAKE: "Requesting_2026-01-01 00:00:00",
    }
    return msgspec.convert({"metadata": {"name": "n", "annotations": ann}}, objects.Node)


def test_nodesim_answers_mig_records_from_the_nodes_registration() -> None:
    cards = nodesim.cards("n", count=2, memory_mib=40960, mig_cards={0, 1})
    node = _node(cards)
    assert len(node_inventory.decode_node("n", node.metadata.annotations).devices) == 2
    alloc = allocations.PodAllocation(
        node="n",
        containers=((allocations.DeviceGrant(cards[1].uuid, 4864, 15, mig=mig.Slice(5, 1, "1g.5gb")),),),
    )
    value = nodesim.mig_runtime(_pod({keys.MIG_ALLOCATIONS: mig_allocations.encode_allocation(alloc)}), node)
    assert value is not None
    (r,) = mig_allocations.decode(value)
    assert (r.mig_uuid, r.gpu_instance, r.compute_instance) == (migsim.mig_uuid(cards[1].uuid, 5, 1), 12, 0)
    assert nodesim.mig_runtime(_pod({}), node) is None
    with pytest.raises(ValueError, match="MIG"):
        nodesim.mig_runtime(_pod({keys.MIG_ALLOCATIONS: "[{]"}), node)


# ----- the gRPC device plugin's Allocate

NODE = "gpu-node-1"


def _inventory(cards: tuple[devices.GpuDevice, ...]) -> inventory.Inventory:
    return inventory.Inventory(
        cards=tuple(inventory.Card(uuid=c.uuid, index=c.index, numa=0, registered=c) for c in cards)
    )


def _api_pod(alloc: allocations.PodAllocation) -> dict[str, Any]:
    now = 1_800_000_000.0
    ann = {
        **pod_devices.bind_annotations(alloc, now),
        keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING,
        keys.VGPU_NODE: NODE,
    }
    return {
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "5", "annotations": ann},
        "spec": {"nodeName": NODE, "containers": [{"name": "c0"}, {"name": "c1"}]},
        "status": {"phase": "Pending"},
    }


async def test_grpc_allocate_realises_each_containers_instances_in_its_patch(tmp_path: Any) -> None:
    cards = nodesim.cards(NODE, count=2, memory_mib=40960, mig_cards={0})
    alloc = allocations.PodAllocation(
        node=NODE,
        containers=(
            (
                allocations.DeviceGrant(cards[0].uuid, 4864, 15, mig=mig.Slice(6, 1, "1g.5gb")),
                allocations.DeviceGrant(cards[0].uuid, 9984, 29, mig=mig.Slice(0, 2, "2g.10gb")),
            ),
            (allocations.DeviceGrant(cards[1].uuid, 1000, 10),),
        ),
    )
    pod = _api_pod(alloc)
    lock = locks.encode(1_800_000_000.0, "ns", "p")
    patches: list[dict[str, Any]] = []

    def handle(req: fakeapi.Request) -> fakeapi.Reply:
        if req.path == f"/api/v1/nodes/{NODE}":
            if req.method == "PATCH":
                return fakeapi.Reply(200, fakeapi.node(NODE, "2"))
            return fakeapi.Reply(200, fakeapi.node(NODE, "1", {keys.NODE_LOCK: lock}))
        if req.path == "/api/v1/namespaces/ns/pods/p":
            if req.method == "PATCH":
                body = req.json()
                patches.append(body)
                pod["metadata"]["annotations"].update(body["metadata"]["annotations"])
                pod["metadata"]["resourceVersion"] = str(int(pod["metadata"]["resourceVersion"]) + 1)
            return fakeapi.Reply(200, pod)
        return fakeapi.error(404, "NotFound")

    paths = responses.Paths(hami_dir=str(tmp_path / "vgpu"), dev_dir=str(tmp_path / "dev"))
    async with fakeapi.serving(handle) as (_api, kube):
        alloc_ = allocator.Allocator(
            kube, allocator.Settings(node=NODE, paths=paths), lambda: _inventory(cards), new_id=lambda: "id"
        )
        first = await alloc_.allocate(
            api_pb2.AllocateRequest(
                container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=[f"{cards[0].uuid}-0", f"{cards[0].uuid}-1"])
                ]
            )
        )
        records = mig_allocations.decode(patches[0]["metadata"]["annotations"][keys.MIG_ALLOCATIONS])
        assert all(r.realised for r in records) and [r.gpu_instance for r in records] == [13, 3]
        assert keys.BIND_PHASE not in patches[0]["metadata"]["annotations"]  # the second container waits
        (answer,) = first.container_responses
        assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(r.mig_uuid for r in records)
        assert "CUDA_DEVICE_MEMORY_LIMIT_0" not in answer.envs and not list(answer.mounts)
        second = await alloc_.allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{cards[1].uuid}-0"])]
            )
        )
    assert keys.MIG_ALLOCATIONS not in patches[1]["metadata"]["annotations"]  # nothing new to record
    assert patches[1]["metadata"]["annotations"][keys.BIND_PHASE] == keys.BIND_PHASE_SUCCESS
    assert second.container_responses[0].envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"


async def test_grpc_allocate_fails_a_mig_card_without_a_record(tmp_path: Any) -> None:
    cards = nodesim.cards(NODE, count=1, memory_mib=40960, mig_cards={0})
    pod = _api_pod(
        allocations.PodAllocation(
            node=NODE, containers=((allocations.DeviceGrant(cards[0].uuid, 4864, 15),),)
        )
    )
    assert keys.MIG_ALLOCATIONS not in pod["metadata"]["annotations"]
    lock = locks.encode(1_800_000_000.0, "ns", "p")
    patches: list[dict[str, Any]] = []

    def handle(req: fakeapi.Request) -> fakeapi.Reply:
        if req.path == f"/api/v1/nodes/{NODE}":
            return fakeapi.Reply(200, fakeapi.node(NODE, "1", {keys.NODE_LOCK: lock}))
        if req.path == "/api/v1/namespaces/ns/pods/p":
            if req.method == "PATCH":
                patches.append(req.json())
            return fakeapi.Reply(200, pod)
        return fakeapi.error(404, "NotFound")

    paths = responses.Paths(hami_dir=str(tmp_path / "vgpu"), dev_dir=str(tmp_path / "dev"))
    async with fakeapi.serving(handle) as (_api, kube):
        alloc_ = allocator.Allocator(
            kube, allocator.Settings(node=NODE, paths=paths), lambda: _inventory(cards)
        )
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{cards[0].uuid}-0"])]
        )
        with pytest.raises(allocator.AllocateError, match=allocator.NO_MIG_RECORD):
            await alloc_.allocate(request)
    assert [p["metadata"]["annotations"] for p in patches] == [{keys.BIND_PHASE: keys.BIND_PHASE_FAILED}]


def test_dev_cluster_flag_puts_the_first_cards_in_mig_mode() -> None:
    parser = argparse.ArgumentParser()
    devcluster.add_arguments(parser)
    args = parser.parse_args(["--mig-cards", "2", "--gpus", "4"])
    assert args.mig_cards == 2 and parser.parse_args([]).mig_cards == 0
    cards = nodesim.cards("n", count=args.gpus, mig_cards=set(range(args.mig_cards)))
    assert [c.mode for c in cards] == ["mig", "mig", "hami-core", "hami-core"]
