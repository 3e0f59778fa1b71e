"""``gpuslice.io/gpu-topology``'s optional bandwidth matrix: round trip and backward compatibility."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslice.codec import errors, topology
from gpuslice.model import topology as model

pytestmark = pytest.mark.unit

OLD = '{"v":1,"uuids":["GPU-a","GPU-b"],"nvlink":[[0,12],[12,0]],"pcie":[[0,10],[10,0]],"p2p":[[0,1],[1,0]]}'


def test_an_annotation_without_bandwidth_still_decodes() -> None:
    got = topology.decode_topology(OLD).topology
    assert got.bandwidth is None and got.pair_bandwidth(0, 1) is None and got.nvlinks[0][1] == 12


def test_without_bandwidth_the_encoding_is_unchanged() -> None:
    topo = topology.decode_topology(OLD).topology
    assert json.loads(topology.encode_topology(topo)) == json.loads(OLD)


@given(
    st.integers(1, 6).flatmap(
        lambda n: st.lists(
            st.lists(st.floats(0, 2000, allow_nan=False).map(lambda x: round(x, 3)), min_size=n, max_size=n),
            min_size=n,
            max_size=n,
        )
    )
)
def test_round_trip(bw: list[list[float]]) -> None:
    n = len(bw)
    base = model.uniform(tuple(f"GPU-{i}" for i in range(n)))
    topo = model.Topology(
        uuids=base.uuids,
        nvlinks=base.nvlinks,
        pcie=base.pcie,
        p2p=base.p2p,
        bandwidth=tuple(tuple(row) for row in bw),
    )
    assert topology.decode_topology(topology.encode_topology(topo)).topology == topo


@pytest.mark.parametrize(
    "bw",
    ["[[0,1]]", "[[0,-1],[1,0]]", '[[0,"x"],[1,0]]'],
)
def test_bad_bandwidth_is_refused(bw: str) -> None:
    value = OLD[:-1] + f',"bw":{bw}}}'
    with pytest.raises(errors.DecodeError):
        topology.decode_topology(value)


def test_pair_bandwidth_takes_the_weaker_direction() -> None:
    base = model.uniform(("a", "b"))
    topo = model.Topology(
        uuids=base.uuids,
        nvlinks=base.nvlinks,
        pcie=base.pcie,
        p2p=base.p2p,
        bandwidth=((0.0, 50.0), (25.0, 0.0)),
    )
    assert topo.pair_bandwidth(0, 1) == topo.pair_bandwidth(1, 0) == 25.0
