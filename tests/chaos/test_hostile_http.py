"""Hostile HTTP clients against a real ``gpuslice serve``: no 5xx, no connection held forever.

One module fixture starts its own control plane, two fake GPU nodes and one extender
(``--leader-elect none``, header and body timeouts of 2 s). Then:

* about 2000 fuzzed malformed requests (``devcluster.hostile.probes``: deep nesting, deep unknown
  fields, truncated JSON, wrong types, huge numbers, invalid UTF-8, wrong content lengths, empty
  bodies, random bytes) over all five verbs get no 5xx, the process lives on and ``/healthz``
  answers 200; its log shows no unhandled exception;
* 200 slow connections that never finish their headers or body are all closed by the server soon
  after the timeouts, while a normal ``/filter`` on a new connection is answered meanwhile.
"""

from __future__ import annotations

import collections
import http.client
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuslice.devcluster import devcluster, hostile
from gpuslice.devcluster.controlplane import ControlPlane

pytestmark = pytest.mark.chaos

NODES = ("hostile-0", "hostile-1")
TIMEOUT_S = 2.0
PROBES = 2000
SLOW = 200


class Served:
    """The extender under test and its address."""

    def __init__(self, ext: devcluster.Extender) -> None:
        self.ext = ext
        self.port = ext.port

    def filter(self) -> tuple[int, dict[str, Any]]:
        """A normal filter call on a new connection: its status and decoded answer."""
        body = json.dumps(hostile.valid_body("/filter", random.Random(1), list(NODES)))
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("POST", "/filter", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        return resp.status, json.loads(data) if resp.status == 200 else {
            "text": data.decode(errors="replace")
        }


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    work: Path = tmp_path_factory.mktemp("hostile")
    cp = ControlPlane()
    cp.start()
    sim: devcluster.NodeSimThread | None = None
    ext: devcluster.Extender | None = None
    try:
        specs = {name: {"count": 4, "numa_nodes": 2} for name in NODES}
        sim = devcluster.NodeSimThread(cp.kubeconfig, specs).start()
        args = [
            "--leader-elect",
            "none",
            "--header-timeout-s",
            str(TIMEOUT_S),
            "--body-timeout-s",
            str(TIMEOUT_S),
            "--node-choice",  # the filter answers every feasible node: all of them are checked below
            "rank",
        ]
        ext = devcluster.Extender(cp.kubeconfig, work / "gpuslice.log", extra_args=[*args, "-v", "0"]).start()
        served = Served(ext)
        deadline = time.monotonic() + 30  # the nodes' registrations reach the extender's cache
        while served.filter()[1].get("NodeNames") != list(NODES):
            assert time.monotonic() < deadline, f"nodes not feasible: {served.filter()}\n{ext.tail()}"
            time.sleep(0.2)
        yield served
    finally:
        if ext is not None:
            ext.stop()
        if sim is not None:
            sim.stop()
        cp.stop()


def test_fuzzed_malformed_requests_never_get_a_5xx(served: Served) -> None:
    probes = hostile.probes(PROBES, seed=20261201, nodes=list(NODES))
    assert {p.verb for p in probes} == set(hostile.VERBS)
    counts = hostile.fuzz("127.0.0.1", served.port, probes, workers=8, timeout=TIMEOUT_S + 10)
    every = hostile.total(counts)
    server_errors = {kind: dict(c) for kind, c in counts.items() if any(code >= 500 for code in c)}
    assert not server_errors, f"5xx answers: {server_errors}\n{served.ext.tail()}"
    assert sum(every.values()) == PROBES
    assert every[200] > 0 and every[400] > 0 and every[413] > 0 and every[408] > 0, every
    assert counts["deep"] == collections.Counter({400: counts["deep"].total()}), counts["deep"]
    assert served.ext.running(), served.ext.tail()
    assert devcluster.http_status(served.ext.url + "/healthz") == 200
    log = served.ext.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "Exception in ASGI application" not in log, served.ext.tail(80)


def test_slow_connections_are_closed_after_the_timeouts(served: Served) -> None:
    answers: list[int] = []

    def normal_request() -> None:
        if len(answers) < 3:  # a few normal calls while the slow ones are held
            status, body = served.filter()
            assert body.get("NodeNames") == list(NODES), body
            answers.append(status)

    with hostile.SlowClients("127.0.0.1", served.port, SLOW) as slow:
        still_open = slow.wait_closed(TIMEOUT_S + 3, on_tick=normal_request)
        held_for = time.monotonic() - slow.opened
    assert still_open == {}, f"still open after {held_for:.1f} s: {still_open}"
    assert answers == [200, 200, 200]
    assert served.filter()[0] == 200
    assert served.ext.running()
