"""A node's card-pair tables in device order, derived once per topology (shared and memoised).

* ``weights[i][j]``: HAMi's pair score (PCIe level score + 100 per NVLink), the smaller of the
  two directions so asymmetric links count as their weaker side; 0 where the topology does not
  list a card (and everywhere without a topology).
* ``pcie[i][j]``: ``2 * (50 - level)`` on 0..100 (same board 100 ... across CPUs 0), the worse
  direction; ``NEUTRAL`` for unlisted cards.
* ``p2p[i][j]``: 100 for NVLink (both directions), 50 for PCIe peer-to-peer, else 0; ``NEUTRAL``
  for unlisted cards.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from gpuslice.model import nodes, topology

NEUTRAL = 50
Matrix = tuple[tuple[int, ...], ...]


class LinkTables(NamedTuple):
    """Pair tables of one node, indexed by device position (see the module docstring)."""

    weights: Matrix
    pcie: Matrix
    p2p: Matrix
    known: bool


def of(inventory: nodes.NodeInventory) -> LinkTables:
    """The node's tables (all-zero weights and ``known=False`` without a topology)."""
    return _tables(inventory.topology, tuple(d.uuid for d in inventory.devices))


@functools.lru_cache(maxsize=4096)
def _tables(topo: topology.Topology | None, uuids: tuple[str, ...]) -> LinkTables:
    n = len(uuids)
    if topo is None:
        zero = tuple((0,) * n for _ in range(n))
        return LinkTables(zero, zero, zero, False)
    pos = [topo.position(u) for u in uuids]
    w: list[tuple[int, ...]] = []
    pc: list[tuple[int, ...]] = []
    pp: list[tuple[int, ...]] = []
    for i in range(n):
        wr, pr, qr = [], [], []
        for j in range(n):
            a, b = pos[i], pos[j]
            if i == j or a is None or b is None:
                wr.append(0)
                pr.append(NEUTRAL if i != j else 100)
                qr.append(NEUTRAL if i != j else 100)
                continue
            wr.append(min(topo.pair_score(a, b), topo.pair_score(b, a)))
            pr.append(2 * (topology.PcieLevel.SYSTEM - max(topo.pcie[a][b], topo.pcie[b][a])))
            nv = min(topo.nvlinks[a][b], topo.nvlinks[b][a])
            qr.append(100 if nv > 0 else 50 if topo.p2p[a][b] else 0)
        w.append(tuple(wr))
        pc.append(tuple(pr))
        pp.append(tuple(qr))
    return LinkTables(tuple(w), tuple(pc), tuple(pp), True)
