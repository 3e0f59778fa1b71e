"""The simulator's half of the placement-fidelity check: a trace slice, its replay, and the comparison.

The check replays the same pods, in the same order, on the same nodes twice: here, through
``engine.Placer``, and through a real kube-scheduler calling ``gpuslice serve`` on fake nodes
(``gpuslice_dev.fidelity``; ``bench/bench_fidelity.py`` and ``tests/e2e/test_fidelity.py`` join the
two halves). Both halves exchange plain data only: node specs and pod manifests go to the cluster,
``Placement`` lists come back.

The slice (``make_slice``), all from one seed:

* nodes: ``node_count`` nodes drawn at random, without replacement, from the trace nodes with at
  least ``min_gpus`` GPUs (the trace's models, card memory per model as ``trace.MODEL_MEMORY_MIB``,
  100 cores and ``trace.SPLIT_COUNT`` tasks per card, the node's CPU and memory). The draw order is
  the simulator's node rank; the names ``fid-<rank, 3 digits>-<trace sn>`` sort in that order, so
  the extender's last tie-break (node name ascending) is the simulator's (lowest rank);
* pods: the trace's GPU pods (a CPU-only pod is not the extender's decision: it answers every node
  and scores them 0, so kube-scheduler's own scoring places it), sorted by name, shuffled and cut
  to ``tune`` x the slice's GPU capacity exactly as the FGD experiment builds its arrivals
  (``workload.arrivals``), then to at most ``pod_limit`` pods. With ``tune`` 1.0 the slice ends
  where the experiment reads U(100): arrived demand equal to capacity, the cluster near full.

The figure compared is the unallocated GPU share once every pod of the slice has arrived,
``100 * (1 - allocated milli / capacity milli)`` over the slice's nodes, with allocated milli the
sum of ``n * d`` over the placed pods (``Run.unallocated_pct``), and the pods that did not fit.
Pods stay once placed, as in the experiment.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpuslice.cache import shapes
from gpuslice.codec import keys
from gpuslice.framework import registry
from gpuslice.model import config as model_config
from gpuslice.model import devices, nodes
from gpuslice.policy import api
from gpuslice.sim import cluster, engine, trace, workload

SCHEDULER_NAME = "gpuslice-scheduler"
"""The scheduler name the pod manifests ask for (``render scheduler-config``'s default)."""
_NAMES = model_config.ResourceNames()
MAX_PODS = "1000"
"""Allocatable ``pods`` of a fake node: kube-scheduler's pod-count fit must never be the limit."""


@dataclasses.dataclass(frozen=True)
class Slice:
    """Nodes in rank order and pods in arrival order.

    Attributes:
        nodes: node inventories, rank order (names sort in that order).
        sns: the trace serial number of each node, same order.
        pods: trace pods in arrival order (a pod may appear once only).
        seed: the seed that drew them.
        tune: arrived GPU demand as a multiple of capacity before ``pod_limit``.
    """

    nodes: tuple[nodes.NodeInventory, ...]
    sns: tuple[str, ...]
    pods: tuple[trace.TracePod, ...]
    seed: int
    tune: float

    @property
    def capacity_milli(self) -> int:
        """GPU capacity of the slice's nodes."""
        return sum(len(inv.devices) for inv in self.nodes) * trace.FULL

    @property
    def demand_milli(self) -> int:
        """GPU demand ``n * d`` of all the slice's pods."""
        return sum(p.gpu_milli for p in self.pods)

    def pod_name(self, k: int) -> str:
        """The Kubernetes name of the k-th arriving pod."""
        return f"fid-p{k:04d}"

    def describe(self) -> dict[str, object]:
        """Numbers that identify the slice (for reports)."""
        models: dict[str, int] = {}
        for inv in self.nodes:
            key = f"{inv.model}x{len(inv.devices)}"
            models[key] = models.get(key, 0) + 1
        return {
            "seed": self.seed,
            "tune": self.tune,
            "nodes": len(self.nodes),
            "gpus": self.capacity_milli // trace.FULL,
            "pods": len(self.pods),
            "demand_pct_of_capacity": round(100.0 * self.demand_milli / max(1, self.capacity_milli), 2),
            "node_models": dict(sorted(models.items())),
        }


def node_name(rank: int, sn: str) -> str:
    """``fid-007-openb-node-0227``: the rank first, so name order is rank order."""
    return f"fid-{rank:03d}-{sn.lower()}"


def make_slice(
    node_count: int,
    seed: int,
    *,
    pod_limit: int | None = None,
    tune: float = 1.0,
    min_gpus: int = 4,
    nodes_path: Path | None = None,
    pods_path: Path | None = None,
) -> Slice:
    """Draw the slice (see the module docstring).

    Raises:
        ValueError: fewer than ``node_count`` trace nodes with ``min_gpus`` GPUs.
        trace.TraceError: an unreadable trace file.
    """
    all_nodes = trace.load_nodes(nodes_path or trace.data_path(trace.DEFAULT_NODES))
    pool = [inv for inv in all_nodes if len(inv.devices) >= min_gpus]
    if node_count > len(pool):
        raise ValueError(f"only {len(pool)} trace nodes have >= {min_gpus} GPUs, {node_count} asked")
    rng = np.random.default_rng([seed, 2])
    picked = [pool[int(i)] for i in rng.choice(len(pool), size=node_count, replace=False)]
    inventories = tuple(
        trace.node_inventory(
            node_name(rank, inv.name), inv.cpu_milli, inv.memory_mib, len(inv.devices), inv.model
        )
        for rank, inv in enumerate(picked)
    )
    w = workload.sorted_by_name(
        [p for p in trace.load_pods(pods_path or trace.data_path(trace.DEFAULT_PODS)) if p.count > 0]
    )
    capacity = sum(len(inv.devices) for inv in inventories) * trace.FULL
    seq = workload.arrivals(w, node_count, capacity, seed, tune).seq.tolist()
    if pod_limit is not None:
        seq = seq[:pod_limit]
    return Slice(inventories, tuple(inv.name for inv in picked), tuple(w[i] for i in seq), seed, tune)


# ----------------------------------------------------------------------------- the Kubernetes objects


def node_specs(sl: Slice) -> dict[str, dict[str, Any]]:
    """Node name -> keyword arguments of ``gpuslice_dev.nodesim.make_node`` for the slice's nodes.

    Cards as the simulator's (model, memory, 100 cores, ``trace.SPLIT_COUNT`` tasks), and the
    trace's CPU and memory as allocatable, so kube-scheduler's own fit check is the simulator's.
    """
    out: dict[str, dict[str, Any]] = {}
    for inv in sl.nodes:
        card = inv.devices[0]
        out[inv.name] = {
            "model": card.type,
            "count": len(inv.devices),
            "memory_mib": card.memory_mib,
            "split_count": card.split_count,
            "cores": card.cores,
            "numa_nodes": 1,
            "cpu": f"{inv.cpu_milli}m",
            "memory": f"{inv.memory_mib}Mi",
            "max_pods": MAX_PODS,
        }
    return out


def pod_manifest(
    pod: trace.TracePod,
    name: str,
    scheduler_name: str = SCHEDULER_NAME,
    names: model_config.ResourceNames = _NAMES,
) -> dict[str, Any]:
    """The Kubernetes pod of a trace pod, as ``trace.pod_request`` maps it (no namespace set).

    One container: ``nvidia.com/gpu`` n, ``nvidia.com/gpumem-percentage`` and ``nvidia.com/gpucores``
    d / 10 each (limits), CPU and memory requests, and the model constraint as HAMi's
    ``nvidia.com/use-gputype`` annotation.
    """
    resources: dict[str, dict[str, str]] = {"requests": {"cpu": f"{pod.cpu_milli}m"}}
    if pod.memory_mib > 0:
        resources["requests"]["memory"] = f"{pod.memory_mib}Mi"
    if pod.count > 0 and pod.share > 0:
        pct = str(pod.share * devices.FULL_CORES // trace.FULL)
        resources["limits"] = {names.count: str(pod.count), names.memory_percentage: pct, names.cores: pct}
    meta: dict[str, Any] = {"name": name, "labels": {"app": "gpuslice-fidelity"}}
    if pod.types:
        meta["annotations"] = {keys.USE_GPU_TYPE: ",".join(pod.types)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "schedulerName": scheduler_name,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "pause", "resources": resources}],
        },
    }


def pod_manifests(sl: Slice, scheduler_name: str = SCHEDULER_NAME) -> list[dict[str, Any]]:
    """The slice's pods as manifests, in arrival order."""
    return [pod_manifest(p, sl.pod_name(k), scheduler_name) for k, p in enumerate(sl.pods)]


# ----------------------------------------------------------------------------- runs


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one pod went: the node and its card indices (registration order)."""

    node: str
    cards: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Run:
    """One policy's placements of a slice, in arrival order (None = the pod did not fit).

    Attributes:
        policy: registry name.
        placements: per pod, in arrival order.
        allocated_milli: sum of ``n * d`` over the placed pods.
        capacity_milli: GPU capacity of the slice.
        seconds: wall time of the run.
    """

    policy: str
    placements: tuple[Placement | None, ...]
    allocated_milli: int
    capacity_milli: int
    seconds: float

    @property
    def unallocated_pct(self) -> float:
        """Unallocated GPU share once every pod arrived, in percent."""
        return 100.0 * (1.0 - self.allocated_milli / self.capacity_milli)

    @property
    def failed(self) -> int:
        """Pods that were not placed."""
        return sum(1 for p in self.placements if p is None)


def tally(sl: Slice, policy: str, placements: Sequence[Placement | None], seconds: float) -> Run:
    """A ``Run`` from per-pod placements (the same arithmetic for both halves)."""
    if len(placements) != len(sl.pods):
        raise ValueError(f"{len(placements)} placements for {len(sl.pods)} pods")
    allocated = sum(p.gpu_milli for p, where in zip(sl.pods, placements, strict=True) if where is not None)
    return Run(policy, tuple(placements), allocated, sl.capacity_milli, seconds)


def simulate(sl: Slice, policy: str, workload_mode: str = "online") -> Run:
    """Replay the slice in the simulator with ``policy`` as node and card policy.

    ``workload_mode`` ``online`` gives FGD-style policies the extender's target workload (a
    ``ShapeHistogram`` with the extender's defaults, see ``engine``); ``oracle`` the slice's own
    shape histogram.
    """
    live = cluster.Cluster(sl.nodes)
    histogram = shapes.ShapeHistogram() if workload_mode == "online" else None
    if workload_mode not in ("online", "oracle"):
        raise ValueError(f"unknown workload mode {workload_mode!r}")
    ctx = api.Context(
        workload=None if histogram is not None else workload.histogram(sl.pods),
        capacity=api.model_capacity(d.type for inv in sl.nodes for d in inv.devices),
    )
    placer = engine.Placer(live, registry.get(policy), ctx, histogram)
    index = [{d.uuid: d.index for d in inv.devices} for inv in sl.nodes]
    out: list[Placement | None] = []
    start = time.perf_counter()
    for pod in sl.pods:
        got = placer.place(pod)
        if got is None:
            out.append(None)
            continue
        j, alloc = got
        cards = sorted({index[j][g.uuid] for grants in alloc.containers for g in grants})
        out.append(Placement(sl.nodes[j].name, tuple(cards)))
    return tally(sl, policy, out, time.perf_counter() - start)


# ----------------------------------------------------------------------------- comparison


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The simulator's run of a slice against the cluster's.

    Attributes:
        sim: the simulator's run.
        e2e: the cluster's run.
        same_node: pods with the same outcome node-wise (both on one node, or both unplaced).
        same_cards: pods on the same node and the same cards (or both unplaced).
        first_divergence: the first pod whose node differs: (arrival index, sim node, e2e node),
            ``-`` for unplaced; None when all agree.
    """

    sim: Run
    e2e: Run
    same_node: int
    same_cards: int
    first_divergence: tuple[int, str, str] | None

    @property
    def pods(self) -> int:
        """Pods compared."""
        return len(self.sim.placements)

    @property
    def delta_pp(self) -> float:
        """e2e minus simulator unallocated GPU %, in percentage points."""
        return self.e2e.unallocated_pct - self.sim.unallocated_pct

    @property
    def node_agreement(self) -> float:
        """Share of pods on the simulator's node (0..1)."""
        return self.same_node / max(1, self.pods)

    @property
    def card_agreement(self) -> float:
        """Share of pods on the simulator's node and cards (0..1)."""
        return self.same_cards / max(1, self.pods)

    def as_json(self) -> dict[str, object]:
        """A JSON-ready record."""
        div = self.first_divergence
        return {
            "policy": self.sim.policy,
            "pods": self.pods,
            "sim_unallocated_pct": round(self.sim.unallocated_pct, 4),
            "e2e_unallocated_pct": round(self.e2e.unallocated_pct, 4),
            "delta_pp": round(self.delta_pp, 4),
            "sim_failed": self.sim.failed,
            "e2e_failed": self.e2e.failed,
            "node_agreement": round(self.node_agreement, 4),
            "card_agreement": round(self.card_agreement, 4),
            "first_divergence": None
            if div is None
            else {"pod_index": div[0], "sim_node": div[1], "e2e_node": div[2]},
            "sim_seconds": round(self.sim.seconds, 3),
            "e2e_seconds": round(self.e2e.seconds, 3),
        }


def _node_of(p: Placement | None) -> str:
    return "-" if p is None else p.node


def compare(sim: Run, e2e: Run) -> Comparison:
    """Per-pod agreement of two runs of the same slice."""
    if len(sim.placements) != len(e2e.placements):
        raise ValueError("runs of different slices")
    same_node = same_cards = 0
    first: tuple[int, str, str] | None = None
    for k, (a, b) in enumerate(zip(sim.placements, e2e.placements, strict=True)):
        if _node_of(a) == _node_of(b):
            same_node += 1
            same_cards += int(a == b)
        elif first is None:
            first = (k, _node_of(a), _node_of(b))
    return Comparison(sim, e2e, same_node, same_cards, first)


def placements_from(raw: Sequence[tuple[str, Sequence[int]] | None]) -> list[Placement | None]:
    """``Placement`` objects from the cluster half's plain (node, card indices) pairs."""
    return [None if r is None else Placement(r[0], tuple(sorted(r[1]))) for r in raw]
