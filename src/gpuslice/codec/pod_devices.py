"""Pod device annotations ``hami.io/vgpu-devices-to-allocate`` / ``-allocated`` and the bind set.

Encoding (docs/hami-compat.md section 5): each card ``{UUID},NVIDIA,{memMiB},{cores}:``, each
container's list terminated by ``;``, one entry per container, init containers first, an empty
entry for a container without GPUs. Decoding splits on ``;`` keeping empty entries (the position
is the container), then on ``:`` keeping only segments that contain ``,``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuslice.codec import errors, goparse, instants, keys, mig_allocations, podspec
from gpuslice.model import allocations

_MISSING_FIELDS = "pod annotation format error, missing fields, do not use nodeName in task spec"


def encode_container(grants: allocations.ContainerAllocation) -> str:
    """One container's cards, each terminated by ``:`` ('' for no cards)."""
    return "".join(f"{g.uuid},{g.vendor},{g.memory_mib},{g.cores}:" for g in grants)


def encode_container_of_vendor(grants: allocations.ContainerAllocation, vendor: str) -> str:
    """The cards of one vendor, joined by ``:`` without a trailing one (HAMi's per-type variant)."""
    return ":".join(f"{g.uuid},{g.vendor},{g.memory_mib},{g.cores}" for g in grants if g.vendor == vendor)


def encode(containers: Sequence[allocations.ContainerAllocation]) -> str:
    """All containers, init containers first, each entry terminated by ``;``."""
    return "".join(encode_container(c) + ";" for c in containers)


def _number(text: str, annotation: str, where: str) -> int:
    try:
        return goparse.parse_int(text, 32)
    except ValueError as exc:
        raise errors.DecodeError(annotation, where, f"invalid number in pod devices: {exc}") from None


def decode_container(
    text: str, annotation: str = keys.DEVICES_ALLOCATED, container: int = 0
) -> allocations.ContainerAllocation:
    """One container's entry; segments without ``,`` are skipped, extra fields ignored.

    Raises:
        DecodeError: a segment with fewer than 4 fields or a non-integer memory/cores.
    """
    grants: list[allocations.DeviceGrant] = []
    for segment in text.split(":"):
        if "," not in segment:
            continue
        fields = segment.split(",")
        where = f"[{container}][{len(grants)}]"
        if len(fields) < 4:
            raise errors.DecodeError(annotation, where, _MISSING_FIELDS)
        grants.append(
            allocations.DeviceGrant(
                uuid=fields[0],
                vendor=fields[1],
                memory_mib=_number(fields[2], annotation, where + ".memory"),
                cores=_number(fields[3], annotation, where + ".cores"),
            )
        )
    return tuple(grants)


def decode(
    value: str, annotation: str = keys.DEVICES_ALLOCATED
) -> tuple[allocations.ContainerAllocation, ...]:
    """All entries, exactly as HAMi splits them: a trailing ``;`` yields a final empty entry.

    Raises:
        DecodeError: a malformed card segment.
    """
    return tuple(decode_container(text, annotation, i) for i, text in enumerate(value.split(";")))


def decode_for_containers(
    value: str, container_count: int | None = None, annotation: str = keys.DEVICES_ALLOCATED
) -> tuple[allocations.ContainerAllocation, ...]:
    """Entries lined up with a pod's containers: the trailing empty entry dropped, then padded.

    Args:
        value: the annotation value.
        container_count: init plus app containers of the pod, when known; missing entries are
            padded with empty ones.
        annotation: the key, for error messages.

    Raises:
        DecodeError: malformed, or cards listed beyond the pod's last container.
    """
    entries = decode(value, annotation)
    if value.endswith(";") or value == "":
        entries = entries[:-1]
    if container_count is None:
        return entries
    if len(entries) > container_count:
        if any(entries[container_count:]):
            raise errors.DecodeError(
                annotation,
                f"[{container_count}]",
                f"devices listed for {len(entries)} containers, pod has {container_count}",
            )
        entries = entries[:container_count]
    return entries + ((),) * (container_count - len(entries))


def device_annotations(containers: Sequence[allocations.ContainerAllocation]) -> dict[str, str]:
    """Both device keys with the same encoded string; nothing when there are no containers."""
    if not containers:
        return {}
    value = encode(containers)
    return {keys.DEVICES_TO_ALLOCATE: value, keys.DEVICES_ALLOCATED: value}


def filter_annotations(alloc: allocations.PodAllocation, now: instants.Instant) -> dict[str, str]:
    """What HAMi writes when it picks the node: node, time, both device keys and MIG instances."""
    out = {keys.VGPU_NODE: alloc.node, keys.VGPU_TIME: str(instants.unix_seconds(now))}
    out.update(device_annotations(alloc.containers))
    migs = mig_allocations.encode_allocation(alloc)
    if migs:
        out[keys.MIG_ALLOCATIONS] = migs
    return out


def bind_phase_annotations(now: instants.Instant) -> dict[str, str]:
    """``bind-phase: allocating`` and ``bind-time``, written just before the Binding."""
    return {keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING, keys.BIND_TIME: str(instants.unix_seconds(now))}


BIND_KEYS = (
    keys.VGPU_NODE,
    keys.VGPU_TIME,
    keys.DEVICES_TO_ALLOCATE,
    keys.DEVICES_ALLOCATED,
    keys.MIG_ALLOCATIONS,
    keys.BIND_PHASE,
    keys.BIND_TIME,
)
"""Every pod annotation a bind writes (removing them all undoes a bind)."""


def bind_annotations(alloc: allocations.PodAllocation, now: instants.Instant) -> dict[str, str]:
    """Every annotation gpuslice writes at bind (it writes them all at once, before the Binding)."""
    out = filter_annotations(alloc, now)
    out.update(bind_phase_annotations(now))
    return out


def allocation_from_annotations(
    annotations: Mapping[str, str],
    *,
    init_count: int = 0,
    container_count: int | None = None,
    sidecars: tuple[int, ...] = (),
) -> allocations.PodAllocation | None:
    """Rebuild a pod's allocation from ``vgpu-node`` and ``vgpu-devices-allocated``.

    Returns None when either annotation is absent (the pod was never placed by a HAMi scheduler).
    The MIG instances of ``hami.io/vgpu-mig-allocations`` are attached to their grants
    (``mig_allocations.attach``). A malformed MIG value attaches nothing, as in HAMi: the grants on
    MIG cards then hold no known placement, and the policy treats those cards as full.

    Raises:
        DecodeError: a malformed device annotation.
    """
    node = annotations.get(keys.VGPU_NODE)
    value = annotations.get(keys.DEVICES_ALLOCATED)
    if node is None or value is None:
        return None
    if not isinstance(node, str) or not isinstance(value, str):
        raise errors.DecodeError(keys.DEVICES_ALLOCATED, "value", "pod annotations must be strings")
    containers = decode_for_containers(value, container_count)
    alloc = allocations.PodAllocation(
        node=node, containers=containers, init_count=init_count, sidecars=sidecars
    )
    raw = annotations.get(keys.MIG_ALLOCATIONS)
    if isinstance(raw, str) and raw:
        try:
            records = mig_allocations.decode(raw)
        except errors.DecodeError:
            return alloc
        return mig_allocations.attach(alloc, records)
    return alloc


def allocation_from_pod(pod: Mapping[str, Any]) -> allocations.PodAllocation | None:
    """Rebuild a pod's allocation from a Kubernetes pod dict (for the cache rebuild on restart).

    Raises:
        DecodeError: a malformed device annotation or pod structure.
    """
    init = podspec.containers(pod, "initContainers")
    app = podspec.containers(pod, "containers")
    return allocation_from_annotations(
        podspec.pod_annotations(pod),
        init_count=len(init),
        container_count=len(init) + len(app),
        sidecars=podspec.sidecars(init),
    )
