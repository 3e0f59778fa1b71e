"""Scenario d: the apiserver goes away while binds are in flight.

First kube-apiserver is frozen (SIGSTOP) for 30 s with binds in flight and then thawed; then it is
SIGKILLed and a new one started on the same etcd. After each outage the extender must still be
the same process (same pid: it rides the outage out instead of crashing), every pod ends bound
or pending, the audit is clean and the extender's per-card usage equals the API's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from gpuslice_dev import devcluster
from tests.chaos import load
from tests.chaos.conftest import SCHEDULER, WORK_NODES, Chaos

pytestmark = pytest.mark.chaos

PODS = 80
FREEZE_S = 30.0


def _outage(chaos: Chaos, ext: devcluster.Extender, name: str, seed: int, fault: Callable[[], None]) -> None:
    ns = chaos.namespace(name)
    pid = ext.pid
    bodies = load.mixed_pods(PODS, seed, ns, SCHEDULER, node_names=WORK_NODES)
    load.create_all(chaos.cp, bodies, threads=4)
    chaos.wait(lambda: len(chaos.bound(ns)) >= 5, 60, "no pod bound before the outage")
    bound_before = len(chaos.bound(ns))
    t_fault = time.monotonic()
    fault()
    back = time.monotonic()
    bound_back = len(chaos.bound(ns))
    ready: float | None = None
    first: float | None = None
    while time.monotonic() - back < 60.0:
        now = time.monotonic() - back
        if ready is None and devcluster.http_status(ext.url + "/readyz") == 200:
            ready = now
        if first is None and len(chaos.bound(ns)) > bound_back:
            first = now
        if ready is not None and (first is not None or now - ready > 5.0):
            break  # nothing left to place, or it places again
        time.sleep(0.2)
    chaos.wait_quiet(ns)
    report = chaos.audit(ext)
    print(
        f"\n[chaos d] {name}: {bound_before} bound before, {bound_back} when the apiserver was back after "
        f"{back - t_fault:.1f} s; extender ready {_s(ready)} later; first new bind {_s(first)} after; "
        f"{report.summary()}"
    )
    assert ext.running() and ext.pid == pid, (
        f"the extender did not survive the outage (exit {ext.returncode})"
    )
    assert ready is not None, "the extender was not ready within 60 s of the apiserver's return"
    report.assert_clean(name)
    assert len(report.bound) + len(report.pending) >= PODS
    assert report.pending, "every pod was placed: the workload did not fill the cluster"
    chaos.cp.api_request("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0", timeout=60)
    chaos.wait(lambda: not chaos.pods(ns), 30, f"pods of {ns} not deleted")


def test_apiserver_frozen_then_restarted(chaos: Chaos) -> None:
    ext = chaos.extender("chaos-main").start()
    chaos.point_scheduler(ext.url)

    def freeze() -> None:
        chaos.cp.freeze_apiserver()
        time.sleep(FREEZE_S)
        chaos.cp.thaw_apiserver()

    _outage(chaos, ext, "frozen", 4000, freeze)

    def restart() -> None:
        chaos.cp.restart_apiserver()

    _outage(chaos, ext, "restarted", 4001, restart)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"
