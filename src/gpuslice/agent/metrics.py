"""The agent's Prometheus metrics, in a registry of its own (served on the agent's ``/metrics``)."""

from __future__ import annotations

from collections.abc import Iterable

import prometheus_client as prom

from gpuslice.model import devices, nodes

_MIB = 1024 * 1024
_CARD = ("uuid", "index", "model")


class AgentMetrics:
    """Per-card gauges (temperature, power, memory, utilisation, health) and agent counters.

    ``annotation_yielded`` and ``registration_refused`` say which node annotation keys the agent
    leaves to another writer (``agent.ownership``).
    """

    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.temperature = prom.Gauge(
            "gpuslice_agent_gpu_temperature_celsius", "GPU temperature", _CARD, registry=r
        )
        self.power = prom.Gauge("gpuslice_agent_gpu_power_draw_watts", "GPU power draw", _CARD, registry=r)
        self.power_limit = prom.Gauge(
            "gpuslice_agent_gpu_power_limit_watts", "Enforced power limit", _CARD, registry=r
        )
        self.memory_used = prom.Gauge(
            "gpuslice_agent_gpu_memory_used_bytes", "GPU memory in use", _CARD, registry=r
        )
        self.memory_total = prom.Gauge(
            "gpuslice_agent_gpu_memory_total_bytes", "GPU memory total", _CARD, registry=r
        )
        self.utilization = prom.Gauge(
            "gpuslice_agent_gpu_utilization_ratio", "GPU utilisation, 0..1", _CARD, registry=r
        )
        self.healthy = prom.Gauge(
            "gpuslice_agent_gpu_healthy", "1 when the card is healthy", _CARD, registry=r
        )
        self.gpus = prom.Gauge("gpuslice_agent_gpus", "Cards discovered", registry=r)
        self.nvml_up = prom.Gauge(
            "gpuslice_agent_nvml_up", "1 when the last NVML discovery succeeded", registry=r
        )
        self.refreshes = prom.Counter("gpuslice_agent_refreshes", "Discovery rounds", ["result"], registry=r)
        self.patches = prom.Counter("gpuslice_agent_node_patches", "Node annotation patches sent", registry=r)
        self.events = prom.Counter(
            "gpuslice_agent_node_events", "Node events recorded", ["reason"], registry=r
        )
        self.annotation_yielded = prom.Gauge(
            "gpuslice_agent_annotation_yielded",
            "1 when another field manager owns this node annotation key, so the agent leaves it alone",
            ["key"],
            registry=r,
        )
        self.registration_refused = prom.Gauge(
            "gpuslice_agent_registration_refused",
            "1 when --register is on but another field manager owns hami.io/node-nvidia-register",
            registry=r,
        )
        self.node_managed_fields = prom.Gauge(
            "gpuslice_agent_node_managed_fields",
            "1 when the Node records managedFields; 0: other writers of its annotations cannot be seen",
            registry=r,
        )
        self._labels: dict[str, tuple[str, str, str]] = {}

    def update_cards(
        self,
        cards: Iterable[devices.GpuDevice],
        readings: Iterable[nodes.CardTelemetry],
        memory_total_mib: dict[str, int],
    ) -> None:
        """Set the per-card gauges; cards no longer present lose their series."""
        current = {d.uuid: (d.uuid, str(d.index), d.type) for d in cards}
        for uuid, labels in list(self._labels.items()):
            if current.get(uuid) != labels:
                for g in self._card_gauges():
                    try:
                        g.remove(*labels)
                    except KeyError:
                        pass
                del self._labels[uuid]
        by_uuid = {t.uuid: t for t in readings}
        self.gpus.set(len(current))
        for d in cards:
            labels = current[d.uuid]
            self._labels[d.uuid] = labels
            self.healthy.labels(*labels).set(1 if d.health else 0)
            if d.uuid in memory_total_mib:
                self.memory_total.labels(*labels).set(memory_total_mib[d.uuid] * _MIB)
            t = by_uuid.get(d.uuid)
            if t is None:
                continue
            for gauge, value in (
                (self.temperature, t.temperature_c),
                (self.power, t.power_draw_w),
                (self.power_limit, t.power_limit_w),
                (self.memory_used, None if t.memory_used_mib is None else t.memory_used_mib * _MIB),
                (self.utilization, None if t.utilization_pct is None else t.utilization_pct / 100.0),
            ):
                if value is not None:
                    gauge.labels(*labels).set(value)

    def _card_gauges(self) -> tuple[prom.Gauge, ...]:
        return (
            self.temperature,
            self.power,
            self.power_limit,
            self.memory_used,
            self.memory_total,
            self.utilization,
            self.healthy,
        )

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST
