"""The raw ``pods/binding`` POST, idempotent (extender-protocol.md sections 7 and 11).

Typed clients fail after a successful bind because the apiserver answers 201 with a ``Status``
object, not a ``Binding``; this module sends and reads raw JSON. A repeated bind of the same pod
(same UID) to the same node succeeds, so a scheduler retry after a timed-out answer is harmless.
"""

from __future__ import annotations

from gpuslice.kube import client as kclient
from gpuslice.kube import errors, pods


class BindError(errors.ApiClientError):
    """The pod is bound elsewhere, or the name now belongs to another pod (different UID)."""

    default_code = 409


def body(namespace: str, name: str, uid: str, node: str) -> dict[str, object]:
    """The Binding object; ``uid`` guards against a pod deleted and recreated under the same name."""
    meta: dict[str, str] = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


async def bind(
    kube: kclient.KubeClient, namespace: str, name: str, uid: str, node: str, timeout: float | None = None
) -> bool:
    """Bind a pod to a node.

    Returns:
        True when this call bound the pod, False when it was already bound to ``node`` (a retry).

    Raises:
        BindError: the pod is bound to another node, or its UID differs from ``uid``.
        errors.NotFound: no such pod.
        errors.ApiError: any other failure.
    """
    try:
        await kube.request(
            "POST",
            pods.path(namespace, name, "binding"),
            body=body(namespace, name, uid, node),
            timeout=timeout,
        )
        return True
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
    return False
