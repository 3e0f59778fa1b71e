"""Gangs while the extender is SIGKILLed: in the middle of a barrier, and while a gang commits.

A gang's members wait at the barrier in the extender's binds; a kill there drops every waiting
bind (kube-scheduler sees the connection fail and retries each member) and the plan with the
process. A kill while the members commit leaves some bound, some not. Afterwards, once the
cluster is quiet, every gang must be bound whole (or not at all: never partly), and the audit
must be clean: no card handed out twice, nobody bound without devices, no lock left.
"""

from __future__ import annotations

import json
import random
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest

from gpuslice.codec import keys
from tests.chaos import load
from tests.chaos.conftest import SCHEDULER, WORK_NODES, Chaos

pytestmark = pytest.mark.chaos

QUARTER = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "5000", "nvidia.com/gpucores": "25"}
HALF = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "50"}


def member(ns: str, gang: str, i: int, minimum: int, limits: dict[str, str]) -> dict[str, Any]:
    annotations = {keys.GANG: gang, keys.GANG_MIN_MEMBERS: str(minimum)}
    return load.pod_body(ns, f"{gang}-{i}", limits, SCHEDULER, node_names=WORK_NODES, annotations=annotations)


def waiting(url: str, ns: str, pod: str) -> int:
    """Members of ``pod``'s gang waiting at the barrier, as ``/explain`` shows them (0: unknown)."""
    query = urllib.parse.urlencode({"pod": f"{ns}/{pod}"})
    try:
        with urllib.request.urlopen(f"{url}/explain?{query}", timeout=5) as resp:
            doc = json.loads(resp.read())
    except OSError:
        return 0
    return len((doc.get("gang") or {}).get("waiting") or ())


def partly_bound(chaos: Chaos, ns: str, gangs: dict[str, int]) -> dict[str, int]:
    """Gang -> members bound, for gangs neither whole nor empty."""
    bound = chaos.bound(ns)
    out = {}
    for gang, size in gangs.items():
        n = sum(1 for i in range(size) if f"{gang}-{i}" in bound)
        if 0 < n < size:
            out[gang] = n
    return out


def test_sigkill_in_the_middle_of_a_barrier(chaos: Chaos) -> None:
    ext = chaos.extender("chaos-gang").start()
    chaos.point_scheduler(ext.url)
    ns = chaos.namespace("gangkill")
    for i in range(3):
        chaos.create_pod(member(ns, "g", i, 4, QUARTER))
    chaos.wait(lambda: waiting(ext.url, ns, "g-0") == 3, 30, "three members not at the barrier")
    assert chaos.bound(ns) == {}
    ext.kill()
    time.sleep(0.5)
    ext.start()
    chaos.create_pod(member(ns, "g", 3, 4, QUARTER))
    chaos.wait(lambda: len(chaos.bound(ns)) == 4, 90, "the gang did not bind after the restart")
    chaos.wait_quiet(ns)
    assert partly_bound(chaos, ns, {"g": 4}) == {}
    chaos.audit(ext).assert_clean("after a kill at the barrier")


def test_sigkill_while_gangs_commit(chaos: Chaos) -> None:
    ext = chaos.extender("chaos-gang").start()
    chaos.point_scheduler(ext.url)
    rng = random.Random(20261202)
    ns = chaos.namespace("gangcommit")
    gangs = {"a": 6, "b": 5, "c": 4}
    bodies = [member(ns, g, i, n, HALF if g == "a" else QUARTER) for g, n in gangs.items() for i in range(n)]
    creating = load.Background(chaos.cp, bodies, threads=3, pace_s=0.05).start()
    kills = []
    for _ in range(2):
        time.sleep(rng.uniform(0.5, 2.0))
        ext.kill()
        kills.append(len(chaos.bound(ns)))
        time.sleep(rng.uniform(0.0, 0.5))
        ext.start()
    creating.join()
    chaos.wait(
        lambda: len(chaos.bound(ns)) == sum(gangs.values()),
        120,
        f"gangs not all bound (killed with {kills} bound)",
    )
    chaos.wait_quiet(ns)
    assert partly_bound(chaos, ns, gangs) == {}
    report = chaos.audit(ext)
    print(f"\n[chaos gang] killed with {kills} members bound; {report.summary()}")
    report.assert_clean("after kills while gangs commit")
