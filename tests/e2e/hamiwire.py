"""HAMi's wire formats and its scheduler's writes, taken from HAMi's source, not from gpuslice's codec.

The migration test places pods the way HAMi's scheduler does and audits the cluster from the API.
Both sides are written here from HAMi's code, so an error that gpuslice's encoder and decoder
share cannot hide behind them. References are to Project-HAMi/HAMi at commit 4707fb0 unless a tag
is named:

- Pod devices (``pkg/device/devices.go``, ``EncodePodSingleDevice`` and ``DecodePodDevices``):
  each card is ``{uuid},NVIDIA,{MiB},{cores}:``, and each container's list ends with ``;``. Init
  containers come first, and a container without GPUs keeps an empty entry, so positions are
  containers.
- Node registration: JSON (``MarshalNodeDevices``; Go's ``omitempty`` drops a zero index or NUMA
  node) or, for device plugins up to v2.7, the colon format of v2.7.0 ``EncodeNodeDevices``:
  ``{uuid},{count},{devmem},{devcore},{type},{numa},{health},{index},{mode}:``.
- The scheduler's writes. ``Filter`` (``pkg/scheduler/scheduler.go``) patches the node, the time
  and both device keys, and ``PatchPodAnnotations`` (``pkg/util/util.go``) also sets the node as a
  label. ``Bind`` takes the node lock (``pkg/util/nodelock/nodelock.go``:
  ``<RFC3339>,<namespace>,<pod>``, a merge patch carrying the node's resourceVersion), patches
  ``bind-phase: allocating`` and ``bind-time``, then creates the Binding. The device plugin (here
  ``nodesim``) answers: it blanks ``vgpu-devices-to-allocate``, sets ``bind-phase: success`` and
  releases the lock.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from gpuslice_dev.controlplane import ControlPlane

NODE_REGISTER = "hami.io/node-nvidia-register"
NODE_LOCK = "hami.io/mutex.lock"
VGPU_NODE = "hami.io/vgpu-node"
VGPU_TIME = "hami.io/vgpu-time"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
ALLOCATED = "hami.io/vgpu-devices-allocated"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
VENDOR = "NVIDIA"
"""The device type HAMi writes for every NVIDIA card (never the model name)."""

_UUIDS = uuid.UUID("0b7c5a52-1f0e-4f43-9d55-3c1e2b7f9a10")


@dataclasses.dataclass(frozen=True)
class Grant:
    """One card given to one container: its UUID, MiB and percent of its cores."""

    uuid: str
    memory_mib: int
    cores: int


@dataclasses.dataclass(frozen=True)
class Card:
    """A card as a node registers it."""

    node: str
    uuid: str
    index: int
    memory_mib: int
    cores: int
    slots: int
    type: str
    numa: int = 0
    health: bool = True


def make_cards(node: str, model: str, count: int, memory_mib: int, numa: Sequence[int] = ()) -> list[Card]:
    """``count`` cards of one model with stable UUIDs derived from the node's name."""
    return [
        Card(
            node=node,
            uuid=f"GPU-{uuid.uuid5(_UUIDS, f'{node}/{i}')}",
            index=i,
            memory_mib=memory_mib,
            cores=100,
            slots=10,
            type=model,
            numa=numa[i] if numa else 0,
        )
        for i in range(count)
    ]


def encode_register_json(cards: Sequence[Card]) -> str:
    """The registration a v2.8+ device plugin writes (field order and ``omitempty`` as Go's)."""
    out = []
    for c in cards:
        entry: dict[str, Any] = {"id": c.uuid}
        if c.index:
            entry["index"] = c.index
        entry.update(count=c.slots, devmem=c.memory_mib, devcore=c.cores, type=c.type)
        if c.numa:
            entry["numa"] = c.numa
        entry["mode"] = "hami-core"
        if c.health:
            entry["health"] = True
        out.append(entry)
    return json.dumps(out, separators=(",", ":"))


def encode_register_legacy(cards: Sequence[Card]) -> str:
    """The registration a device plugin up to v2.7 writes (nine fields per card)."""
    return "".join(
        f"{c.uuid},{c.slots},{c.memory_mib},{c.cores},{c.type},{c.numa},{str(c.health).lower()},{c.index},"
        "hami-core:"
        for c in cards
    )


def decode_register(node: str, value: str) -> list[Card]:
    """A node's cards from either registration format (JSON when it starts with ``[``).

    Raises:
        ValueError: a malformed value.
    """
    if value.lstrip().startswith("["):
        return [
            Card(
                node=node,
                uuid=str(d["id"]),
                index=int(d.get("index", 0)),
                memory_mib=int(d.get("devmem", 0)),
                cores=int(d.get("devcore", 0)),
                slots=int(d.get("count", 0)),
                type=str(d.get("type", "")),
                numa=int(d.get("numa", 0)),
                health=bool(d.get("health", False)),
            )
            for d in json.loads(value)
        ]
    cards: list[Card] = []
    for record in value.split(":"):
        if not record:
            continue
        f = record.split(",")
        if len(f) not in (7, 9):
            raise ValueError(f"node {node}: registration record with {len(f)} fields: {record!r}")
        cards.append(
            Card(
                node=node,
                uuid=f[0],
                slots=int(f[1]),
                memory_mib=int(f[2]),
                cores=int(f[3]),
                type=f[4],
                numa=int(f[5]),
                health=f[6] == "true",
                index=int(f[7]) if len(f) == 9 else len(cards),
            )
        )
    return cards


def encode_pod_devices(containers: Sequence[Sequence[Grant]]) -> str:
    """``vgpu-devices-allocated`` for a pod: one entry per container, init containers first."""
    return "".join(
        "".join(f"{g.uuid},{VENDOR},{g.memory_mib},{g.cores}:" for g in c) + ";" for c in containers
    )


def decode_pod_devices(value: str) -> list[list[Grant]]:
    """The grants per container (positions kept; the empty piece after the last ``;`` dropped).

    Raises:
        ValueError: a card entry with fewer than four fields or a non-integer amount.
    """
    pieces = value.split(";")
    if pieces and pieces[-1] == "":
        pieces.pop()
    out: list[list[Grant]] = []
    for piece in pieces:
        grants = []
        for entry in piece.split(":"):
            if "," not in entry:
                continue
            f = entry.split(",")
            if len(f) < 4:
                raise ValueError(f"device entry with {len(f)} fields: {entry!r}")
            grants.append(Grant(uuid=f[0], memory_mib=int(f[2]), cores=int(f[3])))
        out.append(grants)
    return out


def _rfc3339(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ok(status: int, body: Mapping[str, Any], what: str) -> None:
    if status not in (200, 201):
        raise AssertionError(f"{what}: HTTP {status}: {body}")


def take_node_lock(cp: ControlPlane, node: str, namespace: str, name: str, attempts: int = 20) -> None:
    """HAMi's lock: set when absent, as a compare-and-swap on the node's resourceVersion."""
    for _ in range(attempts):
        status, obj = cp.api_request("GET", f"/api/v1/nodes/{node}")
        _ok(status, obj, f"read node {node}")
        if NODE_LOCK in (obj["metadata"].get("annotations") or {}):
            time.sleep(0.2)  # another pod's Allocate has not released it yet
            continue
        value = f"{_rfc3339(time.time())},{namespace},{name}"
        patch = {
            "metadata": {
                "annotations": {NODE_LOCK: value},
                "resourceVersion": obj["metadata"]["resourceVersion"],
            }
        }
        status, body = cp.api_request("PATCH", f"/api/v1/nodes/{node}", patch)
        if status == 409:
            continue
        _ok(status, body, f"lock node {node}")
        return
    raise AssertionError(f"node {node}: lock still held after {attempts} tries")


def claim_metadata(node: str, containers: Sequence[Sequence[Grant]]) -> dict[str, Any]:
    """What HAMi's filter writes on the pod: the node, the time and both device keys as annotations,
    and the node as a label."""
    devices = encode_pod_devices(containers)
    claim = {VGPU_NODE: node, VGPU_TIME: str(int(time.time())), TO_ALLOCATE: devices, ALLOCATED: devices}
    return {"annotations": claim, "labels": {VGPU_NODE: node}}


def filter_claim(
    cp: ControlPlane, pod: Mapping[str, Any], node: str, containers: Sequence[Sequence[Grant]]
) -> None:
    """HAMi's filter: ``claim_metadata`` as a merge patch."""
    meta = pod["metadata"]
    status, body = cp.api_request(
        "PATCH",
        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
        {"metadata": claim_metadata(node, containers)},
    )
    _ok(status, body, f"filter patch of {meta['namespace']}/{meta['name']}")


def bind(cp: ControlPlane, pod: Mapping[str, Any], node: str) -> None:
    """HAMi's bind: the node lock, ``bind-phase: allocating`` and ``bind-time``, then the Binding."""
    meta = pod["metadata"]
    ns, name = meta["namespace"], meta["name"]
    path = f"/api/v1/namespaces/{ns}/pods/{name}"
    take_node_lock(cp, node, ns, name)
    phase = {BIND_PHASE: "allocating", BIND_TIME: str(int(time.time()))}
    status, body = cp.api_request("PATCH", path, {"metadata": {"annotations": phase}})
    _ok(status, body, f"bind patch of {ns}/{name}")
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "uid": meta["uid"]},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    status, body = cp.api_request("POST", f"{path}/binding", binding)
    _ok(status, body, f"binding of {ns}/{name}")


def place(cp: ControlPlane, pod: Mapping[str, Any], node: str, containers: Sequence[Sequence[Grant]]) -> None:
    """Place a created, unbound pod as HAMi's scheduler does: the filter's patch, then the bind."""
    filter_claim(cp, pod, node, containers)
    bind(cp, pod, node)
