"""Prometheus metrics of the extender, in its own ``CollectorRegistry`` (no process globals).

Request-path metrics are updated by the handlers; per-card allocation gauges use HAMi's names and
labels (docs/hami-compat.md section 14) and are computed at scrape time from the current cache
snapshot by a custom collector, so they can never drift from what the policies see. The same
collector counts the memory slices of each card in MIG mode (``gpuslice_mig_slices``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuslice.kube import tlsfiles
from gpuslice.model import nodes
from gpuslice.policy import mig as migs

MiB = 1 << 20
_DEVICE_LABELS = ("node", "device_uuid", "device_index", "device_type", "zone")
_MIG_LABELS = ("node", "uuid", "state")
_LATENCY_BUCKETS = (
    0.0002,
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


class DeviceCollector(Collector):
    """Per-card gauges (HAMi names) computed from ``states()`` at each scrape."""

    def __init__(self, states: Callable[[], Iterable[nodes.NodeState]]) -> None:
        self._states = states

    def collect(self) -> Iterator[Metric]:
        """Yield the card gauges."""
        mem_limit = GaugeMetricFamily(
            "hami_gpu_memory_limit_bytes", "Registered memory of a GPU", labels=_DEVICE_LABELS
        )
        core_limit = GaugeMetricFamily(
            "hami_gpu_core_limit_ratio", "Registered cores of a GPU (percent)", labels=_DEVICE_LABELS
        )
        mem_alloc = GaugeMetricFamily(
            "hami_gpu_memory_allocated_bytes", "Memory allocated on a GPU", labels=_DEVICE_LABELS
        )
        core_alloc = GaugeMetricFamily(
            "hami_gpu_core_allocated_ratio", "Cores allocated on a GPU (percent)", labels=_DEVICE_LABELS
        )
        shared = GaugeMetricFamily("hami_gpu_shared_count", "Tasks sharing a GPU", labels=_DEVICE_LABELS)
        slices = GaugeMetricFamily(
            "gpuslice_mig_slices",
            "Memory slices of a GPU in MIG mode by state: held by GPU instances, free, and stranded "
            "(of the free ones, those no free placement of any profile covers, averaged over the "
            "card's profiles; held + free = the card's slices)",
            labels=_MIG_LABELS,
        )
        for state in self._states():
            for i, dev in enumerate(state.inventory.devices):
                labels = [state.name, dev.uuid, str(dev.index), dev.type, "vGPU"]
                use = state.usage[i]
                mem_limit.add_metric(labels, dev.memory_mib * MiB)
                core_limit.add_metric(labels, dev.cores)
                mem_alloc.add_metric(labels, use.memory_mib * MiB)
                core_alloc.add_metric(labels, use.cores)
                shared.add_metric(labels, use.slots)
                if dev.is_mig and dev.mig_profiles:
                    sl = migs.card_slices(dev, use, None)
                    slices.add_metric([state.name, dev.uuid, "held"], sl.held)
                    slices.add_metric([state.name, dev.uuid, "free"], sl.free)
                    slices.add_metric([state.name, dev.uuid, "stranded"], sl.stranded)
        yield from (mem_limit, core_limit, mem_alloc, core_alloc, shared, slices)


class Metrics:
    """The extender's metrics, all registered in ``self.registry``."""

    def __init__(self, states: Callable[[], Iterable[nodes.NodeState]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.latency = Histogram(
            "gpuslice_extender_request_duration_seconds",
            "Handling time of an extender call, decode to encode",
            ["verb"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "gpuslice_extender_requests_total",
            "Extender calls by verb and HTTP status",
            ["verb", "code"],
            registry=r,
        )
        self.filter_nodes = Counter(
            "gpuslice_filter_node_outcomes_total",
            "Per-node filter outcomes by reason code ('Feasible' when the node fits)",
            ["reason"],
            registry=r,
        )
        self.scores = Counter(
            "gpuslice_prioritize_scores_total",
            "Scores returned to kube-scheduler, by value 0..10 (one count per node scored)",
            ["score"],
            registry=r,
        )
        self.binds = Counter("gpuslice_bind_total", "Bind outcomes", ["outcome"], registry=r)
        self.gang_plans = Counter(
            "gpuslice_gang_plans_total",
            "Gang plans by what became of them (docs/gangs.md): planned, refused (no room for the "
            "whole gang), released (given up at the barrier, expired, a member gone or changed)",
            ["outcome"],
            registry=r,
        )
        self.gangs_held = Gauge("gpuslice_gang_plans_held", "Gang plans holding cards now", registry=r)
        self.lock_waits = Counter(
            "gpuslice_bind_node_lock_waits_total",
            "Retries of a node lock held by another pod's Allocate",
            registry=r,
        )
        self.lock_moves = Counter(
            "gpuslice_lock_margin_moves_total",
            "GPU pods whose first choice the lock margin moved off the best-scoring node, whose HAMi "
            "node lock was busy, to a node within the margin with a free one (by verb)",
            ["verb"],
            registry=r,
        )
        self.requeue_nudges = Counter(
            "gpuslice_requeue_nudges_total",
            "Node annotation touches that make kube-scheduler retry pods waiting for GPU capacity",
            registry=r,
        )
        self.api_errors = Counter(
            "gpuslice_api_errors_total",
            "Kubernetes API call failures on the bind path",
            ["operation"],
            registry=r,
        )
        self.cache_synced = Gauge(
            "gpuslice_cache_synced",
            "1 when every watched kind has been listed and its watch is healthy",
            registry=r,
        )
        self.watch_restarts = Counter(
            "gpuslice_watch_restarts_total", "Watch restarts by kind", ["kind"], registry=r
        )
        self.truth_corrections = Counter(
            "gpuslice_bind_truth_corrections_total",
            "Binds whose reservation no longer fitted once the node's pods were read after the lock",
            registry=r,
        )
        self.truth_reads = Counter(
            "gpuslice_bind_truth_reads_total",
            "Truth checks after the node lock, by how they were settled (watch or api)",
            ["source"],
            registry=r,
        )
        self.ambiguous = Counter(
            "gpuslice_bind_ambiguous_total",
            "Bind writes whose outcome was unknown (timeout, lost reply, 5xx), by operation",
            ["operation"],
            registry=r,
        )
        self.recovery = Counter(
            "gpuslice_recovery_actions_total",
            "Actions of the leader's recovery loop (orphan locks and bind annotations, stuck locks, "
            "dangling locks, handshake requests)",
            ["action"],
            registry=r,
        )
        self.not_synced = Counter(
            "gpuslice_not_synced_answers_total",
            "Calls answered with an error because the caches were not synced, by verb",
            ["verb"],
            registry=r,
        )
        self.leader = Gauge("gpuslice_leader", "1 while this replica is the leader", registry=r)
        self.nodes_excluded = Gauge(
            "gpuslice_nodes_excluded",
            "Nodes excluded from placement by reason code (stale handshake, held lock, invalid registration)",
            ["reason"],
            registry=r,
        )
        self.preemptions = Counter(
            "gpuslice_preemptions_total",
            "GPU-aware preemption attempts by outcome (preempted, no_candidate, blocked, failed)",
            ["outcome"],
            registry=r,
        )
        self.evictions = Counter(
            "gpuslice_evictions_total",
            "Evictions requested by GPU-aware preemption, by outcome (evicted, blocked, gone, failed)",
            ["outcome"],
            registry=r,
        )
        self.shadow_decisions = Counter(
            "gpuslice_shadow_decisions_total",
            "Bound GPU pods by shadow policy and how its choice agreed with the live one "
            "(cards: same node and cards, node: same node, none: another node or none)",
            ["policy", "agreement"],
            registry=r,
        )
        self.shadow_score_delta = Histogram(
            "gpuslice_shadow_score_delta",
            "A shadow policy's score (0..100) of the node it would choose minus its score of the live node",
            ["policy"],
            buckets=(0, 1, 2, 5, 10, 20, 30, 50, 75, 100),
            registry=r,
        )
        self.tls = tlsfiles.Metrics(r)  # the serving certificate's expiry and reloads (HTTPS only)
        if states is not None:
            r.register(DeviceCollector(states))
