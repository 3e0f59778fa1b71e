"""The agent's loop: discover, publish what changed, follow health events, sample telemetry.

One thread (``Agent.run``) does every API call; the health watcher thread only queues changes and
wakes it. Work is due by the monotonic clock (refresh period, telemetry period) or on demand
(``request_refresh``: SIGHUP or ``POST /refresh``). Clocks and the backend factory are injected.

Every write and delete goes through ``agent.ownership``: a key another field manager owns on the
Node is left as it is, with one warning, one Node event and a gauge per key; with ``--register``
and HAMi's device plugin registering the node, the registration is refused and the agent keeps
publishing everything else.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import msgspec

from gpuslice.agent import backend, collect, discover, health, metrics, ownership, publish
from gpuslice.codec import keys
from gpuslice.kube import errors as kerrors
from gpuslice.kube import nodes as kube_nodes
from gpuslice.model import devices, nodes

log = logging.getLogger(__name__)

REASON_ASYMMETRIC = "AsymmetricGPUP2PLink"
"""HAMi's Node event reason for a pair with different NVLink counts on each side."""
REASON_NVML_UNAVAILABLE = "NVMLUnavailable"
REASON_OWNED_ELSEWHERE = "AnnotationOwnedElsewhere"
"""Warning: another field manager owns a node annotation key the agent publishes; left alone."""
REASON_REGISTRATION_REFUSED = "RegistrationRefused"
"""Warning: ``--register``, but another field manager (HAMi's device plugin) registers the node."""
CONFLICT_ATTEMPTS = 3
"""Patches carry the resourceVersion read; on a 409 the Node is read and judged again, this often."""
RETRY_S = 10.0
"""How soon a failed round is retried."""


class NodeApi(Protocol):
    """What the agent needs from the API server about its own Node.

    A failed call raises ``kube.errors.ApiError`` (``Conflict``: the Node changed since the
    ``resource_version`` a patch carried).
    """

    @property
    def field_manager(self) -> str:
        """The field manager the patches carry (the agent's own name in managedFields)."""
        ...

    def read_node(self) -> kube_nodes.NodeInfo:
        """The Node's annotations, resourceVersion and managedFields."""
        ...

    def patch(self, changes: Mapping[str, str | None], resource_version: str | None = None) -> None:
        """Merge-patch annotations (None removes); with ``resource_version``, only onto that version."""
        ...

    def event(self, type_: str, reason: str, note: str, action: str) -> None:
        """Record an event about the Node."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


@dataclasses.dataclass(frozen=True)
class Settings:
    """How the agent runs.

    Attributes:
        node_name: the Node to annotate.
        register: also write ``hami.io/node-nvidia-register`` (no HAMi device plugin in the cluster).
        registration: split count and scaling for the registration.
        refresh_s: discovery period.
        telemetry_s: telemetry sampling period.
        quiet_period_s: how long a faulty card must stay quiet to be healthy again.
        ignored_xids: XIDs that are not device faults.
        watch_health: run the NVML event thread (off for one-shot runs).
        health_poll_s: the longest single NVML event wait (how soon recoveries are noticed).
    """

    node_name: str
    register: bool = False
    registration: discover.RegistrationConfig = dataclasses.field(default_factory=discover.RegistrationConfig)
    refresh_s: float = 300.0
    telemetry_s: float = 60.0
    quiet_period_s: float = 300.0
    ignored_xids: frozenset[int] = health.APPLICATION_XIDS
    watch_health: bool = True
    health_poll_s: float = 1.0


class Report(msgspec.Struct, kw_only=True):
    """The outcome of one discovery round (printed by ``--once``).

    Attributes:
        node: node name.
        backend: what answered (or None when NVML is unavailable).
        annotations: the values the agent wants on the Node.
        patched: keys sent (or, without an API, that would be sent).
        notes: what discovery could not read or found odd.
        yielded: annotation keys left alone because another field manager owns them, with those
            managers (``agent.ownership``).
        error: why nothing could be discovered, if so.
    """

    node: str
    backend: str | None = None
    annotations: dict[str, str] = msgspec.field(default_factory=dict)
    patched: list[str] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)
    yielded: dict[str, list[str]] = msgspec.field(default_factory=dict)
    error: str | None = None


class Agent:
    """The node agent.

    Args:
        settings: see ``Settings``.
        open_backend: opens NVML (raises ``BackendError``); retried every round until it works.
        api: the Node API; None = dry run (nothing is sent).
        agent_metrics: gauges and counters to update.
        clock: monotonic seconds (scheduling of work, health quiet period).
        wall: unix seconds (telemetry timestamps).
    """

    def __init__(
        self,
        settings: Settings,
        open_backend: Callable[[], backend.Backend],
        api: NodeApi | None,
        agent_metrics: metrics.AgentMetrics,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._open = open_backend
        self._api = api
        self.metrics = agent_metrics
        self._clock = clock
        self._wall = wall
        self._nvml: backend.Backend | None = None
        self._description = ""
        self._notes: tuple[str, ...] = ()
        self._records: collect.Records | None = None
        self.watcher: health.Watcher | None = None
        self._tracker: health.Tracker | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._refresh_requested = False
        self._pending: list[health.Change] = []
        self._next_refresh = 0.0
        self._next_telemetry = 0.0
        self._nvml_error: str | None = None
        self._asymmetric_seen: frozenset[tuple[int, int]] = frozenset()
        self._published: dict[str, str] = {}
        self._yielded: dict[str, tuple[str, ...]] = {}
        self._tracked: bool | None = None
        self._field_manager = api.field_manager if api is not None else kube_nodes.AGENT_FIELD_MANAGER
        self._devices: tuple[devices.GpuDevice, ...] = ()
        self._telemetry: tuple[nodes.CardTelemetry, ...] = ()
        self.last_report = Report(node=settings.node_name)

    # --- triggers (any thread) ---

    def request_refresh(self) -> None:
        """Ask for a discovery round now (SIGHUP, ``POST /refresh``)."""
        with self._lock:
            self._refresh_requested = True
        self._wake.set()

    def wake(self) -> None:
        """Interrupt the loop's wait (e.g. to notice a stop request)."""
        self._wake.set()

    def on_health_change(self, changes: list[health.Change]) -> None:
        """Queue health changes from the watcher thread and wake the loop."""
        with self._lock:
            self._pending.extend(changes)
        self._wake.set()

    # --- the loop ---

    def run(self, stop: threading.Event) -> None:
        """Work until ``stop`` is set."""
        while not stop.is_set():
            delay = self.cycle()
            self._wake.wait(delay)
            self._wake.clear()

    def cycle(self) -> float:
        """Do whatever is due; returns the seconds until the next due work."""
        with self._lock:
            pending, self._pending = self._pending, []
            requested, self._refresh_requested = self._refresh_requested, False
        if pending:
            self._apply_health(pending)
        now = self._clock()
        if requested or now >= self._next_refresh:
            self.refresh()
        now = self._clock()
        if now >= self._next_telemetry:
            self.publish_telemetry()
        return max(0.0, min(self._next_refresh, self._next_telemetry) - self._clock())

    def close(self) -> None:
        """Stop the health thread, release NVML and the API connections."""
        self._drop_backend()
        if self._api is not None:
            self._api.close()

    # --- discovery and publishing ---

    def _backend(self) -> backend.Backend | None:
        if self._nvml is None:
            try:
                self._nvml = self._open()
            except backend.BackendError as e:
                self._nvml_failed(e)
                return None
            self._description = self._nvml.describe()
            log.info("NVML backend: %s", self._description)
        return self._nvml

    def _nvml_failed(self, e: backend.BackendError) -> None:
        message = f"NVML unavailable ({e.reason}): {e}; keeping the published annotations, retrying"
        self.metrics.nvml_up.set(0)
        if message != self._nvml_error:
            log.error("%s", message)
            self._event("Warning", REASON_NVML_UNAVAILABLE, message, "Discover")
        self._nvml_error = message

    def refresh(self) -> Report:
        """Discover and publish; NVML failures keep what is published and retry soon."""
        now = self._clock()
        self._next_refresh = now + self.settings.refresh_s
        nvml = self._backend()
        if nvml is None:
            self._next_refresh = now + min(RETRY_S, self.settings.refresh_s)
            self.metrics.refreshes.labels("nvml-unavailable").inc()
            self.last_report = Report(node=self.settings.node_name, error=self._nvml_error)
            return self.last_report
        try:
            records = collect.inventory(nvml)
        except backend.BackendError as e:
            self._drop_backend()
            self._nvml_failed(e)
            self._next_refresh = now + min(RETRY_S, self.settings.refresh_s)
            self.metrics.refreshes.labels("nvml-unavailable").inc()
            self.last_report = Report(node=self.settings.node_name, error=self._nvml_error)
            return self.last_report
        self._nvml_error = None
        self.metrics.nvml_up.set(1)
        self._records = records
        self._start_watcher(nvml, records)
        report = self._publish(records)
        report.backend = self._description
        self.metrics.refreshes.labels("ok" if report.error is None else "api-error").inc()
        self.last_report = report
        return report

    def _drop_backend(self) -> None:
        """Forget a failed NVML session: stop its event thread (the health state is kept) and close it."""
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None

    def _start_watcher(self, nvml: backend.Backend, records: collect.Records) -> None:
        if self.watcher is not None or not records.gpus or not self.settings.watch_health:
            return
        if self._tracker is None:
            self._tracker = health.Tracker(
                (g.index for g in records.gpus), self.settings.quiet_period_s, self.settings.ignored_xids
            )
        self.watcher = health.Watcher(
            nvml, self._tracker, self._clock, self.on_health_change, poll_s=self.settings.health_poll_s
        )
        self.watcher.start()

    def _health(self) -> dict[int, bool]:
        if self.watcher is not None:
            return self.watcher.healthy()
        return self._tracker.healthy() if self._tracker is not None else {}

    def _publish(self, records: collect.Records) -> Report:
        found = discover.discover(records, self.settings.registration, self._health())
        if found.notes != self._notes:  # said once, not every round
            for note in found.notes:
                log.warning("discovery: %s", note)
            self._notes = found.notes
        desired = publish.topology_annotations(found, register=self.settings.register)
        remove = publish.TOPOLOGY_KEYS if found.topology is None else ()
        report = Report(node=self.settings.node_name, annotations=desired, notes=list(found.notes))
        self._devices = found.devices
        self.metrics.update_cards(
            found.devices, self._telemetry, {g.uuid: g.memory_total_mib for g in records.gpus}
        )
        self._report_asymmetry(found)
        try:
            report.patched = self._patch(desired, remove)
            report.yielded = self.yielded
        except kerrors.ApiError as e:  # kept running, retried soon
            report.error = f"publishing failed: {e}"
            log.error("%s", report.error)
            self._next_refresh = self._clock() + min(RETRY_S, self.settings.refresh_s)
        return report

    @property
    def yielded(self) -> dict[str, list[str]]:
        """Annotation keys the agent leaves to other field managers, with those managers."""
        return {key: list(owners) for key, owners in sorted(self._yielded.items())}

    @property
    def registration_refused(self) -> str | None:
        """Why ``--register`` is not registering (another manager owns the key), or None."""
        owners = self._yielded.get(keys.NODE_REGISTER)
        if not self.settings.register or owners is None:
            return None
        return (
            f"registration refused: {keys.NODE_REGISTER} on node {self.settings.node_name} is written by "
            f"field manager {', '.join(owners)} (HAMi's device plugin registers this node); "
            "turn agent.register off (drop --register) where HAMi's device plugin runs; "
            "topology and telemetry are still published"
        )

    def _patch(self, desired: Mapping[str, str], remove: tuple[str, ...]) -> list[str]:
        """Patch what changed among the keys no other field manager owns (``agent.ownership``).

        The patch carries the resourceVersion the judgement was made on, so a write of another
        component in between is never overwritten: on a 409 the Node is read and judged again.
        """
        attempt = 1
        while True:
            current, version, managers = self._current()
            plan = ownership.plan(current, desired, remove, managers, self._field_manager)
            self._note_owners((*desired, *remove), plan.yielded)
            try:
                self._send(plan.patch, version)
            except kerrors.ApiError as e:
                if not isinstance(e, kerrors.Conflict) or attempt == CONFLICT_ATTEMPTS:
                    raise
                log.info("node %s changed while patching; reading it again", self.settings.node_name)
                attempt += 1
                continue
            return sorted(plan.patch)

    def _current(self) -> tuple[Mapping[str, str], str | None, dict[str, frozenset[str]]]:
        """The Node's annotations, resourceVersion and annotation owners (dry run: what was sent)."""
        if self._api is None:
            return self._published, None, {}
        node = self._api.read_node()
        self._note_tracking(bool(node.managed_fields))
        managers = ownership.annotation_managers(node.managed_fields)
        return node.annotations, node.resource_version or None, managers

    def _note_tracking(self, tracked: bool) -> None:
        """Say once when the Node records no managedFields: then no other writer can be seen."""
        self.metrics.node_managed_fields.set(1 if tracked else 0)
        if not tracked and self._tracked is not False:
            log.warning(
                "node %s records no managedFields (the API server never starts them on an object "
                "created without any tracked field): other writers of its annotations cannot be "
                "told apart, so the agent writes as if it owned every key it publishes",
                self.settings.node_name,
            )
        self._tracked = tracked

    def _send(self, patch: Mapping[str, str | None], version: str | None) -> None:
        if patch and self._api is not None:
            self._api.patch(patch, version)
            self.metrics.patches.inc()
            log.info("patched node %s: %s", self.settings.node_name, ", ".join(sorted(patch)))
        for key, value in patch.items():
            if value is None:
                self._published.pop(key, None)
            else:
                self._published[key] = value

    def _note_owners(self, considered: tuple[str, ...], yielded: Mapping[str, tuple[str, ...]]) -> None:
        """Gauges for the keys judged; a warning and an event when a key's other owners change."""
        for key in dict.fromkeys(considered):
            owners = yielded.get(key)
            self.metrics.annotation_yielded.labels(key).set(0 if owners is None else 1)
            before = self._yielded.get(key)
            if owners == before:
                continue
            if owners is None:
                del self._yielded[key]
                log.info("%s: no other field manager owns it any more; the agent writes it again", key)
                continue
            self._yielded[key] = owners
            if key == keys.NODE_REGISTER and self.settings.register:
                message = self.registration_refused or ""
                log.error("%s", message)
                self._event("Warning", REASON_REGISTRATION_REFUSED, message, "Register")
            else:
                message = (
                    f"{key} on node {self.settings.node_name} is written by field manager "
                    f"{', '.join(owners)}; the agent leaves it as it is (no write, no delete) while "
                    "that manager owns it"
                )
                log.warning("%s", message)
                self._event("Warning", REASON_OWNED_ELSEWHERE, message, "Publish")
        self.metrics.registration_refused.set(0 if self.registration_refused is None else 1)

    def _report_asymmetry(self, found: discover.Discovery) -> None:
        pairs = frozenset((a.a, a.b) for a in found.asymmetric)
        new = pairs - self._asymmetric_seen
        self._asymmetric_seen = pairs
        for a in found.asymmetric:
            if (a.a, a.b) in new:
                note = f"GPU {a.a} counts {a.forward} NVLinks to GPU {a.b}, which counts {a.backward}"
                self._event("Warning", REASON_ASYMMETRIC, note, "Discover")

    def _apply_health(self, changes: list[health.Change]) -> None:
        for c in changes:
            self._event("Normal" if c.healthy else "Warning", c.reason, c.message, "HealthCheck")
        if self._records is not None:
            self.last_report = self._publish(self._records)

    def publish_telemetry(self) -> tuple[dict[str, str], list[str]]:
        """Sample readings and patch them when they changed (or the published ones went stale).

        Returns:
            The telemetry annotation wanted (empty without NVML) and the keys patched.
        """
        now = self._clock()
        self._next_telemetry = now + self.settings.telemetry_s
        if self._nvml is None or self._records is None:
            return {}, []
        gpus = self._records.gpus
        self._telemetry = discover.card_telemetry(gpus, collect.telemetry(self._nvml, gpus))
        self.metrics.update_cards(self._devices, self._telemetry, {g.uuid: g.memory_total_mib for g in gpus})
        wall = self._wall()
        desired = publish.telemetry_annotation(self._telemetry, wall) if gpus else {}
        try:
            if not gpus:  # nothing to report: remove stale readings, if any
                return desired, self._patch(desired, (keys.GPU_TELEMETRY,))
            current = (self._api.read_node().annotations if self._api is not None else self._published).get(
                keys.GPU_TELEMETRY
            )
            if not publish.telemetry_changed(current, self._telemetry, wall, self.settings.refresh_s):
                return desired, []
            return desired, self._patch(desired, ())
        except kerrors.ApiError as e:
            log.error("publishing telemetry failed: %s", e)
            self._next_telemetry = now + min(RETRY_S, self.settings.telemetry_s)
            return desired, []

    def _event(self, type_: str, reason: str, note: str, action: str) -> None:
        self.metrics.events.labels(reason).inc()
        if self._api is None:
            log.info("event (dry run) %s %s: %s", type_, reason, note)
            return
        try:
            self._api.event(type_, reason, note, action)
        except kerrors.ApiError as e:
            log.error("recording event %s failed: %s", reason, e)
