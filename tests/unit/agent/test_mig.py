"""MIG on the node agent: the profile tables of the fake shapes, what a MIG card registers, allowlists."""

from __future__ import annotations

import math
import re

import msgspec
import pytest

from gpuslice.agent import backend, collect, discover, fake, publish
from gpuslice.codec import keys, registrations
from gpuslice.model import devices, mig

pytestmark = pytest.mark.unit

EIGHT_SLICE = ("A100-SXM4-40GB", "A100-SXM4-80GB", "H100-SXM5-80GB", "H200")
NAME = re.compile(r"^(\d+)g\.(\d+)gb$")


@pytest.mark.parametrize("model", sorted(fake.MIG_RECORDS))
def test_tables_are_self_consistent(model: str) -> None:
    records = fake.MIG_RECORDS[model]
    slices = 4 if model == "A30-24GB" else 8
    assert len({r.name for r in records}) == len(records)
    for r in records:
        m = NAME.match(r.name)
        assert m is not None, r.name
        assert int(m.group(1)) == r.slice_count
        assert r.instance_count == len(r.placements) == len(set(r.placements))
        for start, size in r.placements:
            assert 0 <= start and start + size <= slices
        assert len({size for _, size in r.placements}) == 1
        # the name is what NVIDIA's naming rule makes of the memory
        assert backend.mig_profile_name(r.slice_count, r.memory_mib, fake.MEMORY_MIB[model]) == r.name
        assert r.memory_mib <= fake.MEMORY_MIB[model]
    profiles = fake.MIG_PROFILES[model]
    assert mig.slices_of(profiles) == slices
    full = max(r.multiprocessors for r in records)
    for r, p in zip(records, profiles, strict=True):
        assert p.name == r.name and p.memory_mib == r.memory_mib and p.slice_count == r.slice_count
        assert p.cores == math.ceil(r.multiprocessors * 100 / full)
        assert [(x.start, x.size) for x in p.placements] == list(r.placements)


@pytest.mark.parametrize("model", EIGHT_SLICE)
def test_eight_slice_placements(model: str) -> None:
    """The guide's placements: 1g x7, double-memory 1g x4, 2g x3, 3g x2 (size 4), 4g x1, 7g x1 (size 8)."""
    got = {r.profile: r.placements for r in fake.MIG_RECORDS[model]}
    assert got == {
        0: tuple((s, 1) for s in range(7)),
        9: ((0, 2), (2, 2), (4, 2), (6, 2)),
        1: ((0, 2), (2, 2), (4, 2)),
        2: ((0, 4), (4, 4)),
        3: ((0, 4),),
        4: ((0, 8),),
    }


def test_a30_placements() -> None:
    got = {r.name: r.placements for r in fake.MIG_RECORDS["A30-24GB"]}
    assert got == {
        "1g.6gb": ((0, 1), (1, 1), (2, 1), (3, 1)),
        "2g.12gb": ((0, 2), (2, 2)),
        "4g.24gb": ((0, 4),),
    }


def test_hami_cores() -> None:
    """ceil(SMs x 100 / the largest profile's SMs), e.g. H100: 16 of 132 SMs -> 13."""
    cores = {p.name: p.cores for p in fake.MIG_PROFILES["H100-SXM5-80GB"]}
    assert cores == {
        "1g.10gb": 13,
        "1g.20gb": 20,
        "2g.20gb": 25,
        "3g.40gb": 46,
        "4g.40gb": 49,
        "7g.80gb": 100,
    }
    assert discover.profile_cores(14, 98) == 15
    assert discover.profile_cores(5, 0) == 0


def mixed(config: discover.RegistrationConfig | None = None) -> discover.Discovery:
    records = collect.inventory(fake.FakeBackend(fake.shape("a100-80g-4-mixed")))
    return discover.discover(
        records, config or discover.RegistrationConfig(split_count=10, memory_scaling=2.0)
    )


def test_mixed_node_registers_mig_and_shared_cards() -> None:
    d = mixed()
    mig_card, _, shared, _ = d.devices
    assert mig_card.mode == devices.MODE_MIG and mig_card.is_mig
    assert mig_card.mig_profiles == fake.MIG_PROFILES["A100-SXM4-80GB"]
    # HAMi's register.go: count = most instances of a profile; devcore 100; memory not scaled
    assert (mig_card.split_count, mig_card.cores, mig_card.memory_mib) == (7, 100, 81920)
    assert shared.mode == devices.MODE_HAMI_CORE and not shared.mig_profiles
    assert (shared.split_count, shared.memory_mib) == (10, 2 * 81920)
    assert d.topology is not None and len(d.topology.uuids) == 4


def test_registration_round_trips_with_profiles() -> None:
    d = mixed()
    value = publish.topology_annotations(d, register=True)[keys.NODE_REGISTER]
    assert registrations.decode(value) == d.devices
    wire = msgspec.json.decode(value)
    assert wire[0]["mode"] == "mig" and wire[0]["count"] == 7
    assert [p["name"] for p in wire[0]["migProfiles"]] == [
        p.name for p in fake.MIG_PROFILES["A100-SXM4-80GB"]
    ]
    assert wire[0]["migProfiles"][3]["placements"] == [{"start": 0, "size": 4}, {"start": 4, "size": 4}]
    assert "migProfiles" not in wire[2]


def test_h100_mig_shape() -> None:
    records = collect.inventory(fake.FakeBackend(fake.shape("h100-8-mig")))
    d = discover.discover(records, discover.RegistrationConfig())
    assert len(d.devices) == 8
    assert all(x.is_mig and x.mig_profiles == fake.MIG_PROFILES["H100-SXM5-80GB"] for x in d.devices)


def test_allowlist_as_hami() -> None:
    """HAMi's default list for this card names 7g.79gb: the 7g profile, registered under that name."""
    allow = (
        discover.MigAllowlist(models=("H100",), profiles=("1g.10gb",)),
        discover.MigAllowlist(
            models=("A100-SXM4-80GB",), profiles=("1g.10gb", "1g.20gb", "3g.40gb", "7g.79gb")
        ),
    )
    d = mixed(discover.RegistrationConfig(mig_allowlist=allow))
    got = d.devices[0].mig_profiles
    assert [p.name for p in got] == ["1g.10gb", "1g.20gb", "3g.40gb", "7g.79gb"]
    by_name = {p.name: p for p in fake.MIG_PROFILES["A100-SXM4-80GB"]}
    assert got[1] == by_name["1g.20gb"]  # an exact name wins over the 1g slice key
    assert got[3] == msgspec.structs.replace(by_name["7g.80gb"], name="7g.79gb")
    assert d.devices[0].split_count == 7
    assert d.devices[2].mode == devices.MODE_HAMI_CORE  # allowlists do not touch shared cards


def test_allowlist_without_the_model_leaves_mig_cards_out() -> None:
    allow = (discover.MigAllowlist(models=("A30",), profiles=("1g.6gb",)),)
    d = mixed(discover.RegistrationConfig(mig_allowlist=allow))
    assert [x.index for x in d.devices] == [2, 3]
    assert sum("no MIG profile" in n for n in d.notes) == 2


@pytest.mark.parametrize("bad", ["", "g.10gb", "1g", "xg.5gb", "1c.10gb"])
def test_allowlist_rejects_bad_names(bad: str) -> None:
    with pytest.raises(ValueError):
        discover.MigAllowlist(models=("A100",), profiles=(bad,))
    with pytest.raises(ValueError):
        discover.MigAllowlist(models=(), profiles=("1g.5gb",))
