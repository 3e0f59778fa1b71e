"""Per-snapshot indexes the policy context needs: where each job's pods are, when telemetry was read.

``job_nodes`` answers, for one pod's job, which nodes hold its other pods (``nodes.JobOnNode``,
from each ``NodeState.jobs``); ``telemetry_rows`` lays every node's ``NodeInventory.telemetry_at``
out by row of the snapshot's ``columns.NodeColumns`` (NaN = unknown), for ``thermal.stale_rows``.

Both scan every node once per node map (the cache shares the map between snapshots while no node
changed) and keep the last result, keyed by the identity of the object they were built from (held,
so the identity cannot be reused). Pure: the time itself is never read here.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Mapping

import numpy as np

from gpuslice.model import nodes
from gpuslice.policy import columns

_EMPTY: Mapping[str, nodes.JobOnNode] = types.MappingProxyType({})
_lock = threading.Lock()
_jobs_memo: tuple[object, dict[str, dict[str, nodes.JobOnNode]]] | None = None
_rows_memo: tuple[object, object, np.ndarray] | None = None


def _index(states: Mapping[str, nodes.NodeState]) -> dict[str, dict[str, nodes.JobOnNode]]:
    global _jobs_memo
    memo = _jobs_memo
    if memo is not None and memo[0] is states:
        return memo[1]
    out: dict[str, dict[str, nodes.JobOnNode]] = {}
    for name, state in states.items():
        for j in state.jobs:
            out.setdefault(j.job, {})[name] = j
    with _lock:
        _jobs_memo = (states, out)
    return out


def job_nodes(states: Mapping[str, nodes.NodeState], job: str) -> Mapping[str, nodes.JobOnNode]:
    """Node name -> the job's pods there, for every node holding some (empty for '' or none)."""
    if not job:
        return _EMPTY
    got = _index(states).get(job)
    return _EMPTY if got is None else types.MappingProxyType(got)


def telemetry_rows(states: Mapping[str, nodes.NodeState], cols: columns.NodeColumns) -> np.ndarray:
    """Per row of ``cols``, its node's ``telemetry_at`` (NaN where unknown or not in ``states``)."""
    global _rows_memo
    memo = _rows_memo
    if memo is not None and memo[0] is states and memo[1] is cols:
        return memo[2]
    out = np.full(cols.nodes.shape[0], np.nan, np.float64)
    for name, row in cols.row_of.items():
        state = states.get(name)
        if state is not None and state.inventory.telemetry_at is not None:
            out[row] = state.inventory.telemetry_at
    out.setflags(write=False)
    with _lock:
        _rows_memo = (states, cols, out)
    return out
