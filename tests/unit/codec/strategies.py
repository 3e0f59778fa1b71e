"""Hypothesis strategies for codec values."""

from __future__ import annotations

import datetime as dt
from typing import TypeVar

from hypothesis import settings
from hypothesis import strategies as st

from gpuslice.codec import goparse
from gpuslice.model import allocations, devices, nodes, topology

RELAXED = settings(deadline=None)
"""No per-example deadline: the CI runners are shared and a slow example is not a failure."""

int32 = st.integers(goparse.INT32_MIN, goparse.INT32_MAX)
nonneg32 = st.integers(0, goparse.INT32_MAX)


def text_without(forbidden: str, max_size: int = 20) -> st.SearchStrategy[str]:
    return st.text(
        st.characters(blacklist_characters=forbidden, blacklist_categories=["Cs"]), max_size=max_size
    )


def gpu_devices(
    field_text: st.SearchStrategy[str], index: st.SearchStrategy[int] = int32
) -> st.SearchStrategy[devices.GpuDevice]:
    return st.builds(
        devices.GpuDevice,
        uuid=field_text,
        index=index,
        type=field_text,
        memory_mib=int32,
        cores=int32,
        split_count=int32,
        numa=int32,
        mode=field_text,
        health=st.booleans(),
    )


json_cards = st.lists(gpu_devices(st.text(max_size=20)), max_size=6)
legacy_cards = st.lists(gpu_devices(text_without(",:"), index=nonneg32), max_size=6)

grants = st.builds(
    allocations.DeviceGrant,
    uuid=text_without(",:;"),
    vendor=text_without(",:;"),
    memory_mib=int32,
    cores=int32,
)
container_lists = st.lists(st.lists(grants, max_size=4).map(tuple), max_size=6).map(tuple)


T = TypeVar("T")


def _matrix(
    draw: st.DrawFn, n: int, values: st.SearchStrategy[T], diag: T, proper_diagonal: bool
) -> tuple[tuple[T, ...], ...]:
    return tuple(
        tuple(diag if proper_diagonal and i == j else draw(values) for j in range(n)) for i in range(n)
    )


@st.composite
def topologies(draw: st.DrawFn, proper_diagonal: bool = False) -> topology.Topology:
    """Random topologies; with ``proper_diagonal`` each card is INTERNAL, 0 links, no P2P to itself."""
    uuids = tuple(draw(st.lists(st.text(min_size=1, max_size=12), max_size=6, unique=True)))
    n = len(uuids)
    return topology.Topology(
        uuids=uuids,
        nvlinks=_matrix(draw, n, st.integers(0, 18), 0, proper_diagonal),
        pcie=_matrix(
            draw, n, st.sampled_from(list(topology.PcieLevel)), topology.PcieLevel.INTERNAL, proper_diagonal
        ),
        p2p=_matrix(draw, n, st.booleans(), False, proper_diagonal),
    )


instants = st.datetimes(
    min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(9000, 1, 1), timezones=st.just(dt.UTC)
)

finite = st.floats(allow_nan=False, allow_infinity=False)
telemetry_cards = st.lists(
    st.builds(
        nodes.CardTelemetry,
        uuid=st.text(max_size=12),
        temperature_c=st.none() | finite,
        power_draw_w=st.none() | finite,
        power_limit_w=st.none() | finite,
        utilization_pct=st.none() | finite,
        memory_used_mib=st.none() | st.integers(-(2**40), 2**40),
    ),
    max_size=4,
)
