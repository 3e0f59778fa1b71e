"""Which pod kubelet is allocating: the one the node lock names, else HAMi's pending-pod search.

kubelet's ``Allocate`` carries no pod identity. HAMi's answer (``util.GetPendingPod``): read the
Node; when ``hami.io/mutex.lock`` names a pod (``<time>,<ns>,<name>``), that pod is the one (the
scheduler holds the lock from just before the Binding until the plugin releases it); when there is
no lock, or a legacy lock without owner, the first pod bound to the node that is Pending, has
``hami.io/bind-time``, ``hami.io/bind-phase`` ``allocating`` or ``success`` and
``hami.io/vgpu-node`` equal to the node.

gpuslice's differences, each to avoid writing to the wrong pod: a lock naming a pod that does not
exist, or one assigned to another node, is an error rather than that pod's allocation; and the
search skips pods with nothing left to allocate (HAMi would pick a started pod whose containers
were all served, then mark it failed).
"""

from __future__ import annotations

from gpuslice.codec import errors as codec_errors
from gpuslice.codec import keys
from gpuslice.codec import locks as lockcodec
from gpuslice.kube import client as kclient
from gpuslice.kube import errors, locks, pods
from gpuslice_dev.deviceplugin import entries, podview

PHASES = frozenset({keys.BIND_PHASE_ALLOCATING, keys.BIND_PHASE_SUCCESS})
"""Bind phases of a pod that may still be allocating (``success``: some containers were served)."""


class NoBindingPod(Exception):
    """No pod is being allocated on this node (kubelet's pod is rejected; nothing is written)."""


def no_binding_pod(node: str, why: str = "") -> NoBindingPod:
    """HAMi's message (``no binding pod found on node X``), with gpuslice's reason appended."""
    return NoBindingPod(f"no binding pod found on node {node}" + (f": {why}" if why else ""))


async def get(kube: kclient.KubeClient, namespace: str, name: str) -> podview.Pod:
    """Read a pod (fresh, not from a watch).

    Raises:
        errors.NotFound: no such pod.
        errors.ApiError: any other failure.
    """
    return podview.decode((await kube.request("GET", pods.path(namespace, name))).content)


def is_candidate(pod: podview.Pod, node: str) -> bool:
    """HAMi's pending-pod test, plus: something is left to allocate."""
    ann = pod.annotations
    return (
        pod.status.phase == "Pending"
        and keys.BIND_TIME in ann
        and ann.get(keys.BIND_PHASE) in PHASES
        and ann.get(keys.VGPU_NODE) == node
        and entries.has_pending(ann.get(keys.DEVICES_TO_ALLOCATE, ""))
    )


async def find(kube: kclient.KubeClient, node: str) -> podview.Pod:
    """The pod being allocated on ``node``.

    Raises:
        NoBindingPod: no pod qualifies (or the lock names one that cannot be this node's).
        errors.ApiError: an API call failed.
    """
    value = (await locks.read_node(kube, node)).metadata.annotations.get(keys.NODE_LOCK)
    if value is not None:
        try:
            lock = lockcodec.decode(value)
        except codec_errors.DecodeError as exc:
            raise no_binding_pod(node, f"unreadable node lock {value!r} ({exc})") from None
        if lock.namespace and lock.name:
            try:
                pod = await get(kube, lock.namespace, lock.name)
            except errors.NotFound:
                raise no_binding_pod(
                    node, f"the node lock names {lock.namespace}/{lock.name}, which does not exist"
                ) from None
            assigned = pod.annotations.get(keys.VGPU_NODE)
            if assigned != node:
                raise no_binding_pod(
                    node, f"the node lock names {pod.key}, which is assigned to node {assigned!r}"
                )
            return pod
    listed = await kube.request("GET", "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"})
    for pod in podview.decode_list(listed.content):
        if is_candidate(pod, node):
            return pod
    raise no_binding_pod(node)
