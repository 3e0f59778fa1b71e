"""Prometheus metrics of the webhook, in its own ``CollectorRegistry`` (no process globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gpuslice.kube import tlsfiles

OPERATIONS = ("mutate", "validate")
RESULTS = ("allowed", "patched", "denied", "error")
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """The webhook's metrics.

    Attributes:
        requests: ``gpuslice_webhook_requests_total{operation, result}``: reviews answered
            (``error`` includes bodies refused with HTTP 4xx and pods that cannot be decoded).
        duration: ``gpuslice_webhook_request_duration_seconds{operation}``.
        max_cards: ``gpuslice_webhook_max_node_cards``: the most cards a registered node has
            (0 while unknown: the capacity check is skipped then).
        tls: ``gpuslice_tls_certificate_expiry_timestamp_seconds{certificate="serving"}`` and
            ``gpuslice_tls_certificate_reloads_total{result}`` (``kube.tlsfiles``).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "gpuslice_webhook_requests",
            "Admission reviews answered, by operation and result",
            ("operation", "result"),
            registry=self.registry,
        )
        self.duration = Histogram(
            "gpuslice_webhook_request_duration_seconds",
            "Time to answer an admission review",
            ("operation",),
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.max_cards = Gauge(
            "gpuslice_webhook_max_node_cards",
            "Most GPUs registered on one node (0: unknown, capacity check skipped)",
            registry=self.registry,
        )
        self.tls = tlsfiles.Metrics(self.registry)  # the serving certificate's expiry and reloads
        for op in OPERATIONS:
            self.duration.labels(op)
            for result in RESULTS:
                self.requests.labels(op, result)

    def render(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.registry)
