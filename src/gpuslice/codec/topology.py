"""GPU interconnect topology annotations: HAMi's pair scores and gpuslice's full matrices.

``hami.io/node-nvidia-score`` (HAMi device plugin, docs/hami-compat.md section 11)::

    [{"uuid":"GPU-a","score":{"GPU-b":600,"GPU-c":20}}, ...]

A score is 100 per NVLink plus the PCIe relation (SYSTEM 10 ... same board 60), so a pair score
converts back to a best-effort ``Topology``. ``gpuslice.io/gpu-topology`` (gpuslice node agent)
carries what the scores lose, versioned for later additions::

    {"v":1,"uuids":["GPU-a","GPU-b"],"nvlink":[[0,12],[12,0]],"pcie":[[0,10],[10,0]],
     "p2p":[[0,1],[1,0]],"numa":[0,0]}

``nvlink`` counts active links, ``pcie`` holds NVML ``nvmlGpuTopologyLevel_t`` values, ``p2p``
is 0/1 and ``numa`` (optional) the NUMA node per card. ``bw`` (optional, added later) is the
link bandwidth of each pair in GB/s per direction (``gpuslice.agent.bandwidth``, docs/topology.md):
NVLink pairs their links times the per-link rate, other pairs the slower card's PCIe link; 0 on
the diagonal and where unknown. Unknown keys are ignored, so fields can be added without a new
version, and an annotation without ``bw`` decodes with ``Topology.bandwidth`` None.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import msgspec

from gpuslice.codec import errors, keys
from gpuslice.model import limits, topology

VERSION = 1

_LEVEL_BY_SCORE = {
    topology.hami_pair_score(level, 0): level for level in topology.PcieLevel
}  # 10 -> SYSTEM ... 60 -> INTERNAL

PairScores = Mapping[str, Mapping[str, int]]
"""Per card UUID, its score against each other card UUID."""


class _PairWire(msgspec.Struct, frozen=True):
    uuid: str = ""
    score: dict[str, int] | None = None


class _TopologyWire(msgspec.Struct, frozen=True, omit_defaults=True):
    v: int
    uuids: list[str]
    nvlink: list[list[int]]
    pcie: list[list[int]]
    p2p: list[list[int]]
    numa: list[int] | None = None
    bw: list[list[float]] | None = None


class TopologyAnnotation(msgspec.Struct, frozen=True, kw_only=True):
    """A decoded ``gpuslice.io/gpu-topology``: the matrices and the NUMA node per card, if given."""

    topology: topology.Topology
    numa: tuple[int, ...] | None = None


_PAIR_DECODER = msgspec.json.Decoder(list[_PairWire])
_TOPOLOGY_DECODER = msgspec.json.Decoder(_TopologyWire)
_ENCODER = msgspec.json.Encoder()


def decode_pair_scores(value: str) -> dict[str, dict[str, int]]:
    """HAMi's pair scores by UUID, in annotation order (the first entry of a UUID wins, as in HAMi).

    Raises:
        DecodeError: not a JSON array of ``{"uuid", "score"}`` objects with integer scores, or a
            score above ``limits.MAX_PAIR_SCORE`` (more NVLinks than a card has).
    """
    try:
        wire = _PAIR_DECODER.decode(value)
    except (msgspec.DecodeError, UnicodeError) as exc:
        raise errors.DecodeError(keys.NODE_PAIR_SCORE, "json", f"invalid pair scores: {exc}") from None
    out: dict[str, dict[str, int]] = {}
    for entry in wire:
        scores = dict(entry.score or {})
        high = max(scores.values(), default=0)
        if high > limits.MAX_PAIR_SCORE:
            raise errors.DecodeError(
                keys.NODE_PAIR_SCORE, entry.uuid, f"pair score {high} above {limits.MAX_PAIR_SCORE}"
            )
        out.setdefault(entry.uuid, scores)
    return out


def encode_score_matrix(uuids: Sequence[str], scores: Sequence[Sequence[int]]) -> str:
    """HAMi's pair-score annotation from a score matrix (``scores[i][j]`` by position in ``uuids``).

    The diagonal is skipped: every card is scored against every other card.

    Raises:
        ValueError: the matrix is not ``len(uuids)`` square.
    """
    n = len(uuids)
    if len(scores) != n or any(len(row) != n for row in scores):
        raise ValueError(f"score matrix must be {n}x{n}")
    wire = [
        _PairWire(uuid=u, score={v: int(scores[i][j]) for j, v in enumerate(uuids) if j != i})
        for i, u in enumerate(uuids)
    ]
    return _ENCODER.encode(wire).decode()


def encode_pair_scores(topo: topology.Topology) -> str:
    """HAMi's pair-score annotation for a topology (100 per NVLink plus the PCIe level score)."""
    n = len(topo.uuids)
    return encode_score_matrix(topo.uuids, [[topo.pair_score(i, j) for j in range(n)] for i in range(n)])


def _from_score(score: int | None) -> tuple[int, topology.PcieLevel]:
    """NVLink count and PCIe level behind a HAMi score; unknown remainders read as SYSTEM."""
    if score is None or score <= 0:
        return 0, topology.PcieLevel.SYSTEM
    links, rest = divmod(score, topology.NVLINK_SCORE)
    return links, _LEVEL_BY_SCORE.get(rest, topology.PcieLevel.SYSTEM)


def topology_from_pair_scores(scores: PairScores, order: Sequence[str] = ()) -> topology.Topology:
    """A best-effort topology from HAMi's scores: NVLinks = score // 100, PCIe from the remainder.

    Args:
        scores: decoded pair scores.
        order: card UUIDs in the wanted row order (e.g. registration order); UUIDs that only the
            scores know are appended in the order they appear.

    A missing or zero score (HAMi writes 0 for asymmetric links) reads as no NVLink across CPUs.
    P2P is assumed where an NVLink or at most a host bridge separates the cards.
    """
    uuids: dict[str, None] = dict.fromkeys(order)
    for u, row in scores.items():
        uuids.setdefault(u, None)
        for v in row:
            uuids.setdefault(v, None)
    ids = tuple(uuids)
    cells = [
        [
            (0, topology.PcieLevel.INTERNAL) if i == j else _from_score(scores.get(a, {}).get(b))
            for j, b in enumerate(ids)
        ]
        for i, a in enumerate(ids)
    ]
    return topology.Topology(
        uuids=ids,
        nvlinks=tuple(tuple(c[0] for c in row) for row in cells),
        pcie=tuple(tuple(c[1] for c in row) for row in cells),
        p2p=tuple(
            tuple(i != j and (c[0] > 0 or c[1] <= topology.PcieLevel.HOSTBRIDGE) for j, c in enumerate(row))
            for i, row in enumerate(cells)
        ),
    )


def encode_topology(topo: topology.Topology, numa: Sequence[int] | None = None) -> str:
    """``gpuslice.io/gpu-topology`` for a topology and, optionally, the NUMA node of each card."""
    wire = _TopologyWire(
        v=VERSION,
        uuids=list(topo.uuids),
        nvlink=[list(row) for row in topo.nvlinks],
        pcie=[[int(level) for level in row] for row in topo.pcie],
        p2p=[[int(b) for b in row] for row in topo.p2p],
        numa=None if numa is None else list(numa),
        bw=None if topo.bandwidth is None else [[float(x) for x in row] for row in topo.bandwidth],
    )
    return _ENCODER.encode(wire).decode()


def _fail(field: str, detail: str) -> errors.DecodeError:
    return errors.DecodeError(keys.GPU_TOPOLOGY, field, detail)


def _square(name: str, matrix: list[list[int]] | list[list[float]], n: int) -> None:
    if len(matrix) != n or any(len(row) != n for row in matrix):
        raise _fail(name, f"{name} must be a {n}x{n} matrix")


def decode_topology(value: str) -> TopologyAnnotation:
    """Decode ``gpuslice.io/gpu-topology`` (version 1).

    Raises:
        DecodeError: malformed JSON, another version, non-square matrices, unknown PCIe levels,
            link counts outside 0..``limits.MAX_NVLINKS``, P2P entries other than 0/1, duplicate
            UUIDs, a bandwidth matrix that is not square or holds negative or non-finite values.
    """
    try:
        wire = _TOPOLOGY_DECODER.decode(value)
    except (msgspec.DecodeError, UnicodeError) as exc:
        raise _fail("json", f"invalid topology: {exc}") from None
    if wire.v != VERSION:
        raise _fail("v", f"unsupported topology version {wire.v}")
    n = len(wire.uuids)
    if len(set(wire.uuids)) != n:
        raise _fail("uuids", "duplicate card UUIDs")
    for name, matrix in (("nvlink", wire.nvlink), ("pcie", wire.pcie), ("p2p", wire.p2p)):
        _square(name, matrix, n)
    if any(not 0 <= x <= limits.MAX_NVLINKS for row in wire.nvlink for x in row):
        raise _fail("nvlink", f"NVLink counts must be in 0..{limits.MAX_NVLINKS}")
    if any(x not in (0, 1) for row in wire.p2p for x in row):
        raise _fail("p2p", "p2p entries must be 0 or 1")
    valid = {int(level) for level in topology.PcieLevel}
    if any(x not in valid for row in wire.pcie for x in row):
        raise _fail("pcie", f"PCIe levels must be one of {sorted(valid)}")
    if wire.numa is not None and len(wire.numa) != n:
        raise _fail("numa", f"numa must list {n} nodes")
    if wire.bw is not None:
        _square("bw", wire.bw, n)
        if any(not math.isfinite(x) or x < 0 for row in wire.bw for x in row):
            raise _fail("bw", "bandwidths must be finite and non-negative")
    topo = topology.Topology(
        uuids=tuple(wire.uuids),
        nvlinks=tuple(tuple(row) for row in wire.nvlink),
        pcie=tuple(tuple(topology.PcieLevel(x) for x in row) for row in wire.pcie),
        p2p=tuple(tuple(bool(x) for x in row) for row in wire.p2p),
        bandwidth=None if wire.bw is None else tuple(tuple(float(x) for x in row) for row in wire.bw),
    )
    return TopologyAnnotation(topology=topo, numa=None if wire.numa is None else tuple(wire.numa))
