"""Discovery over the recorded machine shapes: devices, PCIe/NVLink matrices, HAMi pair scores."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslice.agent import backend, collect, discover, fake
from gpuslice.model import devices, topology

pytestmark = pytest.mark.unit

L = topology.PcieLevel
DEFAULT = discover.RegistrationConfig()


def found(machine: fake.Shape, config: discover.RegistrationConfig = DEFAULT) -> discover.Discovery:
    return discover.discover(collect.inventory(fake.FakeBackend(machine)), config)


SHAPES = [
    # (shape, cards, registered type, MiB, numa by card)
    ("h100-8", 8, "NVIDIA H100 80GB HBM3", 81559, (0, 0, 0, 0, 1, 1, 1, 1)),
    ("a100-8-2numa", 8, "NVIDIA A100-PCIE-40GB", 40960, (0, 0, 0, 0, 1, 1, 1, 1)),
    ("t4-4", 4, "NVIDIA-Tesla T4", 15360, (0, 0, 0, 0)),  # NVML name "Tesla T4" gets HAMi's prefix
    ("a40-2", 2, "NVIDIA A40", 46068, (0, 0)),
    ("l40s-2", 2, "NVIDIA L40S", 46068, (0, 1)),
]


@pytest.mark.parametrize(("name", "n", "type_", "mib", "numa"), SHAPES, ids=[s[0] for s in SHAPES])
def test_devices_of_each_shape(name: str, n: int, type_: str, mib: int, numa: tuple[int, ...]) -> None:
    d = found(fake.shape(name))
    assert [x.index for x in d.devices] == list(range(n))
    assert {x.type for x in d.devices} == {type_}
    assert {x.memory_mib for x in d.devices} == {mib}
    assert tuple(x.numa for x in d.devices) == numa
    assert {(x.cores, x.split_count, x.mode, x.health) for x in d.devices} == {
        (100, 10, devices.MODE_HAMI_CORE, True)
    }
    assert d.topology is not None and d.topology.uuids == tuple(x.uuid for x in d.devices)
    assert len(set(d.topology.uuids)) == n
    assert d.asymmetric == ()


PAIRS = [
    # (shape, a, b, nvlinks, level, p2p, hami score = level score + 100 x links)
    ("h100-8", 0, 1, 18, L.NODE, True, 20 + 1800),  # same socket, 18 links through NVSwitch
    ("h100-8", 3, 4, 18, L.SYSTEM, True, 10 + 1800),  # across sockets, still 18 links
    ("a100-8-2numa", 0, 1, 0, L.SINGLE, True, 50),  # one PCIe switch
    ("a100-8-2numa", 0, 2, 0, L.NODE, False, 20),  # same socket, other switch
    ("a100-8-2numa", 2, 5, 0, L.SYSTEM, False, 10),  # across sockets
    ("t4-4", 1, 3, 0, L.HOSTBRIDGE, False, 30),
    ("a40-2", 0, 1, 4, L.NODE, True, 20 + 400),  # NVLink bridge, 4 links
    ("l40s-2", 0, 1, 0, L.SYSTEM, False, 10),
]


@pytest.mark.parametrize(
    ("name", "a", "b", "links", "level", "p2p", "score"), PAIRS, ids=[f"{p[0]}-{p[1]}{p[2]}" for p in PAIRS]
)
def test_pairs(name: str, a: int, b: int, links: int, level: L, p2p: bool, score: int) -> None:
    d = found(fake.shape(name))
    t = d.topology
    assert t is not None
    for i, j in ((a, b), (b, a)):
        assert t.nvlinks[i][j] == links
        assert t.pcie[i][j] == level
        assert t.p2p[i][j] == p2p
        assert d.scores[i][j] == score
    assert t.pcie[a][a] == L.INTERNAL and d.scores[a][a] == 0 and t.nvlinks[a][a] == 0


def test_scaling_and_split_count() -> None:
    d = found(
        fake.shape("h100-8"), discover.RegistrationConfig(split_count=5, memory_scaling=1.5, core_scaling=2.0)
    )
    # devmem = int(81559 x 1.5) = int(122338.5) = 122338; devcore = 100 x 2 = 200
    assert {(x.memory_mib, x.cores, x.split_count) for x in d.devices} == {(122338, 200, 5)}


@pytest.mark.parametrize(
    "bad", [{"split_count": 0}, {"memory_scaling": 0.0}, {"core_scaling": -1.0}], ids=["split", "mem", "core"]
)
def test_config_rejects_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        discover.RegistrationConfig(**bad)  # type: ignore[arg-type]


def test_health_flags_reach_devices() -> None:
    r = collect.inventory(fake.FakeBackend(fake.shape("t4-4")))
    d = discover.discover(r, DEFAULT, {2: False})
    assert [x.health for x in d.devices] == [True, True, False, True]


def test_unknown_numa_is_zero_with_a_note() -> None:
    d = found(fake.shape("t4-4"))
    assert d.numa == (None, None, None, None)
    assert sum("NUMA node unknown" in n for n in d.notes) == 4


def test_mig_mode_registers_as_mig() -> None:
    m = fake.shape("a100-8-2numa")
    profiles = fake.MIG_RECORDS["A100-SXM4-40GB"]  # the PCIe card offers the SXM4 40GB profiles
    gpus = (msgspec.structs.replace(m.gpus[0], mig_enabled=True, mig_profiles=profiles), *m.gpus[1:])
    d = found(fake.Shape(m.name, gpus, m.nvlinks, m.levels, m.p2p, m.telemetry))
    assert [x.mode for x in d.devices[:2]] == [devices.MODE_MIG, devices.MODE_HAMI_CORE]


def test_mig_card_without_profiles_is_left_out() -> None:
    m = fake.shape("a100-8-2numa")
    gpus = (msgspec.structs.replace(m.gpus[0], mig_enabled=True), *m.gpus[1:])
    d = found(fake.Shape(m.name, gpus, m.nvlinks, m.levels, m.p2p, m.telemetry))
    assert [x.index for x in d.devices] == list(range(1, 8))
    assert any("GPU 0: MIG mode but no MIG profile" in n for n in d.notes)


def test_asymmetric_links_score_zero() -> None:
    m = fake.shape("a40-2")
    # card 1 sees only 3 of the 4 bridge links
    d = found(fake.Shape(m.name, m.gpus, (m.nvlinks[0], m.nvlinks[1][:3]), m.levels, m.p2p, m.telemetry))
    assert d.topology is not None
    assert (d.topology.nvlinks[0][1], d.topology.nvlinks[1][0]) == (4, 3)
    assert d.scores[0][1] == d.scores[1][0] == 0
    assert d.asymmetric == (discover.Asymmetry(a=0, b=1, forward=4, backward=3),)
    assert any("asymmetric" in n for n in d.notes)


def test_unsupported_pair_queries_assume_system() -> None:
    m = fake.shape("a40-2")
    d = found(
        fake.Shape(
            m.name, m.gpus, m.nvlinks, ((None, None), (None, None)), ((None, None), (None, None)), m.telemetry
        )
    )
    assert d.topology is not None
    assert d.topology.pcie[0][1] == L.SYSTEM and d.topology.p2p[0][1] is False
    assert d.scores[0][1] == 10 + 400  # links still count
    assert any("PCIe relation unknown" in n for n in d.notes)


def test_bad_identities_are_left_out() -> None:
    m = fake.shape("t4-4")
    g = m.gpus
    gpus = (g[0], msgspec.structs.replace(g[1], uuid=g[0].uuid), msgspec.structs.replace(g[2], uuid=""), g[3])
    d = found(fake.Shape(m.name, gpus, m.nvlinks, m.levels, m.p2p, m.telemetry))
    assert [x.index for x in d.devices] == [0, 3]
    assert d.topology is not None and d.topology.uuids == (g[0].uuid, g[3].uuid)
    assert len(d.scores) == 2


def test_no_gpus() -> None:
    d = found(fake.shape("none"))
    assert d.devices == () and d.topology is None and d.scores == ()


def test_failing_nvlink_query_keeps_the_rest() -> None:
    class Flaky(fake.FakeBackend):
        def nvlinks(self, index: int) -> tuple[backend.NvLinkRecord, ...]:
            if index == 1:
                raise backend.BackendError(backend.REASON_GPU_LOST, "GPU is lost")
            return super().nvlinks(index)

    d = discover.discover(collect.inventory(Flaky(fake.shape("a40-2"))), DEFAULT)
    assert len(d.devices) == 2
    assert any("GPU 1: NVLink query failed" in n for n in d.notes)
    assert d.asymmetric  # card 0 still counts 4 links, card 1 none


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("00000000:18:00.0", (0, 0x18, 0, 0)),
        ("0000:ab:00.1", (0, 0xAB, 0, 1)),
        ("garbage", None),
        ("0000:zz:00.0", None),
    ],
    ids=["nvml", "sysfs", "garbage", "bad-hex"],
)
def test_bus_key(text: str, key: tuple[int, int, int, int] | None) -> None:
    assert discover.bus_key(text) == key


def test_h100_links_go_through_switches() -> None:
    m = fake.shape("h100-8")
    assert all(len(ls) == 18 for ls in m.nvlinks)
    assert all(link.remote_type == backend.REMOTE_SWITCH for ls in m.nvlinks for link in ls)


def test_telemetry_keyed_by_uuid() -> None:
    b = fake.FakeBackend(fake.shape("l40s-2"))
    b.set_telemetry(1, temperature_c=71.0, memory_used_mib=20000)
    gpus = b.gpus()
    t = discover.card_telemetry(gpus, collect.telemetry(b, gpus))
    assert [x.uuid for x in t] == [g.uuid for g in gpus]
    assert (t[1].temperature_c, t[1].memory_used_mib, t[1].power_limit_w) == (71.0, 20000, 350.0)


levels = st.sampled_from([None, 0, 10, 20, 30, 40, 50, 99])


@given(
    n=st.integers(min_value=1, max_value=5),
    data=st.data(),
)
def test_scores_are_symmetric_and_follow_hami(n: int, data: st.DataObject) -> None:
    """Whatever NVML answers, pair scores are symmetric, 0 on the diagonal and for asymmetric pairs."""
    gpus = tuple(
        backend.GpuRecord(
            index=i, uuid=f"GPU-{i}", name="X", memory_total_mib=1, pci_bus_id=f"0000:{i + 1:02x}:00.0"
        )
        for i in range(n)
    )
    links = tuple(
        tuple(
            backend.NvLinkRecord(link=k, remote_bus_id=gpus[data.draw(st.integers(0, n - 1))].pci_bus_id)
            for k in range(data.draw(st.integers(0, 4)))
        )
        for _ in range(n)
    )
    pairs = tuple(
        backend.PairRecord(a=a, b=b, common_ancestor=data.draw(levels), p2p_read=0, p2p_write=0)
        for a in range(n)
        for b in range(n)
        if a != b
    )
    d = discover.discover(collect.Records(gpus=gpus, nvlinks=links, pairs=pairs), DEFAULT)
    t = d.topology
    assert t is not None
    for i in range(n):
        assert d.scores[i][i] == 0
        for j in range(n):
            assert d.scores[i][j] == d.scores[j][i]
            assert t.pcie[i][j] == t.pcie[j][i]
            if i != j and t.nvlinks[i][j] == t.nvlinks[j][i]:
                assert d.scores[i][j] == topology.hami_pair_score(t.pcie[i][j], t.nvlinks[i][j])
            elif i != j:
                assert d.scores[i][j] == 0
