"""GPU-instance profiles of the cards that support MIG, as NVML describes them (one table for all).

Names, instance counts and placements in memory slices follow NVIDIA's Multi-Instance GPU User
Guide, "Supported MIG Profiles"
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html): 8 memory
slices on A100/H100/H200, 4 on A30. The guide gives memory and multiprocessors only as fractions;
the MiB (``memorySizeMB``) and SM counts are what ``nvidia-smi mig -lgip`` lists for the A100
40GB/80GB and H100 80GB (GiB x 1024; the A100 values agree with NVIDIA's go-nvml mock), while the
H200 and A30 memory figures are estimates (the H100's per-slice share scaled to the H200's 143771
MiB, the A30's slices a quarter of 24 GB) that reproduce the guide's names. Drivers differ by a few
MiB; nothing here was read from a card.

The node agent's fake backend serves these rows as NVML records, the simulator and the dev
cluster's stand-ins register them (``profiles``) with HAMi's core rule (``cores``).
"""

from __future__ import annotations

from typing import NamedTuple

from gpuslice.model import mig

PROFILE_1_SLICE, PROFILE_2_SLICE, PROFILE_3_SLICE, PROFILE_4_SLICE, PROFILE_7_SLICE = 0, 1, 2, 3, 4
PROFILE_1_SLICE_REV2 = 9
"""``NVML_GPU_INSTANCE_PROFILE_*`` ids: 1, 2, 3, 4 and 7 compute slices, and the 1-slice profile
with two memory slices (``1_SLICE_REV2``, e.g. ``1g.10gb`` on an A100 40GB)."""


class Row(NamedTuple):
    """One GPU-instance profile of one product (``nvmlGpuInstanceProfileInfo_v2_t``).

    Attributes:
        profile: its ``NVML_GPU_INSTANCE_PROFILE_*`` id.
        name: NVIDIA's name, e.g. ``3g.20gb``.
        slice_count: compute slices.
        memory_mib: memory of one instance (``memorySizeMB``).
        multiprocessors: SMs of one instance.
        size: memory slices one instance covers.
        starts: where an instance may start (``nvmlDeviceGetGpuInstancePossiblePlacements``).
    """

    profile: int
    name: str
    slice_count: int
    memory_mib: int
    multiprocessors: int
    size: int
    starts: tuple[int, ...]


def _eight_slices(
    names: tuple[str, str, str, str, str, str], memory: tuple[int, int, int, int], sms: tuple[int, ...]
) -> tuple[Row, ...]:
    """A100/H100/H200: 1g, 1g with two memory slices, 2g, 3g, 4g, 7g.

    ``memory``: MiB of one, two, four and eight memory slices' worth (1g, 2g, 3g/4g, 7g); ``sms``:
    multiprocessors of 1g, the double-memory 1g, 2g, 3g, 4g and 7g.
    """
    one, two, four, eight = memory
    return (
        Row(PROFILE_1_SLICE, names[0], 1, one, sms[0], 1, (0, 1, 2, 3, 4, 5, 6)),
        Row(PROFILE_1_SLICE_REV2, names[1], 1, two, sms[1], 2, (0, 2, 4, 6)),
        Row(PROFILE_2_SLICE, names[2], 2, two, sms[2], 2, (0, 2, 4)),
        Row(PROFILE_3_SLICE, names[3], 3, four, sms[3], 4, (0, 4)),
        Row(PROFILE_4_SLICE, names[4], 4, four, sms[4], 4, (0,)),
        Row(PROFILE_7_SLICE, names[5], 7, eight, sms[5], 8, (0,)),
    )


_A100_SMS = (14, 14, 28, 42, 56, 98)
_H100_SMS = (16, 26, 32, 60, 64, 132)

ROWS: dict[str, tuple[Row, ...]] = {
    "A100-SXM4-40GB": _eight_slices(
        ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
        (4864, 9856, 19968, 40192),
        _A100_SMS,
    ),
    "A100-SXM4-80GB": _eight_slices(
        ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        (9856, 19968, 40192, 80384),
        _A100_SMS,
    ),
    "H100-SXM5-80GB": _eight_slices(
        ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        (9984, 20096, 40448, 81152),
        _H100_SMS,
    ),
    "H200": _eight_slices(
        ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        (17536, 35328, 71296, 142976),
        _H100_SMS,
    ),
    "A30-24GB": (
        Row(PROFILE_1_SLICE, "1g.6gb", 1, 5952, 14, 1, (0, 1, 2, 3)),
        Row(PROFILE_2_SLICE, "2g.12gb", 2, 12160, 28, 2, (0, 2)),
        Row(PROFILE_4_SLICE, "4g.24gb", 4, 24320, 56, 4, (0,)),
    ),
}
"""GPU-instance profiles per product (the guide's product names)."""

NVML_NAMES = {
    "A100-SXM4-40GB": "NVIDIA A100-SXM4-40GB",
    "A100-SXM4-80GB": "NVIDIA A100-SXM4-80GB",
    "H100-SXM5-80GB": "NVIDIA H100 80GB HBM3",
    "H200": "NVIDIA H200",
    "A30-24GB": "NVIDIA A30",
}
"""The name NVML gives each product (what the registration's ``type`` is made from)."""

MEMORY_MIB = {
    "A100-SXM4-40GB": 40960,
    "A100-SXM4-80GB": 81920,
    "H100-SXM5-80GB": 81559,
    "H200": 143771,
    "A30-24GB": 24576,
}
"""Total memory NVML reports for each product (MiB)."""


def cores(multiprocessors: int, full: int) -> int:
    """A profile's cores: its share of the largest profile's multiprocessors in percent, rounded up.

    HAMi's ``discoverMigProfiles`` (``pkg/device-plugin/nvidiadevice/nvinternal/plugin/register.go``);
    0 when no profile reports multiprocessors.
    """
    return -(-multiprocessors * 100 // full) if full > 0 else 0


def profiles(product: str, *, plain: bool = False) -> tuple[mig.Profile, ...]:
    """The product's profiles as a device plugin registers them (``migProfiles``).

    ``plain`` leaves out the 1-slice profile with two memory slices (HAMi's device plugin names
    profiles by compute slices and creates only the plain ones).
    """
    rows = ROWS[product]
    full = max(r.multiprocessors for r in rows)
    return tuple(
        mig.Profile(
            name=r.name,
            memory_mib=r.memory_mib,
            cores=cores(r.multiprocessors, full),
            slice_count=r.slice_count,
            placements=tuple(mig.Placement(s, r.size) for s in r.starts),
        )
        for r in rows
        if not (plain and r.profile == PROFILE_1_SLICE_REV2)
    )
