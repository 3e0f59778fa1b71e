"""Pod reads and writes: get, merge-patch annotations and labels, status, delete."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import msgspec

from gpuslice.codec import keys
from gpuslice.kube import client as kclient
from gpuslice.kube import objects


def path(namespace: str, name: str, subresource: str = "") -> str:
    """API path of a pod (or one of its subresources)."""
    base = f"/api/v1/namespaces/{namespace}/pods/{name}"
    return f"{base}/{subresource}" if subresource else base


def decode(content: bytes) -> objects.Pod:
    """Decode a Pod from JSON."""
    return objects.decode_pod(content)


async def get(
    kube: kclient.KubeClient, namespace: str, name: str, timeout: float | None = None
) -> objects.Pod:
    """Read a pod.

    Raises:
        errors.NotFound: no such pod.
        errors.ApiError: any other failure.
    """
    resp = await kube.request("GET", path(namespace, name), timeout=timeout)
    return decode(resp.content)


def annotation_patch(
    annotations: Mapping[str, str | None],
    labels: Mapping[str, str | None] | None = None,
    resource_version: str | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    """The merge-patch body setting annotations/labels (None deletes a key).

    A ``resource_version`` makes the patch compare-and-swap (409 when the object moved on); a
    ``uid`` makes it fail when the pod was recreated under the same name (the apiserver answers
    422: ``metadata.uid`` is immutable).
    """
    meta: dict[str, Any] = {"annotations": dict(annotations)}
    if labels:
        meta["labels"] = dict(labels)
    if resource_version:
        meta["resourceVersion"] = resource_version
    if uid:
        meta["uid"] = uid
    return {"metadata": meta}


async def patch_annotations(
    kube: kclient.KubeClient,
    namespace: str,
    name: str,
    annotations: Mapping[str, str | None],
    *,
    labels: Mapping[str, str | None] | None = None,
    resource_version: str | None = None,
    uid: str | None = None,
    timeout: float | None = None,
) -> objects.Pod:
    """Merge-patch a pod's annotations (and labels); returns the patched pod.

    Raises:
        errors.NotFound: no such pod.
        errors.Conflict: ``resource_version`` did not match.
        errors.Invalid: ``uid`` did not match.
        errors.ApiError: any other failure.
    """
    body = annotation_patch(annotations, labels, resource_version, uid)
    resp = await kube.request(
        "PATCH", path(namespace, name), body=body, content_type=kclient.MERGE_PATCH, timeout=timeout
    )
    return decode(resp.content)


async def patch_labels(
    kube: kclient.KubeClient,
    namespace: str,
    name: str,
    labels: Mapping[str, str | None],
    *,
    timeout: float | None = None,
) -> None:
    """Merge-patch a pod's labels (None deletes a key; deleting an absent one is a no-op).

    Raises:
        errors.NotFound: no such pod.
        errors.ApiError: any other failure.
    """
    body = {"metadata": {"labels": dict(labels)}}
    await kube.request(
        "PATCH", path(namespace, name), body=body, content_type=kclient.MERGE_PATCH, timeout=timeout
    )


async def list_claimed(kube: kclient.KubeClient, node: str) -> list[objects.Pod]:
    """Every pod that may claim devices on ``node``: bound to it, or labelled as claiming it.

    Two lists, sent together, merged by pod key (a pod in both once, its newer version):

    - ``spec.nodeName=<node>``: bound pods. gpuslice writes its device annotations in the Binding
      itself (``kube.binding``), and the apiserver does not copy the Binding's labels by default,
      so a pod gpuslice bound carries the annotations but not the ``hami.io/vgpu-node`` label;
    - ``hami.io/vgpu-node=<node>`` (label): pods claiming the node before their Binding, as HAMi's
      own scheduler writes them at filter time (annotations and label in one patch).

    Callers apply each pod as the watch would, and pods without device annotations charge
    nothing. Both are consistent reads (no ``resourceVersion``): they reflect every write before
    them.
    """
    bound, labelled = await asyncio.gather(
        kube.request("GET", "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"}),
        kube.request("GET", "/api/v1/pods", params={"labelSelector": f"{keys.VGPU_NODE}={node}"}),
    )
    merged: dict[str, objects.Pod] = {}
    for resp in (bound, labelled):
        for pod in _POD_LIST.decode(resp.content).items:
            seen = merged.get(pod.key)
            if seen is None or _newer(pod, seen):
                merged[pod.key] = pod
    return list(merged.values())


def _newer(a: objects.Pod, b: objects.Pod) -> bool:
    """True when ``a`` is a later version of the pod than ``b`` (resourceVersions as numbers)."""
    ra, rb = a.metadata.resource_version, b.metadata.resource_version
    return ra.isdigit() and rb.isdigit() and int(ra) > int(rb)


_POD_LIST = msgspec.json.Decoder(objects.ObjectList[objects.Pod])


async def patch_status(
    kube: kclient.KubeClient, namespace: str, name: str, status: Mapping[str, Any]
) -> objects.Pod:
    """Merge-patch the pod's ``status`` through the ``/status`` subresource."""
    resp = await kube.request(
        "PATCH",
        path(namespace, name, "status"),
        body={"status": dict(status)},
        content_type=kclient.MERGE_PATCH,
    )
    return decode(resp.content)


async def delete(kube: kclient.KubeClient, namespace: str, name: str, grace_period_seconds: int = 0) -> None:
    """Delete a pod (default: at once; no kubelet exists to confirm a graceful stop)."""
    await kube.request("DELETE", path(namespace, name), params={"gracePeriodSeconds": grace_period_seconds})
