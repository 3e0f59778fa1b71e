"""Interconnect topology between the GPUs of one node.

PCIe relations use NVML's ``nvmlGpuTopologyLevel_t`` values (the common ancestor of two cards);
NVLink counts are active links between a pair (directly or through NVSwitch).
"""

from __future__ import annotations

import enum

import msgspec


class PcieLevel(enum.IntEnum):
    """Closest common PCIe ancestor of two cards (NVML values; lower is closer)."""

    INTERNAL = 0
    """Same board (e.g. a dual-GPU card)."""
    SINGLE = 10
    """Behind one PCIe switch."""
    MULTIPLE = 20
    """Behind several switches, without crossing the host bridge."""
    HOSTBRIDGE = 30
    """Through one host bridge."""
    NODE = 40
    """Through host bridges within one NUMA node (same CPU)."""
    SYSTEM = 50
    """Across CPUs (SMP interconnect)."""


class BandwidthClass(enum.IntEnum):
    """Coarse bandwidth class of a pair, best first."""

    NVLINK = 0
    PCIE_SWITCH = 1
    PCIE_HOSTBRIDGE = 2
    SAME_NUMA = 3
    CROSS_NUMA = 4


# HAMi's pair score by common ancestor (pkg/device/nvidia/calculate_score.go), +100 per NVLink.
_HAMI_PCIE_SCORE = {
    PcieLevel.SYSTEM: 10,
    PcieLevel.NODE: 20,
    PcieLevel.HOSTBRIDGE: 30,
    PcieLevel.MULTIPLE: 40,
    PcieLevel.SINGLE: 50,
    PcieLevel.INTERNAL: 60,
}
NVLINK_SCORE = 100


def hami_pair_score(level: PcieLevel, nvlinks: int) -> int:
    """HAMi's score of a card pair: PCIe level score plus 100 per NVLink link."""
    return _HAMI_PCIE_SCORE[level] + NVLINK_SCORE * nvlinks


def bandwidth_class(level: PcieLevel, nvlinks: int) -> BandwidthClass:
    """The bandwidth class of a pair from its NVLink count and PCIe relation."""
    if nvlinks > 0:
        return BandwidthClass.NVLINK
    if level <= PcieLevel.MULTIPLE:
        return BandwidthClass.PCIE_SWITCH
    if level == PcieLevel.HOSTBRIDGE:
        return BandwidthClass.PCIE_HOSTBRIDGE
    if level == PcieLevel.NODE:
        return BandwidthClass.SAME_NUMA
    return BandwidthClass.CROSS_NUMA


class Topology(msgspec.Struct, frozen=True, kw_only=True):
    """Pairwise links between the cards of a node, indexed by position in ``uuids``.

    Attributes:
        uuids: card UUIDs; row/column order of the matrices.
        nvlinks: ``nvlinks[i][j]`` active NVLink links between card i and j (0 on the diagonal).
        pcie: ``pcie[i][j]`` the PCIe common-ancestor level (``INTERNAL`` on the diagonal).
        p2p: ``p2p[i][j]`` True when peer-to-peer read/write is supported.
        bandwidth: ``bandwidth[i][j]`` link bandwidth in GB/s per direction between card i and j
            (0 on the diagonal and where unknown), as the node agent derives it from NVML
            (``gpuslice.agent.bandwidth``; docs/topology.md); None when not published (HAMi's pair
            scores, agents before this field).
    """

    uuids: tuple[str, ...]
    nvlinks: tuple[tuple[int, ...], ...]
    pcie: tuple[tuple[PcieLevel, ...], ...]
    p2p: tuple[tuple[bool, ...], ...]
    bandwidth: tuple[tuple[float, ...], ...] | None = None

    def position(self, uuid: str) -> int | None:
        """Row of a card in the matrices, or None when the topology does not know it."""
        try:
            return self.uuids.index(uuid)
        except ValueError:
            return None

    def pair_score(self, i: int, j: int) -> int:
        """HAMi pair score between rows i and j."""
        return hami_pair_score(self.pcie[i][j], self.nvlinks[i][j])

    def pair_nvlinks(self, i: int, j: int) -> int:
        """Active NVLinks between rows i and j, the weaker direction."""
        return min(self.nvlinks[i][j], self.nvlinks[j][i])

    def pair_bandwidth(self, i: int, j: int) -> float | None:
        """Link bandwidth in GB/s between rows i and j (the weaker direction); None when not published."""
        if self.bandwidth is None:
            return None
        return min(self.bandwidth[i][j], self.bandwidth[j][i])


def uniform(uuids: tuple[str, ...], level: PcieLevel = PcieLevel.SYSTEM, nvlinks: int = 0) -> Topology:
    """A topology where every pair has the same relation (a builder for tests and simulations)."""
    n = len(uuids)
    return Topology(
        uuids=uuids,
        nvlinks=tuple(tuple(0 if i == j else nvlinks for j in range(n)) for i in range(n)),
        pcie=tuple(tuple(PcieLevel.INTERNAL if i == j else level for j in range(n)) for i in range(n)),
        p2p=tuple(
            tuple(i != j and (nvlinks > 0 or level <= PcieLevel.HOSTBRIDGE) for j in range(n))
            for i in range(n)
        ),
    )
