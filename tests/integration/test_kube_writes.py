"""Binding, pod patches and the HAMi node lock against a real kube-apiserver.

Aspects: the raw binding POST (201, idempotent repeat, wrong UID, other node); merge patches of
annotations + label with a UID precondition; the node lock's compare-and-swap (two concurrent
acquirers, dangling owners taken over, a Pending owner never stolen, expiry, owner-checked
release).
"""

from __future__ import annotations

import asyncio

import pytest
from lightkube.resources.core_v1 import Node

from gpuslice.codec import keys
from gpuslice.codec import locks as lockcodec
from gpuslice.devcluster.controlplane import ControlPlane
from gpuslice.kube import binding, errors, locks, pods
from gpuslice.kube import client as kclient
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


async def test_patch_allocation_sets_annotations_and_label(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str
) -> None:
    uid = h.create_pod(control_plane, namespace, "p")["metadata"]["uid"]
    ann = {keys.VGPU_NODE: "n1", keys.DEVICES_ALLOCATED: "GPU-a,NVIDIA,1000,10:;"}

    pod = await pods.patch_allocation(kube, namespace, "p", ann, uid=uid)

    assert pod.metadata.annotations[keys.DEVICES_ALLOCATED] == "GPU-a,NVIDIA,1000,10:;"
    assert pod.metadata.labels[keys.VGPU_NODE] == "n1"
    # The pod was "recreated": the apiserver refuses to change the immutable uid (422).
    with pytest.raises(errors.Invalid, match="immutable"):
        await pods.patch_allocation(kube, namespace, "p", ann, uid="00000000-0000-0000-0000-000000000000")
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
