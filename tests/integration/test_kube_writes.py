"""Binding, pod patches and the HAMi node lock against a real kube-apiserver.

Aspects: the raw binding POST (201, idempotent repeat, wrong UID, other node); the Binding
carrying the pod's device annotations (written in the very update that binds the pod, nothing
written when refused, labels dropped with the default feature gates, a repeat keeping the first
writer's annotations) and ``extender.binder.KubeBinder.bind`` on it; merge patches of annotations
+ label with a UID precondition; the node lock's compare-and-swap (two concurrent acquirers,
dangling owners taken over, a Pending owner never stolen, expiry, owner-checked release).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from lightkube.resources.core_v1 import Node

from gpuslice.codec import keys
from gpuslice.codec import locks as lockcodec
from gpuslice.extender.binding import binder as binders
from gpuslice.kube import binding, errors, locks, pods
from gpuslice.kube import client as kclient
from gpuslice_dev.controlplane import ControlPlane
from tests.integration import kubehelpers as h

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_bind_then_repeat_is_idempotent(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    h.create_node(control_plane, node_name)
    uid = h.create_pod(control_plane, namespace, "p")["metadata"]["uid"]

    assert await binding.bind(kube, namespace, "p", uid, node_name) is True
    assert (await pods.get(kube, namespace, "p")).spec.node_name == node_name
    # The scheduler may retry after a timed-out answer: same pod, same node -> success.
    assert await binding.bind(kube, namespace, "p", uid, node_name) is False


async def test_bind_elsewhere_or_wrong_uid_fails(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    h.create_node(control_plane, node_name)
    uid = h.create_pod(control_plane, namespace, "p")["metadata"]["uid"]
    other_uid = h.create_pod(control_plane, namespace, "q")["metadata"]["uid"]

    with pytest.raises(binding.BindError, match="uid"):
        await binding.bind(kube, namespace, "q", uid, node_name)  # q's name, p's uid
    assert (await pods.get(kube, namespace, "q")).spec.node_name == ""

    await binding.bind(kube, namespace, "q", other_uid, node_name)
    with pytest.raises(binding.BindError, match="bound to"):
        await binding.bind(kube, namespace, "q", other_uid, "another-node")
    with pytest.raises(errors.NotFound):
        await binding.bind(kube, namespace, "absent", "", node_name)


ANN = {
    keys.VGPU_NODE: "",  # set per test: the node
    keys.VGPU_TIME: "1700000000",
    keys.DEVICES_TO_ALLOCATE: "GPU-a,NVIDIA,3000,0:;",
    keys.DEVICES_ALLOCATED: "GPU-a,NVIDIA,3000,0:;",
    keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING,
    keys.BIND_TIME: "1700000000",
}


async def _pod_events(kube: kclient.KubeClient, namespace: str, since: str) -> list[dict[str, object]]:
    """Every watch event of the namespace's pods after resourceVersion ``since`` (a 1 s watch)."""
    resp = await kube.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/pods",
        params={"watch": "true", "resourceVersion": since, "timeoutSeconds": 1},
        timeout=10,
    )
    return [json.loads(line) for line in resp.content.splitlines() if line.strip()]


async def test_binding_writes_its_annotations_in_the_update_that_binds_the_pod(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    h.create_node(control_plane, node_name)
    created = h.create_pod(control_plane, namespace, "p", annotations={"example.com/keep": "yes"})
    ann = ANN | {keys.VGPU_NODE: node_name}

    got = await binding.create(
        kube,
        namespace,
        "p",
        created["metadata"]["uid"],
        node_name,
        annotations=ann,
        labels={keys.VGPU_NODE: node_name},
    )

    assert got == binding.Bound(True)
    pod = await pods.get(kube, namespace, "p")
    assert pod.spec.node_name == node_name
    assert pod.metadata.annotations == ann | {"example.com/keep": "yes"}  # merged, nothing lost
    # One update: the first event after the pod's creation is already bound *and* annotated, so
    # no watcher (kubelet, the device plugin) ever sees one without the other.
    (event,) = await _pod_events(kube, namespace, created["metadata"]["resourceVersion"])
    obj = event["object"]
    assert isinstance(obj, dict)
    assert event["type"] == "MODIFIED" and obj["spec"]["nodeName"] == node_name
    assert obj["metadata"]["annotations"] == ann | {"example.com/keep": "yes"}
    # Binding labels are copied only behind the PodTopologyLabelsAdmission feature gate (alpha,
    # off by default in this apiserver): the claim label HAMi's scheduler writes is not there.
    assert keys.VGPU_NODE not in pod.metadata.labels


async def test_refused_binding_writes_nothing_and_a_repeat_keeps_the_first_annotations(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    h.create_node(control_plane, node_name)
    uid = h.create_pod(control_plane, namespace, "p")["metadata"]["uid"]
    ann = ANN | {keys.VGPU_NODE: node_name}

    # The pod was deleted and recreated: the UID precondition refuses the update as a whole.
    with pytest.raises(binding.BindError, match="uid"):
        await binding.create(
            kube, namespace, "p", "00000000-0000-0000-0000-000000000000", node_name, annotations=ann
        )
    pod = await pods.get(kube, namespace, "p")
    assert pod.spec.node_name == "" and not any(k in pod.metadata.annotations for k in ann)

    await binding.create(kube, namespace, "p", uid, node_name, annotations=ann)
    other = ann | {keys.DEVICES_ALLOCATED: "GPU-b,NVIDIA,3000,0:;", keys.BIND_TIME: "1700000009"}
    again = await binding.create(kube, namespace, "p", uid, node_name, annotations=other)
    assert again.created is False and again.pod is not None
    assert again.pod.metadata.annotations[keys.DEVICES_ALLOCATED] == ann[keys.DEVICES_ALLOCATED]
    assert (await pods.get(kube, namespace, "p")).metadata.annotations[keys.BIND_TIME] == "1700000000"


async def test_kube_binder_tells_its_own_binding_from_another_writers(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    h.create_node(control_plane, node_name)
    uid = h.create_pod(control_plane, namespace, "p")["metadata"]["uid"]
    ann = ANN | {keys.VGPU_NODE: node_name}
    b = binders.KubeBinder(kube)

    assert await b.bind(namespace, "p", uid, node_name, ann) is True
    await b.label(namespace, "p", uid, node_name)  # what the Binding could not carry
    assert (await pods.get(kube, namespace, "p")).metadata.labels[keys.VGPU_NODE] == node_name
    # Our own retry (an answer lost in a timeout): the pod carries our decision.
    assert await b.bind(namespace, "p", uid, node_name, ann) is True
    # The device plugin answered meanwhile; still our decision.
    await pods.patch_annotations(
        kube, namespace, "p", {keys.DEVICES_TO_ALLOCATE: ";", keys.BIND_PHASE: keys.BIND_PHASE_SUCCESS}
    )
    assert await b.bind(namespace, "p", uid, node_name, ann) is True
    # Another binder's decision (another card) for the same pod and node: not ours.
    theirs = ann | {keys.DEVICES_ALLOCATED: "GPU-b,NVIDIA,3000,0:;"}
    assert await b.bind(namespace, "p", uid, node_name, theirs) is False
    with pytest.raises(binders.BindFailure) as err:
        await b.bind(namespace, "p", uid, "another-node", ann)
    assert (err.value.reason, err.value.ambiguous) == ("AlreadyBound", False)


async def test_claimed_pods_of_a_node_include_those_bound_with_annotations_only(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    h.create_node(control_plane, node_name)
    uid = h.create_pod(control_plane, namespace, "bound")["metadata"]["uid"]
    await binding.create(
        kube, namespace, "bound", uid, node_name, annotations=ANN | {keys.VGPU_NODE: node_name}
    )
    h.create_pod(control_plane, namespace, "claiming")  # HAMi's filter: annotations + label, unbound
    await pods.patch_annotations(
        kube, namespace, "claiming", ANN | {keys.VGPU_NODE: node_name}, labels={keys.VGPU_NODE: node_name}
    )
    h.create_pod(control_plane, namespace, "elsewhere")
    await pods.patch_annotations(
        kube,
        namespace,
        "elsewhere",
        ANN | {keys.VGPU_NODE: "another-node"},
        labels={keys.VGPU_NODE: "another-node"},
    )

    claimed = await pods.list_claimed(kube, node_name)

    assert sorted(p.metadata.name for p in claimed) == ["bound", "claiming"]


async def test_patch_annotations_sets_annotations_and_labels_under_a_uid_precondition(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str
) -> None:
    uid = h.create_pod(control_plane, namespace, "p")["metadata"]["uid"]
    ann = {keys.VGPU_NODE: "n1", keys.DEVICES_ALLOCATED: "GPU-a,NVIDIA,1000,10:;"}
    label = {keys.VGPU_NODE: "n1"}

    pod = await pods.patch_annotations(kube, namespace, "p", ann, labels=label, uid=uid)

    assert pod.metadata.annotations[keys.DEVICES_ALLOCATED] == "GPU-a,NVIDIA,1000,10:;"
    assert pod.metadata.labels[keys.VGPU_NODE] == "n1"
    # The pod was "recreated": the apiserver refuses to change the immutable uid (422).
    with pytest.raises(errors.Invalid, match="immutable"):
        await pods.patch_annotations(
            kube, namespace, "p", ann, labels=label, uid="00000000-0000-0000-0000-000000000000"
        )
    deleted = await pods.patch_annotations(kube, namespace, "p", {keys.DEVICES_ALLOCATED: None})
    assert keys.DEVICES_ALLOCATED not in deleted.metadata.annotations


def _lock_value(control_plane: ControlPlane, node: str) -> str | None:
    status, body = control_plane.api_request("GET", f"/api/v1/nodes/{node}")
    assert status == 200
    value: str | None = (body["metadata"].get("annotations") or {}).get(keys.NODE_LOCK)
    return value


async def test_two_concurrent_acquirers_exactly_one_wins(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    h.create_node(control_plane, node_name)
    h.create_pod(control_plane, namespace, "a")
    h.create_pod(control_plane, namespace, "b")

    results = await asyncio.gather(
        locks.acquire(kube, node_name, namespace, "a"),
        locks.acquire(kube, node_name, namespace, "b"),
        return_exceptions=True,
    )

    won = [r for r in results if isinstance(r, locks.Acquired)]
    lost = [r for r in results if isinstance(r, locks.LockContention)]
    assert len(won) == 1 and len(lost) == 1, results
    holder = lockcodec.decode(_lock_value(control_plane, node_name) or "")
    winner = "a" if results[0] is won[0] else "b"
    assert (holder.namespace, holder.name) == (namespace, winner)
    # The winner asking again (a second vendor) already holds it.
    again = await locks.acquire(kube, node_name, namespace, winner)
    assert again.outcome is locks.Outcome.ALREADY_HELD


async def test_pending_owner_is_not_stolen(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    h.create_node(control_plane, node_name)
    h.create_pod(control_plane, namespace, "owner")
    h.create_pod(control_plane, namespace, "thief")
    await locks.acquire(kube, node_name, namespace, "owner")

    with pytest.raises(locks.LockContention, match="node lock contention"):
        await locks.acquire(kube, node_name, namespace, "thief")
    assert lockcodec.is_owner(_lock_value(control_plane, node_name) or "", namespace, "owner")


@pytest.mark.parametrize("how", ["deleted", "succeeded", "failed"])
async def test_dangling_owner_is_taken_over(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str, how: str
) -> None:
    h.create_node(control_plane, node_name)
    h.create_pod(control_plane, namespace, "owner")
    h.create_pod(control_plane, namespace, "next")
    await locks.acquire(kube, node_name, namespace, "owner")
    if how == "deleted":
        await pods.delete(kube, namespace, "owner")
    else:
        await pods.patch_status(kube, namespace, "owner", {"phase": how.capitalize()})

    got = await locks.acquire(kube, node_name, namespace, "next")

    assert got.outcome is locks.Outcome.TOOK_DANGLING
    assert lockcodec.is_owner(_lock_value(control_plane, node_name) or "", namespace, "next")


async def test_expired_and_malformed_locks_are_taken(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    h.create_node(control_plane, node_name)
    h.create_pod(control_plane, namespace, "owner")
    h.create_pod(control_plane, namespace, "next")
    # Taken by a live (Pending) owner 400 s before "now": older than the 300 s timeout.
    await locks.acquire(kube, node_name, namespace, "owner", clock=lambda: 1_800_000_000.0)
    got = await locks.acquire(kube, node_name, namespace, "next", clock=lambda: 1_800_000_400.0)
    assert got.outcome is locks.Outcome.TOOK_EXPIRED

    control_plane.api_request(
        "PATCH", f"/api/v1/nodes/{node_name}", {"metadata": {"annotations": {keys.NODE_LOCK: "junk"}}}
    )
    got = await locks.acquire(kube, node_name, namespace, "owner")
    assert got.outcome is locks.Outcome.TOOK_MALFORMED


async def test_release_is_owner_checked(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str, node_name: str
) -> None:
    h.create_node(control_plane, node_name)
    h.create_pod(control_plane, namespace, "owner")
    await locks.acquire(kube, node_name, namespace, "owner")

    assert await locks.release(kube, node_name, namespace, "other") is False
    assert _lock_value(control_plane, node_name) is not None
    assert await locks.release(kube, node_name, namespace, "owner") is True
    assert _lock_value(control_plane, node_name) is None
    assert await locks.release(kube, node_name, namespace, "owner") is False


async def test_stale_resource_version_is_a_conflict(
    control_plane: ControlPlane, kube: kclient.KubeClient, node_name: str
) -> None:
    rv = h.create_node(control_plane, node_name)["metadata"]["resourceVersion"]
    control_plane.api_request("PATCH", f"/api/v1/nodes/{node_name}", {"metadata": {"labels": {"x": "y"}}})

    patch = {"metadata": {"annotations": {keys.NODE_LOCK: "x"}, "resourceVersion": rv}}
    with pytest.raises(errors.Conflict) as caught:
        await kube.request("PATCH", locks.node_path(node_name), body=patch, content_type=kclient.MERGE_PATCH)
    assert caught.value.code == 409 and isinstance(caught.value, errors.PermanentError)


async def test_typed_lightkube_client_shares_the_connection(
    control_plane: ControlPlane, kube: kclient.KubeClient, node_name: str
) -> None:
    h.create_node(control_plane, node_name, labels={"k": "v"})
    node = await kube.lightkube.get(Node, node_name)
    assert node.metadata is not None and node.metadata.labels == {"k": "v"}


async def test_rbac_denial_is_a_permanent_client_error(control_plane: ControlPlane) -> None:
    async with kclient.KubeClient.auto(control_plane.user_kubeconfig) as user:
        with pytest.raises(errors.ApiClientError) as caught:
            await user.request("GET", "/api/v1/nodes")
    assert caught.value.code == 403 and caught.value.reason == "Forbidden"
    assert isinstance(caught.value, errors.PermanentError)
