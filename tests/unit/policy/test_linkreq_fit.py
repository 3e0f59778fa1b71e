"""The filter honours ``gpu-topology-requirement``: card sets, reasons, codes, the card policy's choice."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.framework import registry
from gpuslice.model import requests, status
from gpuslice.policy import fit, linkreq
from tests.unit.builders import bridged, node, pod, uuid

pytestmark = pytest.mark.unit

NVLINK = requests.TopologyRequirement(require_nvlink=True)


def with_req(p: requests.PodRequest, link: requests.TopologyRequirement) -> requests.PodRequest:
    return msgspec.structs.replace(p, topology=link)


def chosen(placement: fit.Placement) -> tuple[str, ...]:
    assert placement.allocation is not None
    return tuple(g.uuid for g in placement.allocation.containers[0])


BINPACK = registry.get("binpack")


def test_nvlink_pair_is_chosen_over_the_policys_favourite() -> None:
    # cards 0 and 1 are in use (binpack would take them), only 2-3 are bridged
    state = node().gpus(4).used(0, memory=1000).used(1, memory=1000).topo(bridged("n1", 4, [(2, 3)])).state()
    p = with_req(pod().gpu(2, memory=1000).obj(), NVLINK)
    assert chosen(fit.place(state, pod().gpu(2, memory=1000).obj(), BINPACK)) == (
        uuid("n1", 0),
        uuid("n1", 1),
    )
    assert chosen(fit.place(state, p, BINPACK)) == (uuid("n1", 2), uuid("n1", 3))


def test_no_nvlink_pair_at_all_is_unresolvable() -> None:
    state = node().gpus(4).topo(bridged("n1", 4, [])).state()
    got = fit.place(state, with_req(pod().gpu(2).obj(), NVLINK), BINPACK)
    assert got.status == status.Status(status.Code.UNRESOLVABLE, (status.NVLINK_REQUIRED,))
    assert (status.NVLINK_REQUIRED, 4) in got.card_reasons


def test_a_busy_nvlink_pair_is_unschedulable() -> None:
    state = node().gpus(4).used(2, memory=81920).topo(bridged("n1", 4, [(2, 3)])).state()
    got = fit.place(state, with_req(pod().gpu(2, memory=1000).obj(), NVLINK), BINPACK)
    assert got.status == status.Status(status.Code.UNSCHEDULABLE, (status.NVLINK_REQUIRED,))


def test_without_topology_nvlink_cannot_be_had() -> None:
    state = node().gpus(4).state()
    got = fit.place(state, with_req(pod().gpu(2).obj(), NVLINK), BINPACK)
    assert got.status.code is status.Code.UNRESOLVABLE and got.status.reasons == (status.NVLINK_REQUIRED,)


def test_minimum_bandwidth() -> None:
    state = node().gpus(4).topo(bridged("n1", 4, [(0, 1)], links=2)).state()  # 0-1: 50 GB/s; others 31.5
    fast = requests.TopologyRequirement(min_bandwidth_gbps=50)
    assert chosen(fit.place(state, with_req(pod().gpu(2).obj(), fast), BINPACK)) == (
        uuid("n1", 0),
        uuid("n1", 1),
    )
    three = fit.place(state, with_req(pod().gpu(3).obj(), fast), BINPACK)
    assert three.status == status.Status(status.Code.UNRESOLVABLE, (status.INSUFFICIENT_GPU_BANDWIDTH,))
    pcie_ok = requests.TopologyRequirement(min_bandwidth_gbps=31.5)  # the published figure itself is enough
    assert fit.place(state, with_req(pod().gpu(4).obj(), pcie_ok), BINPACK).status.ok


def test_bandwidth_without_a_published_matrix_is_not_met() -> None:
    state = node().gpus(2).uniform_topo(nvlinks=12).state()  # HAMi-style topology: links but no bandwidth
    assert fit.place(state, with_req(pod().gpu(2).obj(), NVLINK), BINPACK).status.ok
    got = fit.place(
        state, with_req(pod().gpu(2).obj(), requests.TopologyRequirement(min_bandwidth_gbps=1)), BINPACK
    )
    assert got.status.reasons == (status.INSUFFICIENT_GPU_BANDWIDTH,)


def test_nvlink_and_bandwidth_name_nvlink_when_nvlink_is_what_is_missing() -> None:
    state = node().gpus(3).topo(bridged("n1", 3, [])).state()
    both = requests.TopologyRequirement(require_nvlink=True, min_bandwidth_gbps=10)
    assert fit.place(state, with_req(pod().gpu(2).obj(), both), BINPACK).status.reasons == (
        status.NVLINK_REQUIRED,
    )
    state = node().gpus(3).topo(bridged("n1", 3, [(0, 1)], links=1)).state()  # 25 GB/s NVLink
    both = requests.TopologyRequirement(require_nvlink=True, min_bandwidth_gbps=40)
    got = fit.place(state, with_req(pod().gpu(2).obj(), both), BINPACK)
    assert got.status.reasons == (status.INSUFFICIENT_GPU_BANDWIDTH,)


def test_single_card_requests_are_unaffected() -> None:
    state = node().gpus(2).topo(bridged("n1", 2, [])).state()
    assert fit.place(state, with_req(pod().gpu(1).obj(), NVLINK), BINPACK).status.ok
    assert not linkreq.active(with_req(pod().gpu(1).obj(), NVLINK))
    assert linkreq.active(with_req(pod().gpu(2).obj(), NVLINK))


def test_cliques_of_a_hybrid_cube_mesh() -> None:
    # DGX-1-like: two fully connected quads 0-3 and 4-7, plus links i <-> i+4
    edges = {(a, b) for q in (range(4), range(4, 8)) for a, b in itertools.combinations(q, 2)}
    edges |= {(i, i + 4) for i in range(4)}
    ok = tuple(tuple((min(i, j), max(i, j)) in edges for j in range(8)) for i in range(8))
    got = linkreq.cliques(ok, tuple(range(8)), 3)
    assert got == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert linkreq.cliques(ok, tuple(range(8)), 2)[:4] == [(0, 4), (1, 5), (2, 6), (3, 7)]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 7).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))),
            st.integers(2, 4),
            st.sets(st.integers(0, n - 1)),
        )
    )
)
def test_fit_finds_a_satisfying_set_exactly_when_one_exists(
    case: tuple[int, set[tuple[int, int]], int, set[int]],
) -> None:
    n, raw, k, busy = case
    pairs = sorted({(min(a, b), max(a, b)) for a, b in raw if a != b})
    b = node().gpus(n)
    for i in busy:
        b = b.used(i, memory=81920)
    state = b.topo(bridged("n1", n, pairs)).state()
    got = fit.place(state, with_req(pod().gpu(k, memory=1000).obj(), NVLINK), BINPACK)
    free = [i for i in range(n) if i not in busy]
    linked = set(pairs)
    exists = any(
        all((x, y) in linked for x, y in itertools.combinations(s, 2))
        for s in itertools.combinations(free, k)
    )
    assert got.status.ok == exists
    if got.status.ok:
        idx = sorted(int(u.rsplit("-", 1)[1]) for u in chosen(got))
        assert all((x, y) in linked for x, y in itertools.combinations(idx, 2))
    elif k <= n:
        anywhere = any(
            all((x, y) in linked for x, y in itertools.combinations(s, 2))
            for s in itertools.combinations(range(n), k)
        )
        assert got.status.code is (status.Code.UNSCHEDULABLE if anywhere else status.Code.UNRESOLVABLE)
