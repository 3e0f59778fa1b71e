"""Preemption with the extender SIGKILLed between the evictions and the preemptor's bind.

On the tier's one-card node (``chaos-solo``, tainted): two low-priority pods share the card; a
high-priority pod asking the whole card makes the extender evict them and nominate the card.
The victims carry a finalizer, so once evicted they stay (terminating, still holding the card)
until the test lets them go: the extender is SIGKILLed right then, between the evictions and the
preemptor's bind (its nomination dies with it), a low-priority competitor for the same card is
created, the victims are released, and the extender is started again.
Whatever wins the race, the API audit must be clean (no card handed out twice, nothing bound
without devices, no phantom reservation, no lock left), and the high-priority pod must end up
bound on the card (the restarted extender preempts the competitor if it got there first).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.chaos.conftest import SCHEDULER, SOLO, SOLO_TOLERATION, Chaos

pytestmark = pytest.mark.chaos

HALF = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40960", "nvidia.com/gpucores": "50"}
WHOLE = {"nvidia.com/gpu": "1"}


HOLD = "chaos.gpuslice.io/hold"
"""A finalizer that keeps an evicted victim (terminating) until the test removes it."""


def pod(ns: str, name: str, priority: int, limits: dict[str, str], hold: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "finalizers": [HOLD] if hold else []},
        "spec": {
            "schedulerName": SCHEDULER,
            "priorityClassName": f"chaos-priority-{priority}",  # resolved by the Priority admission plugin
            "nodeSelector": {"kubernetes.io/hostname": SOLO},
            "tolerations": [SOLO_TOLERATION],
            "containers": [{"name": "c", "image": "pause", "resources": {"limits": limits}}],
        },
    }


def test_no_card_is_handed_out_twice_when_the_extender_dies_after_evicting(chaos: Chaos) -> None:
    ext = chaos.extender("preempt-a").start()
    chaos.point_scheduler(ext.url)
    ns = chaos.namespace("preempt-kill")
    for value in (5, 1000):
        chaos.cp.priority_class(f"chaos-priority-{value}", value)
    for name in ("low-0", "low-1"):
        chaos.create_pod(pod(ns, name, 5, HALF, hold=True))
    chaos.wait(lambda: len(chaos.bound(ns)) == 2, 60, "low pods not bound")

    chaos.create_pod(pod(ns, "high", 1000, WHOLE))

    def victims_evicted() -> bool:
        lows = [p for p in chaos.pods(ns) if p["metadata"]["name"].startswith("low-")]
        return len(lows) == 2 and all(p["metadata"].get("deletionTimestamp") for p in lows)

    try:
        chaos.wait(victims_evicted, 60, "victims not evicted")
        assert chaos.bound(ns).get("high") is None  # the victims still hold the card
        ext.kill()
        chaos.create_pod(pod(ns, "rival", 5, HALF))
    finally:
        for name in ("low-0", "low-1"):
            chaos.cp.api_request(
                "PATCH", f"/api/v1/namespaces/{ns}/pods/{name}", {"metadata": {"finalizers": None}}
            )
    time.sleep(1.0)  # the victims go; kube-scheduler retries the pods without an extender
    ext.start()

    chaos.wait(lambda: chaos.bound(ns).get("high") == SOLO, 90, "high-priority pod not bound")
    chaos.wait_quiet(ns, quiet_s=3.0, timeout=60)
    report = chaos.audit(ext)
    assert report.problems() == [], report.summary()
    names = {p["metadata"]["name"] for p in chaos.pods(ns) if not p["metadata"].get("deletionTimestamp")}
    assert "low-0" not in names and "low-1" not in names
    # The card is whole-taken by the high-priority pod: the rival is pending or was preempted.
    assert chaos.bound(ns).get("rival") is None
