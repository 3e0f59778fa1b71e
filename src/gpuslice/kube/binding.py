"""The raw ``pods/binding`` POST, carrying the pod's annotations, idempotent.

Typed clients fail after a successful bind because the apiserver answers 201 with a ``Status``
object, not a ``Binding``; this module sends and reads raw JSON.

What the apiserver does with a Binding (kubernetes ``pkg/registry/core/pod/storage/storage.go``,
``BindingREST.Create`` -> ``assignPod`` -> ``setPodNodeAndMetadata``), which the integration tier
checks against the real kube-apiserver (``tests/integration/test_kube_writes.py``):

- one guaranteed update of the pod in etcd sets ``spec.nodeName``, the ``PodScheduled``
  condition *and* merges ``Binding.metadata.annotations`` into the pod's annotations, so a
  watcher (kubelet, the device plugin) never sees the pod bound without them, and a Binding that
  fails leaves nothing behind;
- ``Binding.metadata.uid`` (and ``resourceVersion``, unused here) are preconditions of that
  update: a pod deleted and recreated under the same name is refused with 409;
- a pod already bound (to any node), being deleted or gated is refused with 409 ``Conflict``,
  and its annotations are left as they are;
- ``Binding.metadata.labels`` are copied only while the ``PodTopologyLabelsAdmission`` feature
  gate is on (alpha in 1.33, off by default through 1.34); otherwise they are dropped.

A repeated bind of the same pod (same UID) to the same node therefore gets 409; ``create`` then
reads the pod and reports it as a repeat, with the pod as read, so the caller can tell its own
earlier Binding from another writer's by the annotations it carries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from gpuslice.kube import client as kclient
from gpuslice.kube import errors, objects, pods


class BindError(errors.ApiClientError):
    """The pod is bound elsewhere, or the name now belongs to another pod (different UID)."""

    default_code = 409


class Bound(NamedTuple):
    """A successful ``create``.

    Attributes:
        created: True when this call bound the pod; False when it was already bound to the node.
        pod: on a repeat, the pod as read after the 409 (its annotations are whoever bound it);
            None when this call bound it.
    """

    created: bool
    pod: objects.Pod | None = None


def body(
    namespace: str,
    name: str,
    uid: str,
    node: str,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, object]:
    """The Binding object; ``uid`` guards against a pod deleted and recreated under the same name.

    ``annotations`` are merged into the pod's in the same update that binds it; ``labels`` too
    where the apiserver copies Binding labels (see the module docstring).
    """
    meta: dict[str, object] = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    if annotations:
        meta["annotations"] = dict(annotations)
    if labels:
        meta["labels"] = dict(labels)
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


async def create(
    kube: kclient.KubeClient,
    namespace: str,
    name: str,
    uid: str,
    node: str,
    *,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> Bound:
    """Bind a pod to a node, writing ``annotations`` onto it in the same update.

    Returns:
        ``Bound(True)`` when this call bound the pod; ``Bound(False, pod)`` when it was already
        bound to ``node`` (a retry, or another writer's Binding: compare ``pod``'s annotations).

    Raises:
        BindError: the pod is bound to another node, or its UID differs from ``uid``.
        errors.NotFound: no such pod.
        errors.ApiError: any other failure.
    """
    try:
        await kube.request(
            "POST",
            pods.path(namespace, name, "binding"),
            body=body(namespace, name, uid, node, annotations, labels),
            timeout=timeout,
        )
        return Bound(True)
    except errors.Conflict as exc:
        conflict = exc
    pod = await pods.get(kube, namespace, name, timeout=timeout)
    if uid and pod.metadata.uid != uid:
        raise BindError(
            f"pod {namespace}/{name} has uid {pod.metadata.uid}, not {uid}: {conflict.message}",
            reason="UIDMismatch",
        ) from conflict
    if pod.spec.node_name != node:
        bound = pod.spec.node_name or "no node"
        raise BindError(
            f"pod {namespace}/{name} is bound to {bound}, not {node}: {conflict.message}",
            reason="AlreadyBound",
        ) from conflict
    return Bound(False, pod)


async def bind(
    kube: kclient.KubeClient, namespace: str, name: str, uid: str, node: str, timeout: float | None = None
) -> bool:
    """Bind a pod to a node (no annotations); ``create`` without the pod read on a repeat.

    Returns:
        True when this call bound the pod, False when it was already bound to ``node`` (a retry).

    Raises:
        BindError: the pod is bound to another node, or its UID differs from ``uid``.
        errors.NotFound: no such pod.
        errors.ApiError: any other failure.
    """
    return (await create(kube, namespace, name, uid, node, timeout=timeout)).created
