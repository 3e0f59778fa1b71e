"""What an informer needs to know about a kind: its path and how to decode it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

import msgspec

from gpuslice.kube import objects

T = TypeVar("T")


class Kind(Generic[T]):
    """A watchable collection.

    Args:
        name: short name for logs and metrics (``nodes``).
        path: collection path (``/api/v1/nodes``; ``/api/v1/namespaces/ns/pods`` for one namespace).
        type_: the Struct objects decode into (it must have ``metadata: ObjectMeta``).
        meta: how to get an object's metadata.
    """

    def __init__(self, name: str, path: str, type_: type[T], meta: Callable[[T], objects.ObjectMeta]):
        self.name = name
        self.path = path
        self.type = type_
        self.meta = meta
        self.list_decoder = msgspec.json.Decoder(objects.ObjectList[type_])  # type: ignore[valid-type]
        self.decoder = msgspec.json.Decoder(type_)

    def key(self, obj: T) -> str:
        """``namespace/name`` (or ``name`` for cluster-scoped objects)."""
        return objects.object_key(self.meta(obj))

    def in_namespace(self, namespace: str) -> Kind[T]:
        """The same kind restricted to one namespace (only for ``/api/v1/<plural>`` paths)."""
        head, _, plural = self.path.rpartition("/")
        return Kind(self.name, f"{head}/namespaces/{namespace}/{plural}", self.type, self.meta)


def _node_meta(n: objects.Node) -> objects.ObjectMeta:
    return n.metadata


def _pod_meta(p: objects.Pod) -> objects.ObjectMeta:
    return p.metadata


def _quota_meta(q: objects.ResourceQuota) -> objects.ObjectMeta:
    return q.metadata


NODES: Kind[objects.Node] = Kind("nodes", "/api/v1/nodes", objects.Node, _node_meta)
PODS: Kind[objects.Pod] = Kind("pods", "/api/v1/pods", objects.Pod, _pod_meta)
QUOTAS: Kind[objects.ResourceQuota] = Kind(
    "resourcequotas", "/api/v1/resourcequotas", objects.ResourceQuota, _quota_meta
)
