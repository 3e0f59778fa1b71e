"""Card health from NVML events: the XID rules, a state tracker, and the thread that waits.

``is_fault`` decides whether one event is a device fault. ``Tracker`` keeps each card's state:
a fault marks the card unhealthy; a card with no fault for ``quiet_period_s`` is healthy again.
``Watcher`` runs the blocking NVML wait in a thread and reports every state change. Time is a
parameter everywhere (``now`` arguments, an injected clock), so tests drive it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable

from gpuslice.agent import backend

log = logging.getLogger(__name__)

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68})
"""XIDs caused by applications (illegal address, MMU fault, reset channel, preemptive cleanup,
video decoder): the card itself is fine. The same list as NVIDIA's device plugin."""

_FAULT_KINDS = frozenset(
    {backend.EventKind.DOUBLE_BIT_ECC, backend.EventKind.GPU_UNAVAILABLE, backend.EventKind.FATAL_POISON}
)

REASON_UNHEALTHY = "GPUUnhealthy"
REASON_RECOVERED = "GPURecovered"


def is_fault(event: backend.DeviceEvent, ignored_xids: frozenset[int] = APPLICATION_XIDS) -> bool:
    """True when the event means the card is faulty (critical XID, double-bit ECC, lost GPU)."""
    if event.kind is backend.EventKind.XID:
        return event.xid not in ignored_xids
    return event.kind in _FAULT_KINDS


def describe(event: backend.DeviceEvent) -> str:
    """The event in words, e.g. ``XID 79`` or ``double-bit-ecc``."""
    return f"XID {event.xid}" if event.kind is backend.EventKind.XID else event.kind.value


@dataclasses.dataclass(frozen=True)
class Change:
    """A card changed state.

    Attributes:
        index: NVML index.
        healthy: the new state.
        reason: ``REASON_UNHEALTHY`` or ``REASON_RECOVERED``.
        message: what happened, for logs and the Node event.
    """

    index: int
    healthy: bool
    reason: str
    message: str


class Tracker:
    """Health state of a node's cards (no I/O, no clock; not thread-safe by itself).

    Args:
        indices: the cards to track.
        quiet_period_s: how long a card must go without faults to be healthy again.
        ignored_xids: XIDs that are not device faults.
    """

    def __init__(
        self,
        indices: Iterable[int],
        quiet_period_s: float = 300.0,
        ignored_xids: frozenset[int] = APPLICATION_XIDS,
    ) -> None:
        if quiet_period_s < 0:
            raise ValueError("quiet period must be >= 0")
        self.quiet_period_s = quiet_period_s
        self.ignored_xids = ignored_xids
        self._last_fault: dict[int, float | None] = {i: None for i in indices}

    def healthy(self) -> dict[int, bool]:
        """Healthy flag per card."""
        return {i: t is None for i, t in self._last_fault.items()}

    def observe(self, event: backend.DeviceEvent, now: float) -> list[Change]:
        """Apply one event; returns the cards that became unhealthy."""
        if not is_fault(event, self.ignored_xids):
            return []
        targets = list(self._last_fault) if event.index is None else [event.index]
        changes: list[Change] = []
        for i in targets:
            if i not in self._last_fault:
                continue
            if self._last_fault[i] is None:
                changes.append(
                    Change(i, False, REASON_UNHEALTHY, f"GPU {i}: {describe(event)}, marked unhealthy")
                )
            self._last_fault[i] = now
        return changes

    def tick(self, now: float) -> list[Change]:
        """Bring back cards quiet for the quiet period; returns the cards that recovered."""
        changes: list[Change] = []
        for i, t in self._last_fault.items():
            if t is not None and now - t >= self.quiet_period_s:
                self._last_fault[i] = None
                changes.append(
                    Change(
                        i,
                        True,
                        REASON_RECOVERED,
                        f"GPU {i}: no fault for {self.quiet_period_s:g} s, healthy again",
                    )
                )
        return changes


class Watcher:
    """The thread that waits on NVML events and feeds a ``Tracker``.

    Args:
        nvml: the backend to wait on.
        tracker: the state to update.
        clock: monotonic seconds.
        on_change: called (from the watcher thread) with each non-empty batch of changes.
        poll_s: the longest single wait, i.e. how soon ``stop()`` and recoveries are noticed.
    """

    def __init__(
        self,
        nvml: backend.Backend,
        tracker: Tracker,
        clock: Callable[[], float],
        on_change: Callable[[list[Change]], None],
        poll_s: float = 1.0,
    ) -> None:
        self._nvml = nvml
        self._tracker = tracker
        self._clock = clock
        self._on_change = on_change
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registered: tuple[int, ...] = ()
        self.error: str | None = None
        self._failing = False

    def healthy(self) -> dict[int, bool]:
        """A copy of the current state."""
        with self._lock:
            return self._tracker.healthy()

    def start(self) -> None:
        """Register for events and start the thread; on failure health checks stay off (logged)."""
        try:
            self.registered = self._nvml.start_events()
        except backend.BackendError as e:
            self.error = f"health events unavailable ({e.reason}: {e}); cards stay as discovered"
            log.warning("%s", self.error)
            return
        self._thread = threading.Thread(target=self._run, name="gpuslice-agent-health", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the thread to stop and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def step(self) -> list[Change]:
        """Wait once for an event, apply it and the quiet-period rule; returns the changes."""
        try:
            event = self._nvml.wait_event(self._poll_s)
            self._failing = False
        except backend.BackendError as e:
            if not self._failing:  # once per failure streak, not every poll
                log.warning("waiting for NVML events failed (%s: %s)", e.reason, e)
            self._failing = True
            self._stop.wait(self._poll_s)
            event = None
        with self._lock:
            now = self._clock()
            changes = self._tracker.observe(event, now) if event is not None else []
            if event is not None and not changes:
                log.info("GPU %s: %s (not a device fault or already unhealthy)", event.index, describe(event))
            changes += self._tracker.tick(now)
        return changes

    def _run(self) -> None:
        while not self._stop.is_set():
            changes = self.step()
            if changes:
                for c in changes:
                    log.log(logging.INFO if c.healthy else logging.WARNING, "%s", c.message)
                try:
                    self._on_change(changes)
                except Exception:
                    log.exception("health change handler failed")
