"""Link bandwidth arithmetic against NVIDIA's and PCI-SIG's published figures."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslice.agent import backend, bandwidth, collect, discover, fake
from gpuslice.codec import topology as topology_codec

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("version", "links", "total_bidirectional"),
    [
        (1, 4, 160.0),  # P100 SXM2: NVLink 1.0, 4 links, 160 GB/s
        (2, 6, 300.0),  # V100 SXM2: NVLink 2.0, 6 links, 300 GB/s
        (4, 12, 600.0),  # A100 SXM4: NVLink 3.0, 12 links, 600 GB/s
        (6, 18, 900.0),  # H100 SXM5: NVLink 4.0, 18 links, 900 GB/s
        (7, 18, 1800.0),  # B200: NVLink 5.0, 18 links, 1.8 TB/s
    ],
)
def test_nvlink_generations_match_the_published_totals(
    version: int, links: int, total_bidirectional: float
) -> None:
    assert 2 * links * bandwidth.nvlink_rate(version) == total_bidirectional


def test_hopper_reporting_nvlink_5_counts_as_hopper() -> None:
    assert bandwidth.nvlink_rate(7, bandwidth.ARCH_HOPPER) == 25.0
    assert bandwidth.nvlink_rate(7, 10) == 50.0


def test_unknown_nvlink_version_is_the_slowest_generation() -> None:
    assert bandwidth.nvlink_rate(None) == bandwidth.nvlink_rate(99) == 20.0


@pytest.mark.parametrize(
    ("generation", "x16_gbps"),
    [(1, 4.0), (2, 8.0), (3, 15.754), (4, 31.508), (5, 63.015), (6, 121.0)],
)
def test_pcie_x16_per_direction(generation: int, x16_gbps: float) -> None:
    assert bandwidth.pcie_bandwidth(generation, 16) == pytest.approx(x16_gbps, abs=0.001)


def test_pcie_unknown_is_zero() -> None:
    assert bandwidth.pcie_bandwidth(None, 16) == bandwidth.pcie_bandwidth(4, None) == 0.0
    assert bandwidth.pcie_bandwidth(9, 16) == bandwidth.pcie_bandwidth(4, 0) == 0.0


def test_max_link_preferred_over_the_current_one() -> None:
    g = backend.GpuRecord(
        index=0,
        uuid="GPU-0",
        name="x",
        memory_total_mib=1,
        pci_bus_id="0:1:0.0",
        pcie_generation=1,
        pcie_width=8,
        pcie_max_generation=4,
        pcie_max_width=16,
    )
    assert bandwidth.card_pcie(g) == pytest.approx(31.508, abs=0.001)
    current_only = backend.GpuRecord(
        index=0,
        uuid="GPU-0",
        name="x",
        memory_total_mib=1,
        pci_bus_id="0:1:0.0",
        pcie_generation=3,
        pcie_width=8,
    )
    assert bandwidth.card_pcie(current_only) == pytest.approx(7.877, abs=0.001)


def _gpu(i: int, gen: int | None, width: int | None) -> backend.GpuRecord:
    return backend.GpuRecord(
        index=i,
        uuid=f"GPU-{i}",
        name="x",
        memory_total_mib=1,
        pci_bus_id=f"0:{i + 1:x}:0.0",
        pcie_max_generation=gen,
        pcie_max_width=width,
    )


@given(
    st.lists(
        st.tuples(st.sampled_from([None, 3, 4, 5]), st.sampled_from([None, 4, 8, 16])), min_size=2, max_size=5
    ),
    st.data(),
)
def test_matrix_is_symmetric_and_pcie_pairs_take_the_slower_card(
    cards: list[tuple[int | None, int | None]], data: st.DataObject
) -> None:
    gpus = tuple(_gpu(i, g, w) for i, (g, w) in enumerate(cards))
    n = len(gpus)
    counts = [[0] * n for _ in range(n)]
    links: list[list[backend.NvLinkRecord]] = [[] for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            k = data.draw(st.integers(0, 3))
            counts[i][j] = counts[j][i] = k
            for _ in range(k):
                links[i].append(
                    backend.NvLinkRecord(link=len(links[i]), remote_bus_id=gpus[j].pci_bus_id, version=6)
                )
                links[j].append(
                    backend.NvLinkRecord(link=len(links[j]), remote_bus_id=gpus[i].pci_bus_id, version=6)
                )
    bw = bandwidth.matrix(gpus, tuple(tuple(ls) for ls in links), counts)
    for i in range(n):
        assert bw[i][i] == 0.0
        for j in range(n):
            assert bw[i][j] == bw[j][i] >= 0.0
            if i != j and counts[i][j]:
                assert bw[i][j] == 25.0 * counts[i][j]
            elif i != j:
                slower = min(bandwidth.card_pcie(gpus[i]), bandwidth.card_pcie(gpus[j]))
                assert bw[i][j] == pytest.approx(slower, abs=0.001)


@pytest.mark.parametrize(
    ("shape", "pair", "gbps"),
    [
        ("h100-8", (0, 7), 450.0),  # 18 NVLink 4.0 links through NVSwitch
        ("a40-2", (0, 1), 100.0),  # 4 links of the NVLink bridge (3.0)
        ("a100-8-2numa", (0, 5), 31.508),  # PCIe Gen4 x16
        ("t4-4", (1, 2), 15.754),  # PCIe Gen3 x16
        ("l40s-2", (0, 1), 31.508),
    ],
)
def test_fake_shapes_publish_realistic_bandwidths(shape: str, pair: tuple[int, int], gbps: float) -> None:
    found = discover.discover(
        collect.inventory(fake.FakeBackend(fake.shape(shape))), discover.RegistrationConfig()
    )
    assert found.topology is not None and found.topology.bandwidth is not None
    assert found.topology.bandwidth[pair[0]][pair[1]] == gbps
    # and the annotation carries it
    decoded = topology_codec.decode_topology(topology_codec.encode_topology(found.topology))
    assert decoded.topology == found.topology
