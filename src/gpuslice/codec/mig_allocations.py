"""``hami.io/vgpu-mig-allocations``: the MIG instances a pod holds, per container and card.

HAMi v2.10 writes it at filter beside the device annotations (``pkg/device/nvidia/
mig_allocations.go``, ``EncodeMigAllocations``): a JSON array, one object per instance, keys in
the order ``containerIndex, deviceIndex, gpuUUID, profile, placement{start,size}``. The device
plugin realises each instance at ``Allocate`` and adds ``migUUID``, ``gpuInstanceID`` and
``computeInstanceID`` (all three or none; ids may be 0). ``containerIndex`` is the container's
position in the device annotations (init containers first) and ``deviceIndex`` the card's position
in that container's list, so two instances of one card stay apart.

``encode`` writes what Go's ``json.Marshal`` writes, byte for byte (its HTML-safe escapes
included); ``decode`` applies HAMi's checks (``DecodeMigAllocations``) and names the field.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from gpuslice.codec import errors, keys
from gpuslice.model import allocations, mig


class _Placement(msgspec.Struct, frozen=True):
    start: int
    size: int


class Record(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One instance as the annotation carries it (HAMi's ``MigAllocation``).

    Attributes:
        container: ``containerIndex``.
        device: ``deviceIndex``, the card's position in the container's device list.
        gpu_uuid: the physical card (``gpuUUID``).
        profile: the GPU-instance profile name.
        placement: ``{start, size}`` in memory slices.
        mig_uuid: the instance's MIG UUID once the device plugin made it ('' before).
        gpu_instance: its GPU-instance id (None before).
        compute_instance: its compute-instance id (None before).
    """

    container: int = msgspec.field(name="containerIndex")
    device: int = msgspec.field(name="deviceIndex")
    gpu_uuid: str = msgspec.field(name="gpuUUID")
    profile: str
    placement: _Placement
    mig_uuid: str = msgspec.field(default="", name="migUUID")
    gpu_instance: int | None = msgspec.field(default=None, name="gpuInstanceID")
    compute_instance: int | None = msgspec.field(default=None, name="computeInstanceID")

    @property
    def slice(self) -> mig.Slice:
        """The instance as the scheduler holds it."""
        return mig.Slice(self.placement.start, self.placement.size, self.profile)

    @property
    def realised(self) -> bool:
        """True once the device plugin recorded the instance's identity."""
        return bool(self.mig_uuid)


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(list[Record] | None)
_GO_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


def records_of(alloc: allocations.PodAllocation) -> list[Record]:
    """The records of a placement's MIG grants, in container then device order."""
    out: list[Record] = []
    for c, grants in enumerate(alloc.containers):
        for d, g in enumerate(grants):
            if g.mig is not None and g.mig.size > 0 and g.mig.profile:
                out.append(
                    Record(
                        container=c,
                        device=d,
                        gpu_uuid=g.uuid,
                        profile=g.mig.profile,
                        placement=_Placement(g.mig.start, g.mig.size),
                    )
                )
    return out


def encode(records: Sequence[Record]) -> str:
    """The annotation value, as Go's ``json.Marshal`` writes it ('' for no records: not written)."""
    if not records:
        return ""
    text = _ENCODER.encode(list(records)).decode()
    for raw, escaped in _GO_ESCAPES:
        text = text.replace(raw, escaped)
    return text


def encode_allocation(alloc: allocations.PodAllocation) -> str:
    """``encode(records_of(alloc))``: what the scheduler writes for a placement ('' = nothing)."""
    return encode(records_of(alloc))


def decode(value: str) -> list[Record]:
    """The records of an annotation value ('' = none), with HAMi's checks.

    Raises:
        DecodeError: not JSON of the right shape, a negative number, an incomplete record, a
            partial runtime identity, or two records for one container and device.
    """
    key = keys.MIG_ALLOCATIONS
    if value == "":
        return []
    try:
        got = _DECODER.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeError) as exc:
        raise errors.DecodeError(key, "json", f"invalid MIG allocations: {exc}") from None
    out = got or []
    seen: set[tuple[int, int]] = set()
    for i, r in enumerate(out):
        for name, v in (
            ("containerIndex", r.container),
            ("deviceIndex", r.device),
            ("placement.start", r.placement.start),
            ("placement.size", r.placement.size),
            ("gpuInstanceID", r.gpu_instance or 0),
            ("computeInstanceID", r.compute_instance or 0),
        ):
            if v < 0 or (name.startswith("placement") or name.endswith("ID")) and v > 0xFFFFFFFF:
                raise errors.DecodeError(key, f"[{i}].{name}", f"{name} {v} out of range")
        if not r.gpu_uuid or not r.profile or r.placement.size == 0:
            raise errors.DecodeError(key, f"[{i}]", f"MIG allocation {i} is incomplete")
        runtime = (r.mig_uuid != "") + (r.gpu_instance is not None) + (r.compute_instance is not None)
        if runtime not in (0, 3):
            raise errors.DecodeError(key, f"[{i}]", f"MIG allocation {i} has partial runtime identity")
        at = (r.container, r.device)
        if at in seen:
            raise errors.DecodeError(
                key, f"[{i}]", f"duplicate MIG allocation for container {r.container} device {r.device}"
            )
        seen.add(at)
    return out


def attach(alloc: allocations.PodAllocation, records: Sequence[Record]) -> allocations.PodAllocation:
    """The placement with each grant's instance filled in from the records.

    HAMi's rule (``getNodesUsage``): each grant takes the next record of its card, in record order;
    the position fields are not trusted for pairing. Records left over (more instances of a card
    than grants on it) are kept as extra grants of the last container that holds the card, so
    their slices stay occupied, as HAMi restores such reservations. Records of a card the pod
    holds no grant on are dropped (HAMi marks every MIG card of the node unhealthy instead; a
    stale record from another scheduler's claim would otherwise hold a slice nobody uses). A grant
    left without a record keeps ``mig`` None and the policy treats its card as full
    (``policy.mig.occupied``).
    """
    if not records:
        return alloc
    queue: dict[str, list[Record]] = {}
    for r in records:
        queue.setdefault(r.gpu_uuid, []).append(r)
    containers: list[list[allocations.DeviceGrant]] = []
    last: dict[str, int] = {}
    for c, grants in enumerate(alloc.containers):
        out: list[allocations.DeviceGrant] = []
        for g in grants:
            q = queue.get(g.uuid)
            if q and g.mig is None:
                g = msgspec.structs.replace(g, mig=q.pop(0).slice)
            out.append(g)
            last[g.uuid] = c
        containers.append(out)
    for uuid, q in queue.items():
        at = last.get(uuid)
        if at is None:
            continue
        for r in q:
            containers[at].append(allocations.DeviceGrant(uuid, 0, 0, mig=r.slice))
    return msgspec.structs.replace(alloc, containers=tuple(tuple(x) for x in containers))
