"""Scenario b: a restarted extender must not place a pod before its caches know the cluster.

One node with one card (``chaos-solo``); pod A is bound there with 60000 MiB / 60 cores. The
extender is SIGKILLed and started again, and a pod B of 30000 MiB / 50 cores, which does not fit
beside A, is sent straight to it (``/filter``, then ``/bind``) the moment its port accepts
connections, before ``/readyz`` is 200: filter must answer an ``Error`` or list the node as failed,
bind must answer an ``Error``. Once ready, B still does not fit. The second test holds the
apiserver frozen across the restart, so the caches cannot sync while the requests arrive (the
first test's window depends on how fast the first list is).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpuslice.codec import keys
from gpuslice_dev import devcluster
from tests.chaos import load
from tests.chaos.conftest import NOBODY, SCHEDULER, SOLO, SOLO_TOLERATION, Chaos, post_json

pytestmark = pytest.mark.chaos

A_LIMITS = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "60000", "nvidia.com/gpucores": "60"}
B_LIMITS = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000", "nvidia.com/gpucores": "50"}


def _solo_pod(ns: str, name: str, limits: dict[str, str], scheduler: str) -> dict[str, Any]:
    body = load.pod_body(ns, name, limits, scheduler, node_names=[SOLO])
    body["spec"]["tolerations"] = [SOLO_TOLERATION]
    return body


def _place_a(chaos: Chaos) -> tuple[devcluster.Extender, str, dict[str, Any]]:
    """Extender up, A bound on the solo node and answered by its device plugin, B created."""
    ext = chaos.extender("chaos-main").start()
    chaos.point_scheduler(ext.url)
    ns = chaos.namespace("restart")
    chaos.create_pod(_solo_pod(ns, "a", A_LIMITS, SCHEDULER))
    chaos.wait(
        lambda: (
            chaos.pod(ns, "a")["metadata"].get("annotations", {}).get(keys.BIND_PHASE)
            == keys.BIND_PHASE_SUCCESS
        ),
        60,
        "pod a not bound and allocated on the solo node",
    )
    assert chaos.pod(ns, "a")["spec"]["nodeName"] == SOLO
    b = chaos.create_pod(_solo_pod(ns, "b", B_LIMITS, NOBODY))  # only this test sends it to the extender
    return ext, ns, b


def _filter_body(pod: dict[str, Any]) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": [SOLO]}


def _bind_body(pod: dict[str, Any]) -> dict[str, Any]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": SOLO}


def _filter_refuses(status: int, answer: Any) -> tuple[bool, str]:
    """True when a filter answer does not offer the node (an Error, or the node failed)."""
    if status == 503:
        return True, "HTTP 503"
    if status != 200 or not isinstance(answer, dict):
        return False, f"unexpected answer: HTTP {status} {answer!r}"
    if answer.get("Error"):
        return True, f"Error: {answer['Error']}"
    if SOLO in (answer.get("NodeNames") or []):
        return False, f"node offered: {answer}"
    failed = {**(answer.get("FailedNodes") or {}), **(answer.get("FailedAndUnresolvableNodes") or {})}
    return True, f"node failed: {failed.get(SOLO, '(not listed)')}"


def _bind_refuses(status: int, answer: Any) -> tuple[bool, str]:
    if status == 503:
        return True, "HTTP 503"
    if status == 200 and isinstance(answer, dict) and answer.get("Error"):
        return True, f"Error: {answer['Error']}"
    return False, f"HTTP {status} {answer!r}"


def _first_answer(url: str, body: dict[str, Any], deadline_s: float = 30.0) -> tuple[int, Any, float]:
    """POST until something answers (connection refused is retried at once); (status, body, s)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        status, answer = post_json(url, body, timeout=30)
        if status != 0:
            return status, answer, time.monotonic() - t0
        time.sleep(0.005)
    raise AssertionError(f"{url} did not answer within {deadline_s:.0f} s")


def _assert_b_not_placed(chaos: Chaos, ext: devcluster.Extender, ns: str, b: dict[str, Any]) -> None:
    """Once ready: B still does not fit; it is not bound and carries no reservation; audit clean."""
    ext_ready = chaos.wait(
        lambda: devcluster.http_status(ext.url + "/readyz") == 200, 60, "extender not ready"
    )
    assert ext_ready
    status, answer = post_json(ext.url + "/filter", _filter_body(chaos.pod(ns, "b")))
    ok, why = _filter_refuses(status, answer)
    assert ok, f"filter after ready offered the full node to b: {why}"
    status, answer = post_json(ext.url + "/bind", _bind_body(b), timeout=30)
    ok, why = _bind_refuses(status, answer)
    assert ok, f"bind after ready placed b beside a: {why}"
    time.sleep(1.0)
    pod = chaos.pod(ns, "b")
    assert not pod["spec"].get("nodeName"), "b was bound to the full node"
    report = chaos.audit(ext)
    report.assert_clean()


def test_filter_and_bind_before_ready_do_not_place(chaos: Chaos) -> None:
    ext, ns, b = _place_a(chaos)
    ext.kill()
    ext.spawn()
    t0 = time.monotonic()
    status, answer, waited = _first_answer(ext.url + "/filter", _filter_body(b))
    filter_ok, filter_why = _filter_refuses(status, answer)
    bind_status, bind_answer = post_json(ext.url + "/bind", _bind_body(b), timeout=30)
    bind_ok, bind_why = _bind_refuses(bind_status, bind_answer)
    ready_then = devcluster.http_status(ext.url + "/readyz")
    print(
        f"\n[chaos b] first filter answered {waited:.2f} s after the restart ({filter_why}); "
        f"bind: {bind_why}; /readyz right after: {ready_then}; "
        f"ready {time.monotonic() - t0:.2f} s after the restart at the latest"
    )
    assert filter_ok, f"filter right after the restart offered the full node to b: {filter_why}"
    assert bind_ok, f"bind right after the restart placed b beside a: {bind_why}"
    _assert_b_not_placed(chaos, ext, ns, b)


def test_filter_and_bind_while_apiserver_frozen_at_restart(chaos: Chaos) -> None:
    ext, ns, b = _place_a(chaos)
    ext.kill()
    chaos.cp.freeze_apiserver()
    try:
        ext.spawn()
        try:
            status, answer, _ = _first_answer(ext.url + "/filter", _filter_body(b), deadline_s=10.0)
        except AssertionError:
            # Not serving at all while it cannot reach the apiserver is safe: kube-scheduler
            # treats a refused connection as an error and places nothing.
            status, answer = 0, None
        if status == 0:
            filter_ok, filter_why = True, "no answer (not serving yet)"
        else:
            filter_ok, filter_why = _filter_refuses(status, answer)
        ready_then = devcluster.http_status(ext.url + "/readyz")
        t0 = time.monotonic()
        bind_status, bind_answer = post_json(ext.url + "/bind", _bind_body(b), timeout=20)
        bind_s = time.monotonic() - t0
        if bind_status == 0 and status == 0:
            bind_ok, bind_why = True, f"no answer (not serving yet): {bind_answer}"
        else:
            bind_ok, bind_why = _bind_refuses(bind_status, bind_answer)
    finally:
        chaos.cp.thaw_apiserver()
    print(
        f"\n[chaos b, apiserver frozen] /readyz {ready_then}; filter: {filter_why}; "
        f"bind answered after {bind_s:.1f} s: {bind_why}"
    )
    assert ready_then != 200, "the extender reported ready without being able to list anything"
    assert filter_ok, f"filter before sync offered the full node to b: {filter_why}"
    assert bind_ok, f"bind before sync did not answer an Error: {bind_why}"
    _assert_b_not_placed(chaos, ext, ns, b)
