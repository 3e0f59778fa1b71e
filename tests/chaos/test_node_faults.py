"""Scenarios e, f and g: faults on one node while the others keep scheduling.

e. The device-plugin stand-in on one node dies (``stop_node``: no handshake reports, no
   ``Allocate``, allocatable ``nvidia.com/gpu`` 0) while pods are scheduled: no new pod goes
   there once the extender noticed, a lock held there is released after the allocate timeout
   with a Warning event on its pod, and the audit is clean. Then the extender is killed between
   taking a node lock and creating the Binding (failpoint ``bind-after-lock=exit``) and started
   again without it: the node must schedule again within 10 s of the restart (HAMi would wait for
   its 300 s lock expiry).
f. A node's registration is replaced by garbage mid-run: that node gets no new pods, the others
   keep scheduling, the audit (with the node's real cards) is clean.
g. One node's device plugin never answers (``mute_node``) while kubelet still advertises its
   GPUs: 16 pods over it and two healthy nodes must all be bound within 60 s, those on the muted
   node with their devices, and its lock released after the allocate timeout.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpuslice.codec import keys
from tests.chaos import load
from tests.chaos.conftest import (
    ALLOCATE_TIMEOUT_S,
    SCHEDULER,
    WORK_NODES,
    Chaos,
    inventory,
)

pytestmark = pytest.mark.chaos

NOTICE_S = 3.0
"""Time the extender gets to notice a node fault (a node watch event) before the node must be avoided."""
RESTART_BOUND_S = 10.0
"""The bound this tier holds recovery to: a node whose lock a dead bind left behind schedules again
within 10 s (with ``conftest.FAULT_ARGS``: 3 s orphan grace, a recovery pass every 0.5 s)."""
SLACK_S = 2.0
GARBAGE = "GPU-x,notanint,7680,100,NVIDIA-T4,0,true:"
"""A registration that does not decode (the e2e tier's malformed example)."""
SMALL = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "10"}


def _bound_at(chaos: Chaos, ns: str, node: str) -> set[str]:
    return {name for name, n in chaos.bound(ns).items() if n == node}


def _warnings(chaos: Chaos, ns: str, name: str) -> list[str]:
    """Reasons of Warning events on a pod other than scheduling failures."""
    return [
        str(e.get("reason"))
        for e in chaos.events(ns, name)
        if e.get("type") == "Warning" and e.get("reason") not in ("FailedScheduling", "FilteringFailed")
    ]


def _allocating_at(chaos: Chaos, ns: str, node: str) -> list[str]:
    """Pods bound to ``node`` whose device plugin has not answered (``bind-phase: allocating``)."""
    return sorted(
        p["metadata"]["name"]
        for p in chaos.pods(ns)
        if p["spec"].get("nodeName") == node
        and p["metadata"].get("annotations", {}).get(keys.BIND_PHASE) == keys.BIND_PHASE_ALLOCATING
    )


def test_device_plugin_stops_on_one_node(chaos: Chaos) -> None:
    ext = chaos.extender("chaos-main").start()
    chaos.point_scheduler(ext.url)
    ns = chaos.namespace("plugin")
    nodes = WORK_NODES[:4]
    victim = nodes[0]
    # Something on the victim first, so binpack keeps choosing it.
    chaos.create_pod(load.pod_body(ns, "seed", SMALL, SCHEDULER, node_names=[victim]))
    chaos.wait(lambda: chaos.bound(ns).get("seed") == victim, 30, "seed pod not bound")
    # The plugin hangs first, so that a pod holds the victim's lock when the plugin dies.
    chaos.sim.mute_node(victim)
    bodies = load.mixed_pods(48, 5000, ns, SCHEDULER, node_names=nodes)
    creating = load.Background(chaos.cp, bodies, threads=2, pace_s=0.15).start()
    try:
        chaos.wait(lambda: _allocating_at(chaos, ns, victim), 20, f"no pod waiting for Allocate on {victim}")
    except AssertionError:
        pass  # the fault is still injected; the print says no lock was held
    held = chaos.node(victim)["metadata"].get("annotations", {}).get(keys.NODE_LOCK)
    t_stop = time.monotonic()
    chaos.sim.stop_node(victim)
    time.sleep(NOTICE_S)
    on_victim = _bound_at(chaos, ns, victim)
    creating.join()
    chaos.wait_quiet(ns)
    late = _bound_at(chaos, ns, victim) - on_victim
    stuck = _allocating_at(chaos, ns, victim)
    report = chaos.audit(ext, settle_timeout=ALLOCATE_TIMEOUT_S + 30)

    def warned_all() -> dict[str, list[str]] | None:
        got = {name: _warnings(chaos, ns, name) for name in stuck}
        return got if all(got.values()) else None

    try:
        warned = chaos.wait(warned_all, 30, "Warning events on the pods left allocating")
    except AssertionError:
        warned = {name: _warnings(chaos, ns, name) for name in stuck}
    print(
        f"\n[chaos e] plugin stopped on {victim} (lock then: {held}) {time.monotonic() - t_stop:.1f} s ago: "
        f"{len(on_victim)} pods there after {NOTICE_S:.0f} s, {len(late)} later; "
        f"left allocating there: {stuck} with Warnings {warned}; {report.summary()}"
    )
    assert not late, f"pods bound to {victim} after its device plugin stopped: {sorted(late)}"
    assert all(warned.values()), (
        f"a lock released after the allocate timeout without a Warning event: {warned}"
    )
    report.assert_clean()
    others = {n for n in chaos.bound(ns).values() if n != victim}
    assert others, "no other node scheduled anything"


def test_killed_between_lock_and_binding(chaos: Chaos) -> None:
    target = WORK_NODES[1]
    ext = chaos.extender("chaos-main", env={"GPUSLICE_FAILPOINTS": "bind-after-lock=exit"}).start()
    chaos.point_scheduler(ext.url)
    ns = chaos.namespace("failpoint")
    chaos.create_pod(load.pod_body(ns, "victim", SMALL, SCHEDULER, node_names=[target]))
    code = ext.wait_exit(30)
    node = chaos.node(target)
    lock = node["metadata"].get("annotations", {}).get(keys.NODE_LOCK)
    print(f"\n[chaos e] failpoint bind-after-lock: extender exit status {code}; lock on {target}: {lock}")
    assert code == 137, f"the extender did not exit at the failpoint (status {code})"
    assert lock, "the failpoint left no node lock (it should fire after the lock is taken)"
    ext.env = {}
    t0 = time.monotonic()
    ext.start()
    ready = time.monotonic() - t0
    # Probe pods for the locked node, a fresh one each second (no scheduler back-off in the way).
    probes: list[str] = []
    bound_after: float | None = None
    while time.monotonic() - t0 < 30.0 and bound_after is None:
        if len(probes) <= (time.monotonic() - t0):
            name = f"probe-{len(probes)}"
            chaos.create_pod(load.pod_body(ns, name, SMALL, SCHEDULER, node_names=[target]))
            probes.append(name)
        bound = chaos.bound(ns)
        if any(bound.get(p) == target for p in probes) or bound.get("victim") == target:
            bound_after = time.monotonic() - t0
        time.sleep(0.1)
    chaos.wait_quiet(ns, quiet_s=3.0)
    report = chaos.audit(ext)
    print(
        f"[chaos e] restarted without the failpoint: ready after {ready:.1f} s, {target} scheduled again "
        f"{'-' if bound_after is None else f'{bound_after:.1f} s'} after the restart; {report.summary()}"
    )
    assert bound_after is not None, f"{target} did not schedule within 30 s of the restart"
    assert bound_after <= RESTART_BOUND_S + SLACK_S, (
        f"{target} scheduled again only {bound_after:.1f} s after the restart (bound {RESTART_BOUND_S:.0f} s)"
    )
    report.assert_clean()


def test_garbage_registration_on_one_node(chaos: Chaos) -> None:
    ext = chaos.extender("chaos-main").start()
    chaos.point_scheduler(ext.url)
    ns = chaos.namespace("garbage")
    nodes = WORK_NODES[:4]
    victim = nodes[0]
    chaos.create_pod(load.pod_body(ns, "seed", SMALL, SCHEDULER, node_names=[victim]))
    chaos.wait(lambda: chaos.bound(ns).get("seed") == victim, 30, "seed pod not bound")
    # About half the four nodes' cards, so the other three keep room after the fault.
    bodies = load.mixed_pods(24, 6000, ns, SCHEDULER, node_names=nodes)
    creating = load.Background(chaos.cp, bodies, threads=2, pace_s=0.15).start()
    chaos.wait(lambda: len(chaos.bound(ns)) >= 6, 60, "nothing scheduled before the fault")
    chaos.patch_node_annotations(victim, {keys.NODE_REGISTER: GARBAGE})
    time.sleep(NOTICE_S)
    on_victim = _bound_at(chaos, ns, victim)
    creating.join()
    # Small pods that fit anywhere: binpack would put them on the victim first, had it room.
    after = [f"after-{i}" for i in range(8)]
    load.create_all(chaos.cp, [load.pod_body(ns, n, SMALL, SCHEDULER, node_names=nodes) for n in after])
    chaos.wait(
        lambda: all(n in chaos.bound(ns) for n in after), 60, "small pods after the fault not all bound"
    )
    chaos.wait_quiet(ns, quiet_s=3.0)
    late = _bound_at(chaos, ns, victim) - on_victim
    named = sum(
        1
        for e in chaos.events(ns)
        if e.get("reason") == "FailedScheduling" and "NodeRegistrationInvalid" in str(e.get("message", ""))
    )
    report = chaos.audit(ext, registrations_={victim: inventory(victim)})
    print(
        f"\n[chaos f] garbage registration on {victim}: {len(on_victim)} pods there at the fault, "
        f"{len(late)} later; the 8 small pods went to {sorted(set(chaos.bound(ns)[n] for n in after))}; "
        f"{named} FailedScheduling events name NodeRegistrationInvalid; {report.summary()}"
    )
    assert not late, f"pods bound to {victim} after its registration became garbage: {sorted(late)}"
    report.assert_clean()


def test_muted_device_plugin_does_not_block_the_others(chaos: Chaos) -> None:
    ext = chaos.extender("chaos-main").start()
    chaos.point_scheduler(ext.url)
    ns = chaos.namespace("muted")
    muted, healthy = WORK_NODES[2], list(WORK_NODES[3:5])
    group = [muted, *healthy]
    chaos.create_pod(load.pod_body(ns, "seed", SMALL, SCHEDULER, node_names=[muted]))
    chaos.wait(
        lambda: (
            chaos.pod(ns, "seed")["metadata"].get("annotations", {}).get(keys.BIND_PHASE)
            == keys.BIND_PHASE_SUCCESS
        ),
        30,
        "seed pod not allocated on the node to be muted",
    )
    chaos.sim.mute_node(muted)
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "20"}
    names = [f"m-{i:02d}" for i in range(16)]
    t0 = time.monotonic()
    load.create_all(
        chaos.cp, [load.pod_body(ns, n, limits, SCHEDULER, node_names=group) for n in names], threads=4
    )

    def all_bound() -> bool:
        bound = chaos.bound(ns)
        return all(n in bound for n in names)

    deadline = t0 + 60.0
    while time.monotonic() < deadline and not all_bound():
        time.sleep(0.5)
    took = time.monotonic() - t0
    bound = chaos.bound(ns)
    on_muted = sorted(n for n in names if bound.get(n) == muted)
    report = chaos.audit(ext, settle_timeout=ALLOCATE_TIMEOUT_S + 20)
    details: dict[str, Any] = {n: _warnings(chaos, ns, n) for n in on_muted}
    print(
        f"\n[chaos g] 16 pods over muted {muted} + {healthy}: {sum(n in bound for n in names)}/16 "
        f"bound after {took:.1f} s, {len(on_muted)} on the muted node (Warnings {details}); "
        f"{report.summary()}"
    )
    assert all(n in bound for n in names), f"only {sum(n in bound for n in names)}/16 bound within 60 s"
    report.assert_clean()
