"""Workload construction (fgd-experiment.md section 3) and FGD's target workload M."""

from __future__ import annotations

import pytest

from gpuslice.sim import trace, workload

pytestmark = pytest.mark.unit


def pods(spec: list[tuple[int, int, int, int]]) -> list[trace.TracePod]:
    """(repeat, cpu, share, count) -> trace pods named in order."""
    out: list[trace.TracePod] = []
    for r, cpu, share, count in spec:
        for _ in range(r):
            out.append(trace.make_pod(f"p{len(out):03d}", cpu, 0, count, share))
    return out


@pytest.mark.parametrize(
    ("coverage", "expected"),
    [
        # 5 + 3 = 8 of 10 pods = 80 % -> stop; weights 5/8, 3/8
        (0.8, [((1000, 500, 1), 5 / 8), ((2000, 1000, 1), 3 / 8)]),
        # 5 + 3 + 1 = 90 % < 95 % -> one more; the tie (1 pod each) is ordered by (count, share, cpu)
        (0.95, [((1000, 500, 1), 0.5), ((2000, 1000, 1), 0.3), ((3000, 0, 0), 0.1), ((4000, 1000, 2), 0.1)]),
    ],
    ids=["80pct", "95pct"],
)
def test_target_workload(coverage: float, expected: list[tuple[tuple[int, int, int], float]]) -> None:
    w = pods([(5, 1000, 500, 1), (3, 2000, 1000, 1), (1, 4000, 1000, 2), (1, 3000, 0, 0)])
    m = workload.target_workload(w, coverage)
    got = [((s.cpu_milli, s.share_milli, s.count), p) for s, p in zip(m.shapes, m.weights, strict=True)]
    assert [g[0] for g in got] == [e[0] for e in expected]
    assert [g[1] for g in got] == pytest.approx([e[1] for e in expected])


def test_inflate_to_target() -> None:
    # demand 4 * 500 + 2 * 1000 = 4000 milli of 4000 capacity; tune 1.5 -> target 6000
    w = pods([(4, 1000, 500, 1), (2, 1000, 1000, 1), (2, 500, 0, 0)])
    a = workload.arrivals(w, node_count=5, capacity_milli=4000, seed=42, tune=1.5)
    assert sorted(a.seq[: len(w)].tolist()) == list(range(len(w)))  # the whole trace, shuffled
    assert len(a.seq) > len(w)
    demand = sum(w[i].gpu_milli for i in a.seq.tolist())
    assert demand == a.demand_milli <= 6000
    assert sorted(a.node_order.tolist()) == list(range(5))
    again = workload.arrivals(w, node_count=5, capacity_milli=4000, seed=42, tune=1.5)
    assert again.seq.tolist() == a.seq.tolist() and again.node_order.tolist() == a.node_order.tolist()
    other = workload.arrivals(w, node_count=5, capacity_milli=4000, seed=43, tune=1.5)
    assert other.seq.tolist() != a.seq.tolist()


def test_tune_down() -> None:
    # demand 8 * 1000 = 8000 of capacity 10000, tune 0.5 -> drop random pods until <= 5000
    w = pods([(8, 1000, 1000, 1)])
    a = workload.arrivals(w, node_count=2, capacity_milli=10000, seed=1, tune=0.5)
    assert a.demand_milli == 5000 and len(a.seq) == 5
    assert len(set(a.seq.tolist())) == 5


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ((0, 1000, 0, 0), (100, 0, 0)),  # CPU 0 means 100; no GPUs
        ((500, 2000, 1, 1500), (500, 1000, 1)),  # share clipped to 1000
        ((500, 333, 1, 333), (500, 340, 1)),  # share rounded up to a multiple of 10
    ],
    ids=["cpu-zero", "clip", "round-up"],
)
def test_make_pod_conventions(raw: tuple[int, int, int, int], expected: tuple[int, int, int]) -> None:
    cpu, mem, n, d = raw
    p = trace.make_pod("x", cpu, mem, n, d)
    assert (p.cpu_milli, p.share, p.count) == expected
