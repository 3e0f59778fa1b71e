"""Link bandwidth of a card pair in GB/s per direction, from what NVML reports (docs/topology.md).

**NVLink.** ``nvmlDeviceGetNvLinkVersion(device, link)`` returns an ``nvmlNvlinkVersion_t``
(nvml.h): 1 = NVLink 1.0, 2 = 2.0, 3 = 2.2, 4 = 3.0, 5 = 3.1, 6 = 4.0, 7 = 5.0. Per link and
direction, from NVIDIA's product specifications:

* 1.0 (P100 SXM2): 4 links, 160 GB/s bidirectional in total -> 20 GB/s;
* 2.0 / 2.2 (V100 SXM2/SXM3): 6 links, 300 GB/s -> 25 GB/s;
* 3.0 / 3.1 (A100 SXM4): 12 links, 600 GB/s -> 25 GB/s;
* 4.0 (H100 SXM5): 18 links, 900 GB/s -> 25 GB/s;
* 5.0 (B200): 18 links, 1.8 TB/s -> 50 GB/s.

Some drivers report 7 (5.0) for Hopper cards; hwloc and others read that as Hopper's 25 GB/s, and
so does ``nvlink_rate`` when ``nvmlDeviceGetArchitecture`` says Hopper (9). An unknown version
counts as the slowest generation, 20 GB/s: a lower bound, never an overstatement. A pair's NVLink
bandwidth is its active link count (``discover.nvlink_matrix``: direct links, or through NVSwitch
the smaller of the two cards' switch links) times the slower of the two cards' per-link rates.
The GA102 NVLink bridge (A40, RTX A6000) runs its links slower than A100's (112.5 GB/s
bidirectional over 4 links, about 14 GB/s per link and direction) while NVML reports 3.x: this
table overstates such bridges.

**PCIe.** Per lane and direction, from the PCI-SIG specifications (transfer rate times line
encoding, over 8 bits): Gen1 2.5 GT/s 8b/10b = 0.25 GB/s; Gen2 5 GT/s 8b/10b = 0.5; Gen3 8 GT/s
128b/130b = 0.985; Gen4 16 GT/s = 1.969; Gen5 32 GT/s = 3.938; Gen6 64 GT/s PAM4 with FLIT
(242 of 256 bytes payload) = 7.563. A card's PCIe bandwidth is that times the link width. The
agent reads the *maximum* generation and width of the card in its slot
(``nvmlDeviceGetMaxPcieLinkGeneration`` / ``nvmlDeviceGetMaxPcieLinkWidth``, which NVML caps at
what the system supports), falling back to the current ones: an idle card lowers its current link
generation to save power, which would make the figure change with load. A pair without NVLink
moves data over PCIe at the slower of its two cards' links (the PCIe switch or host bridge between
them is assumed not to be narrower); 0 = unknown.
"""

from __future__ import annotations

import math

from gpuslice.agent import backend

NVLINK_GBPS = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 25.0, 6: 25.0, 7: 50.0}
"""GB/s per link and direction by ``nvmlNvlinkVersion_t`` value (module docstring)."""
NVLINK_UNKNOWN_GBPS = 20.0
"""The rate of a link whose version NVML did not give (the slowest generation)."""
ARCH_HOPPER = 9
"""``NVML_DEVICE_ARCH_HOPPER``."""
_HOPPER_NVLINK_GBPS = 25.0

PCIE_LANE_GBPS = {
    1: 2.5 * 8 / 10 / 8,
    2: 5.0 * 8 / 10 / 8,
    3: 8.0 * 128 / 130 / 8,
    4: 16.0 * 128 / 130 / 8,
    5: 32.0 * 128 / 130 / 8,
    6: 64.0 * 242 / 256 / 8,
}
"""GB/s per lane and direction by PCIe generation (module docstring)."""

_DIGITS = 3
"""Published bandwidths are rounded to MB/s."""


def nvlink_rate(version: int | None, architecture: int | None = None) -> float:
    """GB/s per link and direction for an ``nvmlNvlinkVersion_t`` value (None: unknown)."""
    if version == 7 and architecture == ARCH_HOPPER:
        return _HOPPER_NVLINK_GBPS
    if version is None:
        return NVLINK_UNKNOWN_GBPS
    return NVLINK_GBPS.get(version, NVLINK_UNKNOWN_GBPS)


def card_nvlink_rate(gpu: backend.GpuRecord, links: tuple[backend.NvLinkRecord, ...]) -> float:
    """A card's per-link rate: the slowest of its active links (``NVLINK_UNKNOWN_GBPS`` without any)."""
    if not links:
        return NVLINK_UNKNOWN_GBPS
    return min(nvlink_rate(link.version, gpu.architecture) for link in links)


def pcie_bandwidth(generation: int | None, width: int | None) -> float:
    """GB/s per direction of a PCIe link; 0 when either is unknown or out of range."""
    if generation is None or width is None or width <= 0:
        return 0.0
    lane = PCIE_LANE_GBPS.get(generation)
    return 0.0 if lane is None else lane * width


def card_pcie(gpu: backend.GpuRecord) -> float:
    """A card's PCIe bandwidth from its record (maximum generation and width, else current)."""
    gen = gpu.pcie_max_generation if gpu.pcie_max_generation else gpu.pcie_generation
    width = gpu.pcie_max_width if gpu.pcie_max_width else gpu.pcie_width
    return pcie_bandwidth(gen, width)


def matrix(
    gpus: tuple[backend.GpuRecord, ...],
    links: tuple[tuple[backend.NvLinkRecord, ...], ...],
    nvlinks: list[list[int]],
) -> tuple[tuple[float, ...], ...]:
    """``bw[i][j]`` in GB/s per direction for cards by position (0 on the diagonal).

    Args:
        gpus: the cards.
        links: each card's active NVLinks (parallel to ``gpus``).
        nvlinks: ``discover.nvlink_matrix`` of the same cards.
    """
    n = len(gpus)
    rate = [card_nvlink_rate(g, links[i] if i < len(links) else ()) for i, g in enumerate(gpus)]
    pcie = [card_pcie(g) for g in gpus]
    rows = []
    for i in range(n):
        row = []
        for j in range(n):
            if i == j:
                row.append(0.0)
                continue
            count = min(nvlinks[i][j], nvlinks[j][i])
            bw = count * min(rate[i], rate[j]) if count > 0 else min(pcie[i], pcie[j])
            row.append(round(bw, _DIGITS) if math.isfinite(bw) else 0.0)
        rows.append(tuple(row))
    return tuple(rows)
