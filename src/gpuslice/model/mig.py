"""MIG: the profiles a card in MIG mode offers and the slices pods hold on it.

A card in MIG mode is cut into GPU instances. NVML reports, per GPU-instance profile, its memory,
its share of the streaming multiprocessors and the legal placements ``{start, size}`` in memory
slices (``nvmlDeviceGetGpuInstancePossiblePlacements``); an A100 or H100 has 8 memory slices, a
``3g`` instance occupies 4 of them and may start at 0 or 4 only. HAMi's device plugin publishes
these as ``migProfiles`` in the node registration and creates the instance a pod was given at
``Allocate`` (HAMi ``pkg/device/nvidia/mig_topology.go``, ``docs/develop/dynamic-mig.md``). Two
instances on one card may not share a memory slice.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec


class Placement(msgspec.Struct, frozen=True, order=True):
    """A range of memory slices: ``[start, start + size)``."""

    start: int
    size: int

    @property
    def end(self) -> int:
        """One past the last slice."""
        return self.start + self.size

    def overlaps(self, other: Placement) -> bool:
        """True when the two ranges share a slice."""
        return self.start < other.end and other.start < self.end


class Profile(msgspec.Struct, frozen=True, kw_only=True):
    """A GPU-instance profile as the device plugin registers it.

    Attributes:
        name: NVIDIA's profile name, e.g. ``1g.10gb`` (compute slices ``g``, memory).
        memory_mib: the instance's memory (``memoryMB``).
        cores: its share of the card's multiprocessors in percent, rounded up (``core``).
        slice_count: its compute slices (``sliceCount``).
        placements: where it may start and how many memory slices it covers, in NVML's order.
    """

    name: str
    memory_mib: int = 0
    cores: int = 0
    slice_count: int = 0
    placements: tuple[Placement, ...] = ()

    @property
    def size(self) -> int:
        """Memory slices one instance covers (0 when the profile has no placement)."""
        return self.placements[0].size if self.placements else 0


class Slice(msgspec.Struct, frozen=True, order=True):
    """One GPU instance a pod holds: its profile and placement on the card."""

    start: int
    size: int
    profile: str

    @property
    def placement(self) -> Placement:
        """The memory slices it covers."""
        return Placement(self.start, self.size)

    @property
    def end(self) -> int:
        """One past the last slice."""
        return self.start + self.size


def slices_of(profiles: Iterable[Profile]) -> int:
    """How many memory slices a card with these profiles has (the end of the furthest placement)."""
    return max((p.end for prof in profiles for p in prof.placements), default=0)


def free_at(placement: Placement, taken: Iterable[Slice]) -> bool:
    """True when no held slice overlaps the placement."""
    return not any(placement.start < s.end and s.start < placement.end for s in taken)


def find(profiles: Iterable[Profile], name: str) -> Profile | None:
    """The profile called ``name``, or None."""
    for p in profiles:
        if p.name == name:
            return p
    return None


def overlapping(taken: Iterable[Slice]) -> list[tuple[Slice, Slice]]:
    """Pairs of held slices that share a memory slice (never non-empty on a sound card)."""
    ordered = sorted(taken)
    out: list[tuple[Slice, Slice]] = []
    for k, a in enumerate(ordered):
        for b in ordered[k + 1 :]:
            if b.start >= a.end:
                break
            out.append((a, b))
    return out
