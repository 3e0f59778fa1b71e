"""Two replicas that both bind at the same moment (no leader election): the node lock and the
truth check alone must keep every card within its capacity.

This is the case that double-allocated in 6 of 6 trials before the truth check: each replica's
cache learns the other's placements only through its watch, so both see the same free card. Two
driver threads play two schedulers, one per replica, pulling pods from one queue and sending
``/filter`` then ``/bind`` to their own replica for the first feasible node (binpack puts both on
the same node). Three nodes only, so the two writers collide on nodes all the time.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest

from tests.chaos import load
from tests.chaos.conftest import NOBODY, WORK_NODES, Chaos, metric_sum, post_json

pytestmark = pytest.mark.chaos

NODES = WORK_NODES[:3]
PODS = 60


def _drive(url: str, work: queue.Queue[dict[str, Any]], results: list[tuple[str, str]]) -> None:
    while True:
        try:
            pod = work.get_nowait()
        except queue.Empty:
            return
        status, answer = post_json(f"{url}/filter", {"Pod": pod, "NodeNames": list(NODES)})
        if status != 200 or not answer.get("NodeNames"):
            results.append(("unplaced", pod["metadata"]["name"]))
            continue
        meta = pod["metadata"]
        bind = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": answer["NodeNames"][0],
        }
        status, answer = post_json(f"{url}/bind", bind, timeout=40.0)
        results.append(("bound" if status == 200 and not answer.get("Error") else "refused", meta["name"]))


def test_two_replicas_binding_at_once_never_share_a_card(chaos: Chaos) -> None:
    a = chaos.extender("writer-a", extra_args=["--leader-elect", "none"]).start()
    b = chaos.extender("writer-b", extra_args=["--leader-elect", "none"]).start()
    ns = chaos.namespace("writers")
    bodies = load.mixed_pods(PODS, 7000, ns, NOBODY, node_names=NODES)
    work: queue.Queue[dict[str, Any]] = queue.Queue()
    for body in bodies:
        work.put(chaos.create_pod(body))
    results: list[tuple[str, str]] = []
    threads = [threading.Thread(target=_drive, args=(ext.url, work, results)) for ext in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    chaos.wait_quiet(ns, quiet_s=3.0)
    counts = {k: sum(1 for r, _ in results if r == k) for k in ("bound", "refused", "unplaced")}
    corrections = sum(metric_sum(e.url, "gpuslice_bind_truth_corrections_total") or 0 for e in (a, b))
    api_reads = sum(
        metric_sum(e.url, "gpuslice_bind_truth_reads_total", {"source": "api"}) or 0 for e in (a, b)
    )
    report = chaos.audit(None)
    print(
        f"\n[chaos two writers] {counts}; truth corrections {corrections:.0f}, truth checks read "
        f"from the API {api_reads:.0f}; {report.summary()}"
    )
    assert counts["bound"] > 0, "nothing was bound: the test exercised nothing"
    report.assert_clean()
    # Each replica's own per-card view must come back to the API's once its watch caught up.
    for ext in (a, b):
        chaos.audit(ext).assert_clean(ext.log_path.name)
