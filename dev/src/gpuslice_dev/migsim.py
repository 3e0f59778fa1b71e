"""MIG in the stand-ins: the cards fake nodes register and the identity ``Allocate`` gives instances.

Registration: a card in MIG mode registers ``mode: mig``, its ``migProfiles`` (name, memory,
cores, compute slices, placements), ``devcore`` 100 and a ``count`` equal to the largest instance
count of its profiles (HAMi ``pkg/device-plugin/nvidiadevice/nvinternal/plugin/register.go``,
``getAPIDevices`` and ``discoverMigProfiles``). ``A100_40GB`` is the A100-SXM4-40GB's table of
the node agent's fake backend (``gpuslice.agent.fake.MIG_PROFILES``, from NVIDIA's MIG user guide
and ``nvidia-smi mig -lgip``): 8 memory slices, 98 multiprocessors, 14 per compute slice, ``core``
HAMi's ``ceil(SMs * 100 / 98)``.

Runtime identity: at ``Allocate`` HAMi's device plugin creates each instance of
``hami.io/vgpu-mig-allocations`` and patches every record it realised with ``migUUID``,
``gpuInstanceID`` and ``computeInstanceID`` (``annotateMigRuntimeInfo`` in
``plugin/server.go``). The stand-ins derive them deterministically:

- ``migUUID``: ``MIG-<uuid5(card UUID, start, size)>``, NVIDIA's MIG UUID form;
- ``gpuInstanceID``: the placement's node in the binary tree of the card's memory slices
  (``slices / size - 1 + start / size``: 0 for the whole card, 1-2 for halves, 3-6 for quarters,
  7-14 for eighths), which is how an A100 numbers its GPU instances in practice (a ``7g`` is GI 0,
  ``1g`` instances are GI 7-14); placements off that tree (no real card has them) get
  ``2 * slices + start * (slices + 1) + size``. Distinct placements give distinct ids on a card;
  NVIDIA only promises a GI id unique per card, which this is;
- ``computeInstanceID``: 0 (one compute instance filling the GPU instance, as HAMi creates it).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Container, Sequence

import msgspec

from gpuslice.agent import fake
from gpuslice.codec import mig_allocations
from gpuslice.model import devices, mig

A100_40GB_MODEL = "NVIDIA A100-SXM4-40GB"
A100_40GB_MEMORY_MIB = 40960
"""The card's memory as NVML reports it (what ``devmem`` registers)."""
A100_40GB_SLICES = 8

A100_40GB: tuple[mig.Profile, ...] = fake.MIG_PROFILES["A100-SXM4-40GB"]
"""NVIDIA A100-SXM4-40GB GPU-instance profiles as the node agent's fake backend registers them."""

_MIG_NS = uuid.UUID("0b6f6a52-5d2e-4c1e-8f0e-6a3c9f1d2b7a")


def instance_count(profiles: Sequence[mig.Profile]) -> int:
    """The registered ``count`` of a MIG card: its profiles' largest instance count."""
    return max((len(p.placements) for p in profiles), default=0)


def mig_card(card: devices.GpuDevice, profiles: Sequence[mig.Profile] = A100_40GB) -> devices.GpuDevice:
    """The card in MIG mode: ``mig`` mode, these profiles, 100 cores, count = largest instance count."""
    return msgspec.structs.replace(
        card,
        mode=devices.MODE_MIG,
        mig_profiles=tuple(profiles),
        cores=devices.FULL_CORES,
        split_count=instance_count(profiles),
    )


def mig_uuid(gpu_uuid: str, start: int, size: int) -> str:
    """The instance's MIG UUID: ``MIG-`` and a UUID derived from the card and placement."""
    return f"MIG-{uuid.uuid5(_MIG_NS, f'{gpu_uuid}/{start}/{size}')}"


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def gpu_instance_id(start: int, size: int, slices: int = A100_40GB_SLICES) -> int:
    """The GPU-instance id of a placement on a card of ``slices`` memory slices (module docstring)."""
    if _power_of_two(slices) and _power_of_two(size) and size <= slices and start % size == 0:
        if start + size <= slices:
            return slices // size - 1 + start // size
    return 2 * slices + start * (slices + 1) + size


def realise(
    records: Sequence[mig_allocations.Record],
    slices_of: Callable[[str], int] = lambda _uuid: A100_40GB_SLICES,
    containers: Container[int] | None = None,
) -> list[mig_allocations.Record]:
    """The records with the runtime identity of every instance created now.

    Args:
        records: the pod's ``hami.io/vgpu-mig-allocations``.
        slices_of: memory slices of a card by UUID (its registered profiles' extent).
        containers: container indexes served by this ``Allocate`` call (None: all); records of
            other containers and records that already carry an identity are kept as they are.
    """
    out: list[mig_allocations.Record] = []
    for r in records:
        if r.realised or (containers is not None and r.container not in containers):
            out.append(r)
            continue
        start, size = r.placement.start, r.placement.size
        out.append(
            msgspec.structs.replace(
                r,
                mig_uuid=mig_uuid(r.gpu_uuid, start, size),
                gpu_instance=gpu_instance_id(start, size, slices_of(r.gpu_uuid) or A100_40GB_SLICES),
                compute_instance=0,
            )
        )
    return out


def realised_value(
    value: str,
    slices_of: Callable[[str], int] = lambda _uuid: A100_40GB_SLICES,
    containers: Container[int] | None = None,
) -> str | None:
    """The annotation value after ``Allocate`` created the instances; None when nothing changes.

    Raises:
        codec.errors.DecodeError: the value does not decode (HAMi fails the ``Allocate``).
    """
    records = mig_allocations.decode(value)
    done = realise(records, slices_of, containers)
    if done == records:
        return None
    return mig_allocations.encode(done)


def card_slices(cards: Sequence[devices.GpuDevice]) -> dict[str, int]:
    """Memory slices per MIG card UUID (from its registered profiles)."""
    return {c.uuid: mig.slices_of(c.mig_profiles) for c in cards if c.mig_profiles}
