"""The memoized fragmentation measures against a plain reference, on nodes of 1-16 cards.

``Fragmentation.of`` (FGD) and ``RepeatedFragmentation.of`` (fgd-lookahead) key their memo on the
CPU level a node reaches instead of its free CPU. One measure instance is shared by every node of
a cluster (it lives as long as the workload histogram), so the key must be exact across card
counts: a value memoized for one node must never answer a node it does not describe. The
reference below is the definition shape by shape (in the integer weight units of ``fragscore``),
so it also checks the sorted-prefix arithmetic of ``_compute``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.policy import api, fragmentation, fragscore, lookahead, shares

pytestmark = pytest.mark.unit

MODELS = ("NVIDIA A100-SXM4-80GB", "Tesla T4")
CPUS = (0, 500, 1000, 2500, 4000)

cpu_levels = st.sampled_from(CPUS) | st.integers(0, 16000)
types = st.sampled_from([(), ("T4",), ("A100",)])
sharing = st.builds(
    api.Shape,
    cpu_milli=cpu_levels,
    share_milli=st.integers(1, 999),
    count=st.integers(1, 3),
    types=types,
)
whole = st.builds(
    api.Shape, cpu_milli=cpu_levels, share_milli=st.just(1000), count=st.integers(1, 16), types=types
)
cpu_only = st.builds(api.Shape, cpu_milli=cpu_levels, share_milli=st.just(0), count=st.just(0))


@st.composite
def workloads(draw: st.DrawFn) -> api.Workload:
    shapes = draw(st.lists(sharing | whole | cpu_only, min_size=1, max_size=5, unique=True))
    weights = draw(st.lists(st.integers(1, 10), min_size=len(shapes), max_size=len(shapes)))
    return api.Workload(tuple(shapes), tuple(w / sum(weights) for w in weights))


free_milli = st.sampled_from((0, 250, 500, 1000)) | st.integers(0, 1000)
free_cards = st.lists(free_milli, min_size=1, max_size=16).map(tuple)

MEASURES = {"fgd": fragmentation.Fragmentation, "fgd-lookahead": lookahead.RepeatedFragmentation}


def weights(measure: str, workload: api.Workload, model: str) -> tuple[int, ...]:
    """The weights on a node of ``model``: the histogram's (FGD), or, for fgd-lookahead without a
    capacity (every shape reaches every card, none is scarce), each shape the model serves weighs
    ``p / Z`` with Z the weight of those shapes (CPU-only ones included) and the others 0."""
    if measure == "fgd":
        return fragscore.quantize(workload.weights)
    pairs = list(zip(workload.shapes, workload.weights, strict=True))
    serves = [s.count == 0 or shares.type_allowed(model, s.types) for s, _ in pairs]
    cpu = sum(p for s, p in pairs if s.count == 0)
    z = cpu + sum(p for (s, p), ok in zip(pairs, serves, strict=True) if ok and s.count > 0)
    return fragscore.quantize([p / z if ok else 0.0 for (_, p), ok in zip(pairs, serves, strict=True)])


def reference(measure: str, workload: api.Workload, model: str, cpu: int, free: tuple[int, ...]) -> int:
    """F = sum_m w_m F_n(m), each term straight from its definition (module docstrings)."""
    total = sum(free)
    out = 0
    for s, w in zip(workload.shapes, weights(measure, workload, model), strict=True):
        fit = [f for f in free if f >= s.share_milli]
        if s.count == 0 or not shares.type_allowed(model, s.types):
            out += w * total
        elif measure == "fgd-lookahead" and s.share_milli < shares.FULL:
            tasks = len(fit) // s.count
            if s.cpu_milli > 0:
                tasks = min(tasks, max(cpu, 0) // s.cpu_milli)
            out += w * (total - sum(sorted(free, reverse=True)[: tasks * s.count]))
        elif cpu >= s.cpu_milli and len(fit) >= s.count:
            out += w * (total - sum(fit))
        else:
            out += w * total
    return out


@pytest.mark.parametrize("measure", list(MEASURES), ids=str)
@settings(max_examples=300, deadline=None)
@given(workload=workloads(), pool=st.lists(free_cards, min_size=1, max_size=4), data=st.data())
def test_memoized_measure_equals_the_uncached_one(
    measure: str, workload: api.Workload, pool: list[tuple[int, ...]], data: st.DataObject
) -> None:
    frag = MEASURES[measure](workload)
    shape_cpus = sorted({s.cpu_milli for s in workload.shapes} | {1})
    # CPU levels near multiples of the shapes' CPU (where task counts change), and anywhere.
    near_steps = st.builds(
        lambda c, k, d: c * k + d, st.sampled_from(shape_cpus), st.integers(0, 20), st.integers(-1, 1)
    )
    for _ in range(data.draw(st.integers(1, 40), label="calls")):
        free = data.draw(st.sampled_from(pool), label="free")
        cpu = data.draw(near_steps | st.integers(-2000, 100_000), label="cpu")
        model = data.draw(st.sampled_from(MODELS), label="model")
        expected = reference(measure, workload, model, cpu, free)
        assert frag.of(model, cpu, free) == expected, (model, cpu, free)
