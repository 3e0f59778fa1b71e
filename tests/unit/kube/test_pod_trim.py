"""Stored pods keep only the annotations gpuslice reads, however large the others are."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from gpuslice.codec import keys, pod_devices, resources
from gpuslice.kube import informer, kinds, objects
from gpuslice.model import allocations
from tests.unit.kube import fakeapi
from tests.unit.kube.fakeapi import Reply, Request

pytestmark = pytest.mark.unit

BIG_KEY = "kubectl.kubernetes.io/last-applied-configuration"
BIG = json.dumps({"spec": {"x": "y" * (200 * 1024)}})  # a 200 KB unrelated annotation

POD_KEYS = (  # every pod annotation gpuslice reads (codec.pod_selectors, codec.pod_devices, recovery)
    keys.VGPU_NODE,
    keys.VGPU_TIME,
    keys.DEVICES_TO_ALLOCATE,
    keys.DEVICES_ALLOCATED,
    keys.BIND_PHASE,
    keys.BIND_TIME,
    keys.USE_GPU_TYPE,
    keys.NOUSE_GPU_TYPE,
    keys.USE_GPU_UUID,
    keys.NOUSE_GPU_UUID,
    keys.NUMA_BIND,
    keys.VGPU_MODE,
    keys.NODE_SCHEDULER_POLICY,
    keys.GPU_SCHEDULER_POLICY,
    keys.GPU_TYPE,
    keys.GPU_UUID_INCLUDE,
    keys.GPU_UUID_EXCLUDE,
    keys.NUMA_HINT,
    keys.DEVICE_SCORING_WEIGHTS,
)


def _pod(name: str, rv: str) -> dict[str, Any]:
    grants = ((allocations.DeviceGrant("GPU-n1-0", 8000, 30),),)
    annotations = {
        BIG_KEY: BIG,
        "example.com/team": "ml",
        keys.VGPU_NODE: "n1",
        keys.VGPU_TIME: "1700000000",
        keys.BIND_PHASE: keys.BIND_PHASE_SUCCESS,
        keys.USE_GPU_TYPE: "A100",
        keys.GPU_SCHEDULER_POLICY: "binpack",
        **pod_devices.device_annotations(grants),
    }
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "30"}
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "annotations": annotations,
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": "Running"},
    }


def test_pod_annotations_hold_every_key_gpuslice_reads_from_pods() -> None:
    assert set(POD_KEYS) <= objects.POD_ANNOTATIONS
    assert all(k.startswith(objects.ANNOTATION_PREFIXES) for k in objects.POD_ANNOTATIONS)


def test_trim_pod_drops_only_unread_annotations() -> None:
    pod = objects.decode_pod(json.dumps(_pod("a", "1")).encode())
    trimmed = objects.trim_pod(pod)
    assert set(pod.metadata.annotations) - set(trimmed.metadata.annotations) == {BIG_KEY, "example.com/team"}
    assert trimmed.metadata.annotations == objects.gpu_annotations(pod.metadata.annotations)
    assert msgspec.structs.replace(trimmed, metadata=pod.metadata) == pod  # nothing else changed
    assert objects.trim_pod(trimmed) is trimmed  # nothing left to drop: no copy


def _allocation(annotations: dict[str, str]) -> allocations.PodAllocation | None:
    return pod_devices.allocation_from_annotations(annotations, init_count=0, container_count=1)


async def test_informer_stores_pods_trimmed_and_they_decode_the_same() -> None:
    listed, watched = _pod("listed", "5"), _pod("watched", "11")

    def handler(req: Request) -> Reply:
        if req.query.get("watch") == "true":
            return Reply(lines=[{"type": "ADDED", "object": watched}])
        return Reply(body={"kind": "PodList", "metadata": {"resourceVersion": "10"}, "items": [listed]})

    async with fakeapi.serving(handler) as (_, kube):
        inf = informer.Informer(kube, kinds.PODS.in_namespace("ns"), lambda e: None, resync_s=0)
        await inf.run(iterations=1)

    assert sorted(inf.store) == ["ns/listed", "ns/watched"]
    for original in (listed, watched):
        stored = inf.store[f"ns/{original['metadata']['name']}"]
        kept = stored.metadata.annotations
        assert BIG_KEY not in kept and set(kept) <= objects.POD_ANNOTATIONS
        assert len(msgspec.json.encode(stored)) < 2048  # was over 200 KB
        full = original["metadata"]["annotations"]
        assert _allocation(kept) == _allocation(full) is not None
        as_dict = msgspec.to_builtins(stored)
        assert resources.parse_pod(as_dict) == resources.parse_pod(original)


def test_kinds_without_trim_keep_everything() -> None:
    node = fakeapi.node("n", "1", {BIG_KEY: "x" * 1000, keys.NODE_REGISTER: "[]"})
    decoded = kinds.NODES.decoder.decode(json.dumps(node).encode())
    assert BIG_KEY in decoded.metadata.annotations
