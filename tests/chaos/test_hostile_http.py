"""Hostile HTTP clients against a real ``gpuslice serve``: no 5xx, no connection held forever.

One module fixture starts its own control plane and two fake GPU nodes, another one extender
(``--leader-elect none``, header and body timeouts of 2 s) with an FGD-style node policy whose
learned workload is trusted from the first request and handed over at once, so a hostile pod that
reached the workload would reach every later decision. Then:

* about 2000 fuzzed requests (``devcluster.hostile.probes``: deep nesting, deep unknown fields,
  truncated JSON, wrong types, huge numbers, invalid UTF-8, wrong content lengths, empty bodies,
  random bytes; and valid requests with absurd amounts, names longer than Kubernetes allows, 256 KB
  of unrelated annotations or thousands of labels) over all five verbs get no 5xx, the process
  lives on and ``/healthz`` answers 200; its log shows no unhandled exception; an ordinary pod is
  still placed after them;
* 200 slow connections that never finish their headers or body are all closed by the server soon
  after the timeouts, while a normal ``/filter`` on a new connection is answered meanwhile;
* on a fresh extender, what requests bring is not kept: the resident set grows by less than
  30 MiB over 200 filter calls for pods carrying 256 KB of unrelated annotations (pods never
  created in the API, as kube-scheduler sends them), over 10 000 distinct over-long node names
  (refused), and over 10 000 distinct names at Kubernetes' 253-character limit (answered).
"""

from __future__ import annotations

import collections
import dataclasses
import http.client
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuslice_dev import devcluster, hostile
from gpuslice_dev.controlplane import ControlPlane

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


@dataclasses.dataclass
class Plane:
    """The module's control plane, with the fake nodes registered."""

    cp: ControlPlane
    work: Path

    def extender(self, name: str, *args: str) -> devcluster.Extender:
        """A started extender (the caller stops it), once the nodes are feasible for it."""
        ext = devcluster.Extender(
            self.cp.kubeconfig, self.work / f"{name}.log", extra_args=[*BASE_ARGS, *args, "-v", "0"]
        ).start()
        served = Served(ext)
        deadline = time.monotonic() + 30  # the nodes' registrations reach the extender's cache
        while served.filter()[1].get("NodeNames") != list(NODES):
            if time.monotonic() > deadline:
                ext.stop()
                raise AssertionError(f"nodes not feasible: {served.filter()}\n{ext.tail()}")
            time.sleep(0.2)
        return ext


BASE_ARGS = (
    "--leader-elect",
    "none",
    "--header-timeout-s",
    str(TIMEOUT_S),
    "--body-timeout-s",
    str(TIMEOUT_S),
    "--node-choice",  # the filter answers every feasible node: all of them are checked below
    "rank",
)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    cp = ControlPlane()
    cp.start()
    sim: devcluster.NodeSimThread | None = None
    try:
        specs = {name: {"count": 4, "numa_nodes": 2} for name in NODES}
        sim = devcluster.NodeSimThread(cp.kubeconfig, specs).start()
        yield Plane(cp, tmp_path_factory.mktemp("hostile"))
    finally:
        if sim is not None:
            sim.stop()
        cp.stop()


@pytest.fixture(scope="module")
def served(plane: Plane) -> Iterator[Served]:
    ext = plane.extender("gpuslice", *hostile.LEARNING_ARGS)
    try:
        yield Served(ext)
    finally:
        ext.stop()


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
    for kind in ("absurd-value", "long-name", "big-metadata"):  # the hostile values were all sent
        assert counts[kind].total() > 0 and not counts[kind][0], (kind, counts[kind])
    assert counts["long-name"] == collections.Counter({400: counts["long-name"].total()}), counts["long-name"]
    status, body = served.filter()  # an ordinary pod is still placed, by the learned workload's policy
    assert status == 200 and body["NodeNames"] == list(NODES), body


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


# ----- what requests bring is not kept


def _post(port: int, verb: str, body: dict[str, Any]) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", verb, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


GROWTH_MIB = 30.0


@pytest.mark.parametrize("case", hostile.MEMORY_CASES)
def test_what_requests_carry_is_not_kept(plane: Plane, case: str) -> None:
    ext = plane.extender(f"memory-{case.replace(' ', '-')}", *hostile.LEARNING_ARGS)
    try:
        assert ext.pid is not None
        rng = random.Random(7)
        for _ in range(20):  # warm up: the first calls fill the interpreter's own caches
            assert _post(ext.port, "/filter", hostile.valid_body("/filter", rng, list(NODES))) == 200
        before = hostile.settled_rss(ext.pid, 10.0, 0.5)
        for i in range(200):
            verb, body, want = hostile.memory_probe(case, i, rng, list(NODES))
            assert _post(ext.port, verb, body) == want
        growth = hostile.settled_rss(ext.pid, 10.0, 0.5) - before
        assert growth < GROWTH_MIB, f"{case}: RSS grew {growth:.1f} MiB (from {before:.1f})\n{ext.tail()}"
        assert ext.running()
    finally:
        ext.stop()
