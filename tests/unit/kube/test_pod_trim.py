"""Stored pods keep only the annotations gpuslice reads, however large the others are."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from gpuslice.codec import keys, pod_devices
from gpuslice.kube import informer, kinds, objects, sync
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
        assert stored == _expected(objects.decode_pod(json.dumps(original).encode()))


def _expected(full: objects.Pod) -> objects.Pod:
    """What the informer keeps of a fully decoded pod: ``trim_pod``, less the fields it skips
    (containers keep their name, restartPolicy and host resources, cpu and memory)."""
    trimmed = objects.trim_pod(full)
    refs = trimmed.metadata.owner_references
    controller = [objects.OwnerReference(uid=o.uid, controller=True) for o in refs if o.controller][:1]
    meta = msgspec.structs.replace(
        trimmed.metadata, creation_timestamp=None, owner_references=controller
    )  # labels and the controller's UID are kept (the job of balanced's task affinity)

    def host(m: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in m.items() if k in ("cpu", "memory") or "/" in k}

    def names(cs: list[objects.Container]) -> list[objects.Container]:
        return [
            objects.Container(
                name=c.name,
                restart_policy=c.restart_policy,
                resources=objects.ResourceRequirements(
                    limits=host(c.resources.limits), requests=host(c.resources.requests)
                ),
            )
            for c in cs
        ]

    spec = objects.PodSpec(
        node_name=full.spec.node_name,
        containers=names(full.spec.containers),
        init_containers=names(full.spec.init_containers),
        priority=full.spec.priority,
        preemption_policy=full.spec.preemption_policy,
    )
    return objects.Pod(metadata=meta, spec=spec, status=full.status)


def _rich_pod(big: bool) -> dict[str, Any]:
    """A bound GPU pod as the apiserver returns it (labels, owner, resources, sidecar, statuses)."""
    pod = _pod("rich", "42")
    pod["metadata"]["annotations"].pop(BIG_KEY)
    if big:  # an unrelated annotation taking the pod to the apiserver's 256 KB limit
        used = sum(len(k) + len(v) for k, v in pod["metadata"]["annotations"].items()) + len(BIG_KEY)
        pod["metadata"]["annotations"][BIG_KEY] = "x" * (256 * 1024 - used)
    pod["metadata"] |= {
        "labels": {"app": "train", keys.VGPU_NODE: "n1"},
        "creationTimestamp": "2025-11-30T00:00:00Z",
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u1"}],
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:metadata": {"f:annotations": {}}}}],
    }
    pod["spec"]["containers"][0]["resources"]["requests"] = {
        "cpu": "2",
        "memory": "8Gi",
        "example.com/x": "1",
    }
    pod["spec"] |= {
        "schedulerName": "gpuslice-scheduler",
        "priority": 0,
        "initContainers": [
            {"name": "fetch", "image": "busybox", "resources": {"limits": {"cpu": "500m"}}},
            {"name": "proxy", "image": "envoy", "restartPolicy": "Always"},
        ],
    }
    pod["status"] |= {
        "conditions": [{"type": "Ready", "status": "True"}],
        "initContainerStatuses": [{"name": "fetch", "state": {"terminated": {"exitCode": 0}}}],
        "containerStatuses": [{"name": "c", "state": {"running": {}}}],
    }
    return pod


def test_a_pod_with_256_kb_of_unrelated_annotations_decodes_to_the_same_stored_pod() -> None:
    plain, big = json.dumps(_rich_pod(False)).encode(), json.dumps(_rich_pod(True)).encode()
    assert len(big) - len(plain) > 250_000
    stored = objects.decode_stored_pod(big)
    assert stored == objects.decode_stored_pod(plain)
    assert stored == _expected(objects.decode_pod(plain))
    assert stored.inits_done and stored.sidecars == (1,) and stored.metadata.namespace == "ns"
    full = objects.decode_pod(big)
    assert sync.host_request(stored) == sync.host_request(full) == (2000, 8192)
    assert BIG_KEY not in stored.metadata.annotations and len(msgspec.json.encode(stored)) < 2048
    page = {"kind": "PodList", "metadata": {"resourceVersion": "50"}, "items": [_rich_pod(True)]}
    listed = kinds.PODS.list_decoder.decode(json.dumps(page).encode())
    assert listed.items == [stored]


def test_stored_pods_share_their_repeated_parts() -> None:
    a = objects.decode_stored_pod(json.dumps(_rich_pod(True)).encode())
    other = _rich_pod(False)
    other["metadata"]["name"] = "other"
    b = objects.decode_stored_pod(json.dumps(other).encode())
    assert a.spec.containers is b.spec.containers and a.spec.init_containers is b.spec.init_containers
    assert a.metadata.labels is b.metadata.labels and a.metadata.namespace is b.metadata.namespace
    ann_a, ann_b = a.metadata.annotations, b.metadata.annotations
    assert ann_a[keys.VGPU_NODE] is ann_b[keys.VGPU_NODE] and a.spec.node_name is ann_a[keys.VGPU_NODE]


def test_nodes_keep_only_gpu_annotations_and_kinds_without_wire_keep_everything() -> None:
    node = fakeapi.node("n", "1", {BIG_KEY: "x" * 1000, keys.NODE_REGISTER: "[]", keys.NODE_LOCK: "l"})
    node["metadata"]["labels"] = {"gpu": "on"}
    node["status"] = {"allocatable": {"nvidia.com/gpu": "80"}, "images": [{"names": ["a"], "sizeBytes": 1}]}
    raw = json.dumps(node).encode()
    stored = kinds.NODES.decoder.decode(raw)
    assert stored.metadata.annotations == {keys.NODE_REGISTER: "[]", keys.NODE_LOCK: "l"}
    assert stored.metadata.labels == {} and stored.status.allocatable == {"nvidia.com/gpu": "80"}
    whole = kinds.Kind("nodes", "/api/v1/nodes", objects.Node, lambda n: n.metadata)
    decoded = whole.decoder.decode(raw)
    assert BIG_KEY in decoded.metadata.annotations and decoded.metadata.labels == {"gpu": "on"}
    assert decoded == objects.decode_node(raw)
