"""Kubernetes objects as msgspec Structs holding only the fields gpuslice reads.

Decoding a Pod into these takes a few microseconds (unknown fields are skipped, never rejected:
Kubernetes adds fields). Field names are the API's camelCase (``rename="camel"``). None of these
Structs can take part in a reference cycle (they hold strings, numbers and other such Structs), so
they are not tracked by the garbage collector (``gc=False``): a cache of 150 000 pods is not
rescanned by every full collection.

Annotations are a free-form map; a pod may carry up to 256 KB of them
(``kubectl.kubernetes.io/last-applied-configuration`` alone can be that large). ``decode_pod``
decodes them whole (a pod read for one bind). Pods kept for long, the informer's store, are
decoded by ``decode_stored_pod`` / ``PodWire`` instead, which keep only what the extender reads
(see ``PodWire``): the annotations in ``POD_ANNOTATIONS`` (the keys of ``gpuslice.codec.keys``:
HAMi's ``hami.io/`` and ``nvidia.com/`` names and gpuslice's own) are decoded as the fields of a
Struct, so msgspec skips every other annotation while parsing, without building a string for it:
a pod with 256 KB of unrelated annotations decodes to the same object, at the same size, as
without them. ``trim_pod`` does the same filtering on an already decoded pod.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

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


class OwnerReference(msgspec.Struct, rename="camel", frozen=True, gc=False):
    """An owner of an object."""

    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool = False


class ObjectMeta(msgspec.Struct, rename="camel", frozen=True, gc=False):
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


class ResourceRequirements(msgspec.Struct, frozen=True, gc=False):
    """Container resources as quantity strings."""

    limits: dict[str, str] = {}
    requests: dict[str, str] = {}


class Container(msgspec.Struct, rename="camel", frozen=True, gc=False):
    """A container: its name, resources and (init containers only) restart policy.

    ``restart_policy: Always`` on an init container makes it a native sidecar: it starts before
    the app containers and keeps running for the pod's life
    (https://kubernetes.io/docs/concepts/workloads/pods/sidecar-containers/).
    """

    name: str = ""
    resources: ResourceRequirements = ResourceRequirements()
    restart_policy: str = ""


class PodSpec(msgspec.Struct, rename="camel", frozen=True, gc=False):
    """The pod spec fields we read."""

    node_name: str = ""
    scheduler_name: str = ""
    containers: list[Container] = []
    init_containers: list[Container] = []
    priority: int | None = None
    preemption_policy: str | None = None
    scheduling_group: dict[str, Any] | None = None
    """Kubernetes' native gang membership (``codec.gangs``)."""
    workload_ref: dict[str, Any] | None = None
    """Kubernetes v1.35's Workload membership (``codec.gangs``)."""


class ContainerStateTerminated(msgspec.Struct, rename="camel", frozen=True, gc=False):
    """A terminated container's exit code (None when the API left it out)."""

    exit_code: int | None = None


class ContainerState(msgspec.Struct, frozen=True, gc=False):
    """A container's state; only ``terminated`` is read (waiting and running are skipped)."""

    terminated: ContainerStateTerminated | None = None


class ContainerStatus(msgspec.Struct, frozen=True, gc=False):
    """One entry of ``status.initContainerStatuses``: the container's name and current state."""

    name: str = ""
    state: ContainerState = ContainerState()

    @property
    def succeeded(self) -> bool:
        """True when the container is terminated with exit code 0."""
        t = self.state.terminated
        return t is not None and t.exit_code == 0


class PodStatus(msgspec.Struct, rename="camel", frozen=True, gc=False):
    """The pod status fields we read."""

    phase: str = ""
    init_container_statuses: list[ContainerStatus] = []


class Pod(msgspec.Struct, frozen=True, gc=False):
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


class NodeStatus(msgspec.Struct, frozen=True, gc=False):
    """The node status fields we read."""

    capacity: dict[str, str] = {}
    allocatable: dict[str, str] = {}


class Node(msgspec.Struct, frozen=True, gc=False):
    """A Node."""

    metadata: ObjectMeta = ObjectMeta()
    status: NodeStatus = NodeStatus()

    @property
    def key(self) -> str:
        """The node name."""
        return self.metadata.name


class QuotaSpec(msgspec.Struct, frozen=True, gc=False):
    """ResourceQuota spec: hard limits."""

    hard: dict[str, str] = {}


class ResourceQuota(msgspec.Struct, frozen=True, gc=False):
    """A ResourceQuota."""

    metadata: ObjectMeta = ObjectMeta()
    spec: QuotaSpec = QuotaSpec()

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.metadata.namespace}/{self.metadata.name}"


class GroupObject(msgspec.Struct, frozen=True, gc=False):
    """A gang's group object (a PodGroup, a Workload): its metadata and its spec as builtins.

    ``gpuslice.codec.gangs`` reads the spec; the kinds differ per API group and version.
    """

    metadata: ObjectMeta = ObjectMeta()
    spec: dict[str, Any] = {}

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.metadata.namespace}/{self.metadata.name}"


T = TypeVar("T")


class ListMeta(msgspec.Struct, rename="camel", frozen=True, gc=False):
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


class Named(Protocol):
    """Metadata with a name and a namespace (``ObjectMeta`` or a wire variant of it)."""

    @property
    def name(self) -> str:
        """The object's name."""
        ...

    @property
    def namespace(self) -> str:
        """The object's namespace ('' for cluster-scoped objects)."""
        ...


def object_key(meta: Named) -> str:
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


# ----- the informer's pods: decoded with only what the extender reads

KEPT_ANNOTATIONS: tuple[str, ...] = tuple(sorted(POD_ANNOTATIONS))
"""``POD_ANNOTATIONS`` in a fixed order: the fields of the annotation Struct of ``PodWire``."""
_INTERNED_ANNOTATIONS = (keys.VGPU_NODE, keys.BIND_PHASE, keys.DEVICES_TO_ALLOCATE)
"""Annotations whose values repeat across pods (node names, phases, blanked device lists)."""

if TYPE_CHECKING:

    class _KeptAnnotations(msgspec.Struct, frozen=True, gc=False):
        """One optional str field per key of ``KEPT_ANNOTATIONS`` (built by ``defstruct`` below)."""

else:
    _KeptAnnotations = msgspec.defstruct(
        "_KeptAnnotations",
        [(f"a{i}", str | None, msgspec.field(default=None, name=k)) for i, k in enumerate(KEPT_ANNOTATIONS)],
        frozen=True,
        gc=False,
        module=__name__,
    )
_NO_KEPT = _KeptAnnotations()
_NONE_KEPT = msgspec.structs.astuple(_NO_KEPT)


class _WireMeta(msgspec.Struct, rename="camel", frozen=True, gc=False):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    annotations: _KeptAnnotations = _NO_KEPT
    deletion_timestamp: str | None = None
    labels: dict[str, str] | None = None  # a pod's job label (balanced's task affinity)
    owner_references: tuple[_WireOwner, ...] = ()  # a pod's controller: its job by default


class _WireOwner(msgspec.Struct, frozen=True, gc=False):
    uid: str = ""
    controller: bool = False


_NO_AMOUNTS: dict[str, str] = {}


class _WireResources(msgspec.Struct, frozen=True, gc=False):
    limits: dict[str, str] = _NO_AMOUNTS
    requests: dict[str, str] = _NO_AMOUNTS


_NO_RESOURCES = _WireResources()


class _WireContainer(msgspec.Struct, rename="camel", frozen=True, gc=False):
    name: str = ""
    restart_policy: str = ""
    resources: _WireResources = _NO_RESOURCES


class _WireSpec(msgspec.Struct, rename="camel", frozen=True, gc=False):
    node_name: str = ""
    containers: tuple[_WireContainer, ...] = ()
    init_containers: tuple[_WireContainer, ...] = ()
    priority: int | None = None  # preemption: who may evict whom (docs/preemption.md)
    preemption_policy: str | None = None
    scheduling_group: dict[str, Any] | None = None  # gangs (``codec.gangs``)
    workload_ref: dict[str, Any] | None = None


class _WireStatus(msgspec.Struct, rename="camel", frozen=True, gc=False):
    phase: str = ""
    init_container_statuses: tuple[ContainerStatus, ...] = ()


class PodWire(msgspec.Struct, frozen=True, gc=False):
    """A Pod as the informer decodes it: only the fields the extender reads.

    ``metadata``: name, namespace, uid, resourceVersion, deletionTimestamp and the annotations of
    ``POD_ANNOTATIONS`` (each a field of a Struct, so any other annotation is skipped by the
    parser: neither decoded nor kept); ``spec``: nodeName, priority and preemptionPolicy
    (preemption), schedulingGroup and workloadRef (gangs) and, for every container and init
    container, its name, restartPolicy (positions, native sidecars) and, of its requests and
    limits, ``cpu`` and ``memory`` (the host request kube-scheduler counts) and the extended
    resources (``vendor/name``: whether a pending pod asks for GPUs, ``sync``); ``status``: phase
    and the init containers' terminated states (``Pod.inits_done``). A pod's labels are kept
    (interned, the dict shared by pods with equal labels) and of its owner references only the
    controller's UID: the job of ``balanced``'s task affinity. The other owner references, the
    other resources (ephemeral storage, hugepages) and every other field are skipped.
    ``stored_pod`` turns it into a ``Pod``.
    """

    metadata: _WireMeta = _WireMeta()
    spec: _WireSpec = _WireSpec()
    status: _WireStatus = _WireStatus()


# Stored pods share their equal parts: the empty collections, the containers lists of pods with
# the same containers, and the strings that repeat (namespaces, node names, phases). Nothing
# mutates a decoded object (they are frozen and read only), so sharing is safe; it saves a few
# hundred bytes a pod.
_NO_STRINGS: dict[str, str] = {}
_NO_OWNERS: list[OwnerReference] = []
_NO_STATUSES: list[ContainerStatus] = []
_SHARED_MAX = 4096
"""Distinct containers lists remembered for sharing; when full the table starts anew."""
_ContainersKey = tuple[tuple[str, str, tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]], ...]
_containers_lists: dict[_ContainersKey, list[Container]] = {}


def _containers(wire: tuple[_WireContainer, ...]) -> list[Container]:
    key = tuple(
        (c.name, c.restart_policy, tuple(c.resources.limits.items()), tuple(c.resources.requests.items()))
        for c in wire
    )
    shared = _containers_lists.get(key)
    if shared is not None:
        return shared
    built = [
        Container(name=sys.intern(c.name), restart_policy=sys.intern(c.restart_policy))
        if c.resources == _NO_RESOURCES
        else Container(
            name=sys.intern(c.name),
            resources=ResourceRequirements(
                limits=_host(c.resources.limits), requests=_host(c.resources.requests)
            ),
            restart_policy=sys.intern(c.restart_policy),
        )
        for c in wire
    ]
    if len(_containers_lists) >= _SHARED_MAX:
        _containers_lists.clear()  # the stored pods keep theirs; sharing starts anew
    _containers_lists[key] = built
    return built


def _host(amounts: dict[str, str]) -> dict[str, str]:
    """CPU, memory and extended resources (``vendor/name``: GPU requests among them), interned."""
    return {sys.intern(k): sys.intern(v) for k, v in amounts.items() if k in _HOST_NAMES or "/" in k}


_HOST_NAMES = frozenset(("cpu", "memory"))


def _kept(annotations: _KeptAnnotations) -> dict[str, str]:
    values = msgspec.structs.astuple(annotations)
    if values == _NONE_KEPT:
        return _NO_STRINGS
    kept = {k: v for k, v in zip(KEPT_ANNOTATIONS, values, strict=True) if v is not None}
    for k in _INTERNED_ANNOTATIONS:
        v = kept.get(k)
        if v is not None:
            kept[k] = sys.intern(v)
    return kept


def stored_pod(wire: PodWire) -> Pod:
    """The ``Pod`` a ``PodWire`` stands for: the fields it decoded, every other one empty.

    Equal to ``trim_pod`` of the fully decoded pod once the fields ``PodWire`` skips are cleared.
    The result shares its equal parts with other stored pods; like every decoded object it must
    not be mutated.
    """
    m, spec, status = wire.metadata, wire.spec, wire.status
    statuses = list(status.init_container_statuses) if status.init_container_statuses else _NO_STATUSES
    return Pod(
        metadata=_meta(m, pod=True),
        spec=PodSpec(
            node_name=sys.intern(spec.node_name),
            containers=_containers(spec.containers),
            init_containers=_containers(spec.init_containers),
            priority=spec.priority,
            preemption_policy=None if spec.preemption_policy is None else sys.intern(spec.preemption_policy),
            scheduling_group=spec.scheduling_group,
            workload_ref=spec.workload_ref,
        ),
        status=PodStatus(
            phase=sys.intern(status.phase),
            init_container_statuses=statuses,
        ),
    )


class NodeWire(msgspec.Struct, frozen=True, gc=False):
    """A Node as the informer decodes it: only the fields the extender reads.

    Name, uid, resourceVersion, deletionTimestamp, the annotations of ``POD_ANNOTATIONS`` (the
    node keys of ``gpuslice.codec.keys`` are among them) and the status' capacity and
    allocatable. ``stored_node`` turns it into a ``Node``.
    """

    metadata: _WireMeta = _WireMeta()
    status: NodeStatus = NodeStatus()


def _meta(m: _WireMeta, pod: bool = False) -> ObjectMeta:
    return ObjectMeta(
        name=m.name,
        namespace=sys.intern(m.namespace),
        uid=m.uid,
        resource_version=m.resource_version,
        labels=_shared_labels(m.labels) if pod else _NO_STRINGS,
        annotations=_kept(m.annotations),
        deletion_timestamp=m.deletion_timestamp,
        owner_references=_controller(m.owner_references) if pod else _NO_OWNERS,
    )


_labels_dicts: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
_controllers: dict[str, list[OwnerReference]] = {}


def _shared_labels(labels: dict[str, str] | None) -> dict[str, str]:
    """A pod's labels (a job label may name its job), interned, the dict shared with equal ones."""
    if not labels:
        return _NO_STRINGS
    key = tuple(sorted(labels.items()))
    shared = _labels_dicts.get(key)
    if shared is None:
        if len(_labels_dicts) >= _SHARED_MAX:
            _labels_dicts.clear()  # the stored pods keep theirs; sharing starts anew
        shared = _labels_dicts[key] = {sys.intern(k): sys.intern(v) for k, v in key}
    return shared


def _controller(owners: tuple[_WireOwner, ...]) -> list[OwnerReference]:
    """Only the controller owner reference, only its UID (a pod's job), shared by its pods."""
    uid = next((o.uid for o in owners if o.controller and o.uid), "")
    if not uid:
        return _NO_OWNERS
    shared = _controllers.get(uid)
    if shared is None:
        if len(_controllers) >= _SHARED_MAX:
            _controllers.clear()
        shared = _controllers[uid] = [OwnerReference(uid=uid, controller=True)]
    return shared


def stored_node(wire: NodeWire) -> Node:
    """The ``Node`` a ``NodeWire`` stands for (labels and other annotations empty)."""
    return Node(metadata=_meta(wire.metadata), status=wire.status)


_POD = msgspec.json.Decoder(Pod)
_NODE = msgspec.json.Decoder(Node)
_STORED_POD = msgspec.json.Decoder(PodWire)


def decode_stored_pod(content: bytes) -> Pod:
    """Decode a Pod from JSON as the informer stores it (``PodWire``, ``stored_pod``)."""
    return stored_pod(_STORED_POD.decode(content))


def decode_pod(content: bytes) -> Pod:
    """Decode a Pod from JSON."""
    return _POD.decode(content)


def decode_node(content: bytes) -> Node:
    """Decode a Node from JSON."""
    return _NODE.decode(content)
