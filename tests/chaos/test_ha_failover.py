"""Scenario c: two replicas behind a Service, the leader SIGKILLed while pods are scheduled.

Both replicas run ``--leader-elect lease`` on the same Lease with distinct identities; kube-
scheduler reaches them through ``devcluster.ServiceProxy``, which forwards new connections only
to a replica whose ``/readyz`` is 200 (the leader). A ``/bind`` sent straight to the follower must
be refused with an ``Error`` and bind nothing. Then pods are created at a steady pace, the leader
is SIGKILLed, and binding must resume through the standby within the lease duration + 5 s; the
audit (against the standby's gauges) must be clean.
"""

from __future__ import annotations

import time

import pytest

from gpuslice_dev import devcluster
from tests.chaos import load
from tests.chaos.conftest import (
    LEASE_DURATION_S,
    NOBODY,
    SCHEDULER,
    WORK_NODES,
    Chaos,
    metric_sum,
    post_json,
)

pytestmark = pytest.mark.chaos

PODS = 72
FAILOVER_BOUND_S = LEASE_DURATION_S + 5.0
"""The bound this tier holds failover to: binding resumes on the standby within the lease duration + 5 s."""
BOUND_METRIC = "gpuslice_bind_total"


def _binds(url: str) -> float:
    """The replica's successful binds so far (``gpuslice_bind_total{outcome="bound"}``)."""
    got = metric_sum(url, BOUND_METRIC, {"outcome": "bound"})
    return 0.0 if got is None else got


def test_follower_refuses_bind_and_standby_takes_over(chaos: Chaos) -> None:
    leader = chaos.extender("chaos-a").start()
    standby = chaos.extender("chaos-b").start(wait_ready=False)
    # The follower serves HTTP but is not ready: it must stay out of the Service.
    time.sleep(2.0)
    assert devcluster.http_status(standby.url + "/readyz") == 503, "a follower reported ready"
    assert devcluster.http_status(leader.url + "/readyz") == 200
    proxy = chaos.proxy([leader.url, standby.url])
    chaos.wait(lambda: proxy.ready_backends() == [leader.url], 10, "proxy does not see only the leader ready")
    chaos.point_scheduler(proxy.url)

    ns = chaos.namespace("ha")
    direct = chaos.create_pod(
        load.pod_body(ns, "direct", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}, NOBODY)
    )
    meta = direct["metadata"]
    bind = {"PodName": meta["name"], "PodNamespace": ns, "PodUID": meta["uid"], "Node": WORK_NODES[0]}
    status, answer = post_json(standby.url + "/bind", bind, timeout=30)
    print(f"\n[chaos c] direct bind to the follower: HTTP {status} {answer}")
    assert status == 503 or (status == 200 and isinstance(answer, dict) and answer.get("Error")), (
        f"the follower did not refuse a bind: HTTP {status} {answer!r}"
    )
    time.sleep(1.0)
    assert not chaos.pod(ns, "direct")["spec"].get("nodeName"), "the follower bound a pod"

    bodies = load.mixed_pods(PODS, 3000, ns, SCHEDULER, node_names=WORK_NODES)
    creating = load.Background(chaos.cp, bodies, threads=2, pace_s=0.25).start()
    chaos.wait(lambda: len(chaos.bound(ns)) >= 10, 60, "the leader did not bind 10 pods")
    standby_before = _binds(standby.url)
    t_kill = time.monotonic()
    leader.kill()  # returns once the leader is reaped: every later Binding is the standby's
    bound_at_kill = len(chaos.bound(ns))
    standby_ready: float | None = None
    resumed: float | None = None
    standby_bound: float | None = None
    deadline = t_kill + 60.0
    while time.monotonic() < deadline and (resumed is None or standby_bound is None):
        now = time.monotonic()
        if standby_ready is None and devcluster.http_status(standby.url + "/readyz") == 200:
            standby_ready = now - t_kill
        if standby_bound is None and _binds(standby.url) > standby_before:
            standby_bound = now - t_kill
        if resumed is None and len(chaos.bound(ns)) > bound_at_kill:
            resumed = now - t_kill
        time.sleep(0.1)
    bound_after = len(chaos.bound(ns))
    names = creating.join()
    assert len(names) == PODS
    chaos.wait_quiet(ns)
    report = chaos.audit(standby)
    print(
        f"[chaos c] leader SIGKILLed with {bound_at_kill} pods bound: standby ready after "
        f"{_s(standby_ready)}, first new Binding (API) after {_s(resumed)}, standby's bind counter "
        f"moved after {_s(standby_bound)} (bound: {bound_after}); proxy forwarded {proxy.forwarded}, "
        f"refused {proxy.refused}; {report.summary()}"
    )
    assert resumed is not None, "no pod was bound within 60 s of the leader's death"
    assert resumed <= FAILOVER_BOUND_S, f"failover took {resumed:.1f} s > {FAILOVER_BOUND_S:.0f} s"
    report.assert_clean()
    assert not chaos.pod(ns, "direct")["spec"].get("nodeName"), "the direct pod got bound"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"
