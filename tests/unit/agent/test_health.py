"""XID rules, the health tracker (time injected) and the watcher thread over the fake backend."""

from __future__ import annotations

import threading

import pytest

from gpuslice.agent import backend, fake, health

pytestmark = pytest.mark.unit

K = backend.EventKind


def xid(index: int | None, n: int) -> backend.DeviceEvent:
    return backend.DeviceEvent(index=index, kind=K.XID, xid=n)


FAULTS = [
    # (event, is a device fault)
    (xid(0, 79), True),  # fallen off the bus
    (xid(0, 48), True),  # double-bit ECC
    (xid(0, 94), True),  # contained ECC error
    (xid(0, 13), False),  # graphics engine exception (application)
    (xid(0, 31), False),  # MMU fault (application)
    (xid(0, 43), False),  # reset channel (application)
    (xid(0, 45), False),  # preemptive cleanup
    (xid(0, 68), False),  # video decoder exception
    (backend.DeviceEvent(index=0, kind=K.DOUBLE_BIT_ECC), True),
    (backend.DeviceEvent(index=0, kind=K.GPU_UNAVAILABLE), True),
    (backend.DeviceEvent(index=0, kind=K.FATAL_POISON), True),
    (backend.DeviceEvent(index=0, kind=K.SINGLE_BIT_ECC), False),
    (backend.DeviceEvent(index=0, kind=K.OTHER), False),
]


@pytest.mark.parametrize(("event", "fault"), FAULTS, ids=[health.describe(e) for e, _ in FAULTS])
def test_is_fault(event: backend.DeviceEvent, fault: bool) -> None:
    assert health.is_fault(event) is fault


def test_ignored_xids_are_configurable() -> None:
    assert health.is_fault(xid(0, 13), frozenset())
    assert not health.is_fault(xid(0, 79), frozenset({79}))


def test_fault_then_recovery_after_quiet_period() -> None:
    t = health.Tracker(range(4), quiet_period_s=300)
    [c] = t.observe(xid(2, 79), now=1000)
    assert (c.index, c.healthy, c.reason) == (2, False, health.REASON_UNHEALTHY)
    assert "XID 79" in c.message
    assert t.healthy() == {0: True, 1: True, 2: False, 3: True}
    assert t.observe(xid(2, 79), now=1100) == []  # already unhealthy; the quiet period restarts at 1100
    assert t.tick(now=1300) == []  # 1300 - 1100 = 200 < 300
    [r] = t.tick(now=1400)  # 1400 - 1100 = 300
    assert (r.index, r.healthy, r.reason) == (2, True, health.REASON_RECOVERED)
    assert all(t.healthy().values())


def test_application_xid_changes_nothing() -> None:
    t = health.Tracker(range(2))
    assert t.observe(xid(1, 13), now=0) == []
    assert all(t.healthy().values())


def test_event_without_card_hits_every_card() -> None:
    t = health.Tracker(range(3))
    changes = t.observe(backend.DeviceEvent(index=None, kind=K.GPU_UNAVAILABLE), now=0)
    assert [c.index for c in changes] == [0, 1, 2]


def test_unknown_card_is_ignored() -> None:
    t = health.Tracker(range(2))
    assert t.observe(xid(7, 79), now=0) == []


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_watcher_thread_marks_and_recovers() -> None:
    nvml = fake.FakeBackend(fake.shape("t4-4"))
    clock = Clock()
    seen: list[health.Change] = []
    got = threading.Event()

    def on_change(changes: list[health.Change]) -> None:
        seen.extend(changes)
        got.set()

    w = health.Watcher(nvml, health.Tracker(range(4), quiet_period_s=60), clock, on_change, poll_s=0.01)
    w.start()
    try:
        assert w.registered == (0, 1, 2, 3)
        nvml.inject_xid(1, 13)  # application error: no change
        nvml.inject_xid(3, 79)
        assert got.wait(10)
        assert [(c.index, c.healthy) for c in seen] == [(3, False)]
        assert w.healthy()[3] is False
        got.clear()
        clock.now = 60.0  # quiet for the whole period
        assert got.wait(10)
        assert [(c.index, c.healthy) for c in seen] == [(3, False), (3, True)]
    finally:
        w.stop()
    assert w.healthy() == {0: True, 1: True, 2: True, 3: True}


def test_watcher_without_events_says_so() -> None:
    nvml = fake.FakeBackend(
        fake.shape("t4-4"), fail=backend.BackendError(backend.REASON_NOT_SUPPORTED, "no events")
    )
    w = health.Watcher(nvml, health.Tracker(range(4)), Clock(), lambda c: None)
    w.start()
    w.stop()
    assert w.error is not None and "NotSupported" in w.error


def test_step_survives_backend_errors() -> None:
    class Broken(fake.FakeBackend):
        def wait_event(self, timeout_s: float) -> backend.DeviceEvent | None:
            raise backend.BackendError(backend.REASON_GPU_LOST, "GPU is lost")

    w = health.Watcher(
        Broken(fake.shape("t4-4")), health.Tracker(range(4)), Clock(), lambda c: None, poll_s=0.001
    )
    assert w.step() == []
