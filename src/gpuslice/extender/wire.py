"""kube-scheduler's extender wire types (``k8s.io/kube-scheduler/extender/v1``) as msgspec Structs.

The Go structs have no JSON tags, so keys are the Go field names in PascalCase; ``rename="pascal"``
produces them, except for ``PodUID``, ``NumPDBViolations`` and ``UID``, which are named explicitly.
Inside ``Pod`` the keys are ordinary API camelCase and only the fields gpuslice reads are decoded
(unknown fields are ignored: Kubernetes adds fields). There is one typed ``Decoder`` per endpoint.

Scores are converted from the policies' 0..100 to the extender's 0..10 here and nowhere else.

Names are bounded as Kubernetes bounds them (``gpuslice.model.limits``): a node or pod name of
more than 253 characters, a namespace of more than 63, a UID or resourceVersion of more than 253 is
not a Kubernetes object's, and the decoder refuses it (a 400 naming the field), so nothing the
extender keeps between calls is keyed by an unbounded string.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Annotated, Any

import msgspec
import numpy as np

from gpuslice.model import limits
from gpuslice.policy import api

MAX_EXTENDER_PRIORITY = 10
"""kube-scheduler's ``MaxExtenderPriority``; it multiplies our score by ``weight x 10``."""


NodeName = Annotated[str, msgspec.Meta(max_length=limits.MAX_NAME)]
"""A node name (a DNS subdomain, at most 253 characters)."""
PodName = Annotated[str, msgspec.Meta(max_length=limits.MAX_NAME)]
"""A pod name (a DNS subdomain, at most 253 characters)."""
Namespace = Annotated[str, msgspec.Meta(max_length=limits.MAX_NAMESPACE)]
"""A namespace (a DNS label, at most 63 characters)."""
Uid = Annotated[str, msgspec.Meta(max_length=limits.MAX_UID)]
"""A UID or resourceVersion (the API server writes 36 and at most 20 characters)."""


class ResourceRequirements(msgspec.Struct, frozen=True, omit_defaults=True):
    """A container's ``resources`` (quantities stay strings, as the API encodes them)."""

    requests: dict[str, str] | None = None
    limits: dict[str, str] | None = None


class Container(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """A container: its name, resources and ``restartPolicy`` (``Always`` marks a native sidecar)."""

    name: str = ""
    resources: ResourceRequirements | None = None
    restart_policy: str | None = None


class PodSpec(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """The parts of ``spec`` the extender reads."""

    containers: list[Container] = msgspec.field(default_factory=list)
    init_containers: list[Container] | None = None
    node_name: str | None = None
    scheduler_name: str | None = None
    priority: int | None = None
    preemption_policy: str | None = None
    scheduling_group: dict[str, Any] | None = None
    """Kubernetes' native gang membership (``codec.gangs``)."""
    workload_ref: dict[str, Any] | None = None
    """Kubernetes v1.35's Workload membership (``codec.gangs``)."""


class OwnerReference(msgspec.Struct, frozen=True, omit_defaults=True):
    """An owner of the pod: its UID and whether it is the controller (the pod's job by default)."""

    uid: Uid = ""
    controller: bool | None = None


class ObjectMeta(msgspec.Struct, frozen=True, omit_defaults=True):
    """The parts of ``metadata`` the extender reads."""

    name: PodName = ""
    namespace: Namespace = "default"
    uid: Uid = ""
    resource_version: Uid = msgspec.field(default="", name="resourceVersion")
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    owner_references: list[OwnerReference] | None = msgspec.field(default=None, name="ownerReferences")


class Pod(msgspec.Struct, frozen=True, omit_defaults=True):
    """A ``v1.Pod`` reduced to what the GPU request parser needs."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.metadata.namespace}/{self.metadata.name}"

    def to_dict(self) -> dict[str, Any]:
        """The pod as an API-shaped dict (camelCase keys), for ``codec.resources.parse_pod``."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        out.setdefault("metadata", {})["namespace"] = self.metadata.namespace
        return out


class PodKeyMeta(msgspec.Struct, frozen=True):
    """Only ``metadata.uid`` and ``metadata.resourceVersion`` (the prioritize memo's key)."""

    uid: Uid = ""
    resource_version: Uid = msgspec.field(default="", name="resourceVersion")


class PodKey(msgspec.Struct, frozen=True):
    """A ``v1.Pod`` reduced to its memo key; everything else is skipped unparsed."""

    metadata: PodKeyMeta = msgspec.field(default_factory=PodKeyMeta)


class ExtenderArgsKey(msgspec.Struct, frozen=True, rename="pascal"):
    """``ExtenderArgs`` with the pod reduced to its key and ``NodeNames`` left as raw JSON.

    Prioritize's first decode: after a filter of the same pod version, the raw names are compared
    with the filter's answer byte for byte, and no string is built.
    """

    pod: PodKey = msgspec.field(default_factory=PodKey)
    node_names: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))


class ExtenderArgs(msgspec.Struct, frozen=True, rename="pascal"):
    """The body of ``filter`` and ``prioritize`` (``Nodes`` is unused: nodeCacheCapable)."""

    pod: Pod
    node_names: list[NodeName] | None = None


class ExtenderFilterResult(msgspec.Struct, rename="pascal"):
    """The ``filter`` answer. ``NodeNames`` is always a list (explicit ``[]`` when nothing fits)."""

    node_names: list[str]
    failed_nodes: dict[str, str]
    failed_and_unresolvable_nodes: dict[str, str]
    error: str = ""


class HostPriority(msgspec.Struct, rename="pascal"):
    """One node's score in the ``prioritize`` answer (a bare JSON array of these)."""

    host: str
    score: int


class ExtenderBindingArgs(msgspec.Struct, frozen=True, rename="pascal"):
    """The body of ``bind``."""

    pod_name: PodName
    pod_namespace: Namespace
    pod_uid: Uid = msgspec.field(name="PodUID")
    node: NodeName = ""


class ExtenderBindingResult(msgspec.Struct, rename="pascal"):
    """The ``bind`` answer; a non-empty ``Error`` makes the scheduler unreserve and requeue."""

    error: str = ""


class MetaPod(msgspec.Struct, frozen=True):
    """A victim, by UID."""

    uid: Uid = msgspec.field(name="UID")


class MetaVictims(msgspec.Struct, rename="pascal"):
    """Victims on one node, by UID."""

    pods: list[MetaPod] = msgspec.field(default_factory=list)
    num_pdb_violations: int = msgspec.field(default=0, name="NumPDBViolations")


class ExtenderPreemptionArgs(msgspec.Struct, frozen=True, rename="pascal"):
    """The body of ``preempt`` (nodeCacheCapable: victims by UID)."""

    pod: Pod
    node_name_to_meta_victims: dict[NodeName, MetaVictims] | None = None


class ExtenderPreemptionResult(msgspec.Struct, rename="pascal"):
    """The ``preempt`` answer."""

    node_name_to_meta_victims: dict[str, MetaVictims]


FILTER_DECODER = msgspec.json.Decoder(ExtenderArgs)
PRIORITIZE_DECODER = FILTER_DECODER
PRIORITIZE_KEY_DECODER = msgspec.json.Decoder(ExtenderArgsKey)
NAMES_DECODER = msgspec.json.Decoder(list[NodeName] | None)
BIND_DECODER = msgspec.json.Decoder(ExtenderBindingArgs)
PREEMPT_DECODER = msgspec.json.Decoder(ExtenderPreemptionArgs)
ENCODER = msgspec.json.Encoder()


def to_extender_score(score: int) -> int:
    """Map an internal score 0..``api.MAX_SCORE`` to the extender's 0..10, rounding half up.

    Out-of-range inputs are clamped, since kube-scheduler adds the value without validation.
    """
    clamped = min(max(score, 0), api.MAX_SCORE)
    return (clamped * MAX_EXTENDER_PRIORITY * 2 + api.MAX_SCORE) // (2 * api.MAX_SCORE)


_TABLE_NP = np.array([to_extender_score(s) for s in range(api.MAX_SCORE + 1)], np.int64)
_SCORE_TAILS = tuple(f"{v}}},".encode() for v in range(MAX_EXTENDER_PRIORITY + 1))
_HOST_HEADS: dict[str, bytes] = {}
_HOST_HEADS_BUDGET = 8 << 20
"""Bytes the per-host heads may hold: each entry costs about its name twice plus 160 bytes, so
8 MiB holds 15 000 nodes of 253-character names (Kubernetes' largest cluster size and names)."""
_host_heads_bytes = 0


def extender_scores(scores: np.ndarray) -> np.ndarray:
    """``to_extender_score`` over an array of internal scores (clamped to 0..``MAX_SCORE``)."""
    out: np.ndarray = _TABLE_NP.take(scores, mode="clip")  # clip mode clamps the index to 0..MAX_SCORE
    return out


def _heads(names: Sequence[str]) -> Sequence[bytes]:
    """``{"Host":"<name>","Score":`` for each name, from a cache (node names repeat every request).

    The cache has a byte budget (``_HOST_HEADS_BUDGET``); names are at most 253 characters (the
    decoders refuse longer ones), so each entry is small and the budget holds every node of a
    cluster.
    """
    global _host_heads_bytes
    heads = _HOST_HEADS
    try:
        found: Sequence[bytes] = operator.itemgetter(*names)(heads)
    except KeyError:
        added = {
            name: b'{"Host":' + ENCODER.encode(name) + b',"Score":' for name in names if name not in heads
        }
        cost = sum(_head_cost(name, head) for name, head in added.items())
        if _host_heads_bytes + cost > _HOST_HEADS_BUDGET:
            heads.clear()  # names that stop repeating (nodes gone) leave with everything else
            _host_heads_bytes = 0
            if cost > _HOST_HEADS_BUDGET:  # more names than the budget holds: heads made for this call
                return [b'{"Host":' + ENCODER.encode(name) + b',"Score":' for name in names]
            added = {name: b'{"Host":' + ENCODER.encode(name) + b',"Score":' for name in names}
            cost = sum(_head_cost(name, head) for name, head in added.items())
        heads.update(added)
        _host_heads_bytes += cost
        found = operator.itemgetter(*names)(heads)
    return found


def _head_cost(name: str, head: bytes) -> int:
    """Bytes one cached head holds: the name and head objects and the dict slot."""
    return 160 + len(name) + len(head)


def encode_priorities(names: Sequence[str], wire_scores: np.ndarray) -> bytes:
    """The ``prioritize`` answer as JSON bytes: ``[{"Host": name, "Score": 0..10}, ...]`` in order.

    The same bytes as encoding ``priorities``' structs, built by one join of cached per-host heads
    and per-score tails, so nothing is allocated per host. ``wire_scores`` are 0..10.
    """
    n = len(names)
    if n < 2:  # itemgetter of one key returns the item, not a tuple
        return ENCODER.encode(
            [HostPriority(name, int(s)) for name, s in zip(names, wire_scores.tolist(), strict=True)]
        )
    parts: list[bytes] = [b""] * (2 * n)
    parts[0::2] = _heads(names)
    parts[1::2] = operator.itemgetter(*wire_scores.tolist())(_SCORE_TAILS)
    joined = b"".join(parts)
    return b"[" + joined[:-1] + b"]"  # drop the last tail's comma


_HOST_OPEN = b'[{"Host":"'
_HOST_NEXT = b',{"Host":"'
_SCORE_MIDS = tuple(f'","Score":{v}}}'.encode() + _HOST_NEXT for v in range(MAX_EXTENDER_PRIORITY + 1))


def plain_names(names_json: bytes) -> bool:
    """True when a JSON array of names has no escapes, so ``encode_priorities_raw`` can split it."""
    return b"\\" not in names_json and names_json.startswith(b'["') and names_json.endswith(b'"]')


def encode_priorities_raw(names_json: bytes, wire_scores: np.ndarray) -> bytes:
    """``encode_priorities`` from the names as a compact JSON array without escapes (``plain_names``).

    The array is split at its ``","`` separators and interleaved with per-score fragments: two C
    calls, no lookup per host. Same bytes as ``encode_priorities``.
    """
    n = len(wire_scores)
    if n < 2:
        return encode_priorities(NAMES_DECODER.decode(names_json) or [], wire_scores)
    hosts = names_json[2:-2].split(b'","')
    if len(hosts) != n:
        raise ValueError(f"{len(hosts)} names for {n} scores")
    parts: list[bytes] = [b""] * (2 * n)
    parts[0::2] = hosts
    parts[1::2] = operator.itemgetter(*wire_scores.tolist())(_SCORE_MIDS)
    joined = b"".join(parts)
    return _HOST_OPEN + joined[: -len(_HOST_NEXT)] + b"]"
