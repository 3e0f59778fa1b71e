"""Kubernetes objects as msgspec Structs holding only the fields gpuslice reads.

Decoding a Pod into these takes a few microseconds (unknown fields are skipped, never rejected:
Kubernetes adds fields). Field names are the API's camelCase (``rename="camel"``).

Annotations are a free-form map, so they are decoded whole; a pod may carry up to 256 KB of them
(``kubectl.kubernetes.io/last-applied-configuration`` alone can be that large). Pods kept for long
(the informer's store) go through ``trim_pod``, which keeps only ``POD_ANNOTATIONS``: the keys of
``gpuslice.codec.keys`` (HAMi's ``hami.io/`` and ``nvidia.com/`` names and gpuslice's own), the
only pod annotations gpuslice reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Generic, TypeVar

import msgspec

from gpuslice.codec import keys

ANNOTATION_PREFIXES = ("hami.io/", "nvidia.com/", "gpuslice.io/")
"""Prefixes of the annotation keys gpuslice reads or writes."""
POD_ANNOTATIONS: frozenset[str] = frozenset(
    value
    for name, value in vars(keys).items()
    if name.isupper() and isinstance(value, str) and value.startswith(ANNOTATION_PREFIXES)
)
"""Every annotation key defined in ``gpuslice.codec.keys``: the pod annotations gpuslice reads
(the node keys among them cost nothing on a pod)."""


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


class Container(msgspec.Struct, rename="camel", frozen=True):
    """A container: its name, resources and (init containers only) restart policy.

    ``restart_policy: Always`` on an init container makes it a native sidecar: it starts before
    the app containers and keeps running for the pod's life
    (https://kubernetes.io/docs/concepts/workloads/pods/sidecar-containers/).
    """

    name: str = ""
    resources: ResourceRequirements = ResourceRequirements()
    restart_policy: str = ""


class PodSpec(msgspec.Struct, rename="camel", frozen=True):
    """The pod spec fields we read."""

    node_name: str = ""
    scheduler_name: str = ""
    containers: list[Container] = []
    init_containers: list[Container] = []
    priority: int | None = None


class ContainerStateTerminated(msgspec.Struct, rename="camel", frozen=True):
    """A terminated container's exit code (None when the API left it out)."""

    exit_code: int | None = None


class ContainerState(msgspec.Struct, frozen=True):
    """A container's state; only ``terminated`` is read (waiting and running are skipped)."""

    terminated: ContainerStateTerminated | None = None


class ContainerStatus(msgspec.Struct, frozen=True):
    """One entry of ``status.initContainerStatuses``: the container's name and current state."""

    name: str = ""
    state: ContainerState = ContainerState()

    @property
    def succeeded(self) -> bool:
        """True when the container is terminated with exit code 0."""
        t = self.state.terminated
        return t is not None and t.exit_code == 0


class PodStatus(msgspec.Struct, rename="camel", frozen=True):
    """The pod status fields we read."""

    phase: str = ""
    init_container_statuses: list[ContainerStatus] = []


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

    @property
    def inits_done(self) -> bool:
        """True when the pod has init containers (sidecars aside) and every one has succeeded.

        Each such init container must have a status (matched by name) that is terminated with
        exit code 0, as kubelet reports it once the container ran to completion. Native sidecars
        (``restartPolicy: Always``, ``sidecars``) run for the pod's life and stay charged; a pod
        without other init containers has nothing to release (False). The rule is HAMi's
        ``InitContainersAllSucceeded`` (``pkg/device/initcontainer.go``);
        ``docs/init-containers.md`` says what the cache does with it.
        """
        inits = [c for c in self.spec.init_containers if c.restart_policy != "Always"]
        if not inits:
            return False
        succeeded = {s.name for s in self.status.init_container_statuses if s.succeeded}
        return all(c.name in succeeded for c in inits)

    @property
    def sidecars(self) -> tuple[int, ...]:
        """Positions of the init containers that are native sidecars (``restartPolicy: Always``)."""
        return tuple(i for i, c in enumerate(self.spec.init_containers) if c.restart_policy == "Always")


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


def gpu_annotations(annotations: Mapping[str, str] | None) -> dict[str, str]:
    """The entries of ``annotations`` whose key is in ``POD_ANNOTATIONS``."""
    if not annotations:
        return {}
    return {k: v for k, v in annotations.items() if k in POD_ANNOTATIONS}


def trim_pod(pod: Pod) -> Pod:
    """The pod with only the annotations gpuslice reads (``POD_ANNOTATIONS``).

    Returns the same object when it has no other annotation.
    """
    annotations = pod.metadata.annotations
    if annotations.keys() <= POD_ANNOTATIONS:
        return pod
    meta = msgspec.structs.replace(pod.metadata, annotations=gpu_annotations(annotations))
    return msgspec.structs.replace(pod, metadata=meta)


_POD = msgspec.json.Decoder(Pod)
_NODE = msgspec.json.Decoder(Node)


def decode_pod(content: bytes) -> Pod:
    """Decode a Pod from JSON."""
    return _POD.decode(content)


def decode_node(content: bytes) -> Node:
    """Decode a Node from JSON."""
    return _NODE.decode(content)
