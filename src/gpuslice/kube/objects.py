"""Kubernetes objects as msgspec Structs holding only the fields gpuslice reads.

Decoding a Pod into these takes a few microseconds (unknown fields are skipped, never rejected:
Kubernetes adds fields). Field names are the API's camelCase (``rename="camel"``).
"""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec


class OwnerReference(msgspec.Struct, rename="camel", frozen=True):
    """An owner of an object."""

    kind: str = ""
    name: str = ""
    uid: str = ""


class ObjectMeta(msgspec.Struct, rename="camel", frozen=True):
    """The metadata fields we read."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    deletion_timestamp: str | None = None
    creation_timestamp: str | None = None
    owner_references: list[OwnerReference] = []


class ResourceRequirements(msgspec.Struct, frozen=True):
    """Container resources as quantity strings."""

    limits: dict[str, str] = {}
    requests: dict[str, str] = {}


class Container(msgspec.Struct, frozen=True):
    """A container: its name and resources."""

    name: str = ""
    resources: ResourceRequirements = ResourceRequirements()


class PodSpec(msgspec.Struct, rename="camel", frozen=True):
    """The pod spec fields we read."""

    node_name: str = ""
    scheduler_name: str = ""
    containers: list[Container] = []
    init_containers: list[Container] = []
    priority: int | None = None


class PodStatus(msgspec.Struct, rename="camel", frozen=True):
    """The pod status fields we read."""

    phase: str = ""


class Pod(msgspec.Struct, frozen=True):
    """A Pod."""

    metadata: ObjectMeta = ObjectMeta()
    spec: PodSpec = PodSpec()
    status: PodStatus = PodStatus()

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.metadata.namespace}/{self.metadata.name}"

    @property
    def terminated(self) -> bool:
        """True when the pod holds no resources any more (Succeeded or Failed)."""
        return self.status.phase in ("Succeeded", "Failed")


class NodeStatus(msgspec.Struct, frozen=True):
    """The node status fields we read."""

    capacity: dict[str, str] = {}
    allocatable: dict[str, str] = {}


class Node(msgspec.Struct, frozen=True):
    """A Node."""

    metadata: ObjectMeta = ObjectMeta()
    status: NodeStatus = NodeStatus()

    @property
    def key(self) -> str:
        """The node name."""
        return self.metadata.name


class QuotaSpec(msgspec.Struct, frozen=True):
    """ResourceQuota spec: hard limits."""

    hard: dict[str, str] = {}


class ResourceQuota(msgspec.Struct, frozen=True):
    """A ResourceQuota."""

    metadata: ObjectMeta = ObjectMeta()
    spec: QuotaSpec = QuotaSpec()

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.metadata.namespace}/{self.metadata.name}"


T = TypeVar("T")


class ListMeta(msgspec.Struct, rename="camel", frozen=True):
    """List metadata: the collection's resourceVersion and the paging token."""

    resource_version: str = ""
    # ``continue`` is a Python keyword.
    continue_: str = msgspec.field(default="", name="continue")


class ObjectList(msgspec.Struct, Generic[T], frozen=True):
    """A list answer."""

    metadata: ListMeta = ListMeta()
    items: list[T] = []


class Status(msgspec.Struct, frozen=True):
    """A ``meta/v1 Status`` (e.g. the object of a watch ERROR event)."""

    code: int = 0
    reason: str = ""
    message: str = ""


class WatchEvent(msgspec.Struct, frozen=True):
    """One watch line, with the object left raw until its type is known."""

    type: str
    object: msgspec.Raw


def object_key(meta: ObjectMeta) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    return f"{meta.namespace}/{meta.name}" if meta.namespace else meta.name


_POD = msgspec.json.Decoder(Pod)
_NODE = msgspec.json.Decoder(Node)


def decode_pod(content: bytes) -> Pod:
    """Decode a Pod from JSON."""
    return _POD.decode(content)


def decode_node(content: bytes) -> Node:
    """Decode a Node from JSON."""
    return _NODE.decode(content)
