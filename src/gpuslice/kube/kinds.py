"""What an informer needs to know about a kind: its path and how to decode it.

A kind may decode its objects through a *wire* type first: a Struct holding only the fields the
object keeps, which ``build`` turns into the stored object. ``PODS`` and ``NODES`` do
(``objects.PodWire``, ``objects.NodeWire``): they keep only what the extender reads, and
annotations outside ``objects.POD_ANNOTATIONS`` are skipped by the parser, so a cluster whose pods
carry large unrelated annotations (up to 256 KB each) neither stores nor builds them. The informer compares a
listed object's resourceVersion on the wire object, before building the stored one, so a relist
builds only the objects that changed.

A kind may also trim what it decodes before the informer stores it (``trim``, applied after
``build``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

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

    def __init__(self, type_: Any, trim: Callable[[Any], U] | None = None) -> None:
        self._decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(type_)
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
        type_: the Struct objects are stored as (it must have ``metadata: ObjectMeta``).
        meta: how to get an object's metadata.
        trim: applied to every decoded object before anyone sees it (drops what gpuslice does
            not read); None = objects are kept as decoded.
        wire: the Struct objects are decoded into first (its ``metadata`` must have ``name``,
            ``namespace`` and ``resource_version``); None = ``type_``.
        build: turns a ``wire`` object into a ``type_`` one (required with ``wire``).
    """

    def __init__(
        self,
        name: str,
        path: str,
        type_: type[T],
        meta: Callable[[T], objects.ObjectMeta],
        trim: Callable[[T], T] | None = None,
        *,
        wire: type[Any] | None = None,
        build: Callable[[Any], T] | None = None,
    ):
        if (wire is None) != (build is None):
            raise ValueError("wire and build go together")
        self.name = name
        self.path = path
        self.type = type_
        self.meta = meta
        self.trim = trim
        self.wire: type[Any] = type_ if wire is None else wire
        self._build = build
        wire_list: Any = objects.ObjectList[self.wire]  # type: ignore[name-defined]
        self.wire_list_decoder: msgspec.json.Decoder[objects.ObjectList[Any]] = msgspec.json.Decoder(
            wire_list
        )
        """Decodes a list answer into wire objects (``build_one`` makes them stored ones)."""
        self.wire_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(self.wire)
        """Decodes one object into a wire object."""
        self.list_decoder: Decoder[objects.ObjectList[T]] = Decoder(wire_list, self._build_page)
        """Decodes a list answer into stored objects."""
        self.decoder: Decoder[T] = Decoder(self.wire, self.build_one)
        """Decodes one object into a stored object."""

    def build_one(self, wire: Any) -> T:
        """The stored object for a wire one: ``build`` then ``trim``."""
        obj: T = wire if self._build is None else self._build(wire)
        return obj if self.trim is None else self.trim(obj)

    def _build_page(self, page: objects.ObjectList[Any]) -> objects.ObjectList[T]:
        if self._build is None and self.trim is None:
            return page
        return msgspec.structs.replace(page, items=[self.build_one(item) for item in page.items])

    def key(self, obj: T) -> str:
        """``namespace/name`` (or ``name`` for cluster-scoped objects)."""
        return objects.object_key(self.meta(obj))

    def in_namespace(self, namespace: str) -> Kind[T]:
        """The same kind restricted to one namespace (only for ``/api/v1/<plural>`` paths)."""
        head, _, plural = self.path.rpartition("/")
        wire = None if self._build is None else self.wire
        return Kind(
            self.name,
            f"{head}/namespaces/{namespace}/{plural}",
            self.type,
            self.meta,
            self.trim,
            wire=wire,
            build=self._build,
        )


def _node_meta(n: objects.Node) -> objects.ObjectMeta:
    return n.metadata


def _pod_meta(p: objects.Pod) -> objects.ObjectMeta:
    return p.metadata


def _quota_meta(q: objects.ResourceQuota) -> objects.ObjectMeta:
    return q.metadata


NODES: Kind[objects.Node] = Kind(
    "nodes", "/api/v1/nodes", objects.Node, _node_meta, wire=objects.NodeWire, build=objects.stored_node
)
"""Nodes with only what the extender reads (``objects.NodeWire``, ``objects.stored_node``)."""
PODS: Kind[objects.Pod] = Kind(
    "pods", "/api/v1/pods", objects.Pod, _pod_meta, wire=objects.PodWire, build=objects.stored_pod
)
"""Pods with only what the extender reads (``objects.PodWire``, ``objects.stored_pod``)."""
QUOTAS: Kind[objects.ResourceQuota] = Kind(
    "resourcequotas", "/api/v1/resourcequotas", objects.ResourceQuota, _quota_meta
)


def _group_meta(g: objects.GroupObject) -> objects.ObjectMeta:
    return g.metadata


def group_kind(name: str, path: str) -> Kind[objects.GroupObject]:
    """A gang group collection (PodGroups, Workloads) at ``path``, kept as ``objects.GroupObject``."""
    return Kind(name, path, objects.GroupObject, _group_meta)
