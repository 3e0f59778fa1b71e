"""What an informer needs to know about a kind: its path and how to decode it.

A kind may trim what it decodes before the informer stores it: ``PODS`` keeps only the pod
annotations gpuslice reads (``objects.trim_pod``), so a cluster whose pods carry large unrelated
annotations (up to 256 KB each) does not make the pod store grow with them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

import msgspec

from gpuslice.kube import objects

T = TypeVar("T")
U = TypeVar("U")


class Decoder(Generic[U]):
    """A JSON decoder whose result goes through ``trim`` (the ``decode`` of ``msgspec.json.Decoder``).

    Args:
        type_: what the JSON decodes into.
        trim: applied to every decoded value; None = none.
    """

    def __init__(self, type_: type[U], trim: Callable[[U], U] | None = None) -> None:
        self._decoder = msgspec.json.Decoder(type_)
        self._trim = trim

    def decode(self, buf: bytes) -> U:
        """Decode ``buf`` (bytes or ``msgspec.Raw``) and trim the result.

        Raises:
            msgspec.DecodeError: malformed JSON.
            msgspec.ValidationError: JSON of the wrong shape.
        """
        value = self._decoder.decode(buf)
        return value if self._trim is None else self._trim(value)


class Kind(Generic[T]):
    """A watchable collection.

    Args:
        name: short name for logs and metrics (``nodes``).
        path: collection path (``/api/v1/nodes``; ``/api/v1/namespaces/ns/pods`` for one namespace).
        type_: the Struct objects decode into (it must have ``metadata: ObjectMeta``).
        meta: how to get an object's metadata.
        trim: applied to every decoded object before anyone sees it (drops what gpuslice does
            not read); None = objects are kept as decoded.
    """

    def __init__(
        self,
        name: str,
        path: str,
        type_: type[T],
        meta: Callable[[T], objects.ObjectMeta],
        trim: Callable[[T], T] | None = None,
    ):
        self.name = name
        self.path = path
        self.type = type_
        self.meta = meta
        self.trim = trim
        list_type: type[objects.ObjectList[T]] = objects.ObjectList[type_]  # type: ignore[valid-type]
        self.list_decoder = Decoder(list_type, None if trim is None else _trim_items(trim))
        self.decoder = Decoder(type_, trim)

    def key(self, obj: T) -> str:
        """``namespace/name`` (or ``name`` for cluster-scoped objects)."""
        return objects.object_key(self.meta(obj))

    def in_namespace(self, namespace: str) -> Kind[T]:
        """The same kind restricted to one namespace (only for ``/api/v1/<plural>`` paths)."""
        head, _, plural = self.path.rpartition("/")
        return Kind(self.name, f"{head}/namespaces/{namespace}/{plural}", self.type, self.meta, self.trim)


def _trim_items(trim: Callable[[T], T]) -> Callable[[objects.ObjectList[T]], objects.ObjectList[T]]:
    def trim_page(page: objects.ObjectList[T]) -> objects.ObjectList[T]:
        return msgspec.structs.replace(page, items=[trim(item) for item in page.items])

    return trim_page


def _node_meta(n: objects.Node) -> objects.ObjectMeta:
    return n.metadata


def _pod_meta(p: objects.Pod) -> objects.ObjectMeta:
    return p.metadata


def _quota_meta(q: objects.ResourceQuota) -> objects.ObjectMeta:
    return q.metadata


NODES: Kind[objects.Node] = Kind("nodes", "/api/v1/nodes", objects.Node, _node_meta)
PODS: Kind[objects.Pod] = Kind("pods", "/api/v1/pods", objects.Pod, _pod_meta, objects.trim_pod)
"""Pods, with only the annotations gpuslice reads (``objects.trim_pod``)."""
QUOTAS: Kind[objects.ResourceQuota] = Kind(
    "resourcequotas", "/api/v1/resourcequotas", objects.ResourceQuota, _quota_meta
)
