"""MIG through a real kube-scheduler: instances placed, realised at Allocate, audited from the API.

Its own cluster (the shared e2e nodes have no MIG card): ``mig-full`` with two A100-40GB cards in
MIG mode, ``mig-mixed`` with one MIG card and one ``hami-core`` card, both registered as HAMi's
device plugin does (``migProfiles``, count 7, 100 cores; ``gpuslice_dev.migsim``). ``nodesim``
plays ``Allocate``: it answers the bind and records every instance's MIG UUID and GPU/compute
instance ids in the same annotation patch.

Pods ask ``nvidia.com/gpu`` and ``nvidia.com/gpumem`` with ``nvidia.com/vgpu-mode: mig``,
``hami-core`` or no mode; one container asks two instances; one asks more than any profile holds
and stays Pending with ``MigPlacementInfeasible``. Then the extender is killed and restarted,
and new pods fill every free ``1g`` placement: exactly as many bind as the API says are free, so
the restarted extender rebuilt the occupancy from the annotations alone (its
``gpuslice_mig_slices{state="held"}`` equals the slices the API's records hold, before and after).
Every check reads the API (``migaudit``, ``gpuaudit``, the chaos audit with the extender's gauges).
"""

from __future__ import annotations

import json
import re
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.codec import keys
from gpuslice_dev import devcluster, migsim
from gpuslice_dev.controlplane import ControlPlane
from tests.chaos import audit as chaos_audit
from tests.e2e import gpuaudit, hamiwire, migaudit
from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e

SCHEDULER = "gpuslice-scheduler"
FULL, MIXED = "mig-full", "mig-mixed"
NODES: dict[str, dict[str, Any]] = {
    FULL: {"model": migsim.A100_40GB_MODEL, "count": 2, "memory_mib": 40960, "mig_cards": {0, 1}},
    MIXED: {"model": migsim.A100_40GB_MODEL, "count": 2, "memory_mib": 40960, "mig_cards": {0}},
}
PROFILES = {p.name: p for p in migsim.A100_40GB}
MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.fixture(scope="module")
def mig_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work: Path = tmp_path_factory.mktemp("e2e-mig")
    cp = ControlPlane()
    cp.start()
    sim: devcluster.NodeSimThread | None = None
    ext: devcluster.Extender | None = None
    try:
        sim = devcluster.NodeSimThread(cp.kubeconfig, NODES).start()
        ext = devcluster.Extender(cp.kubeconfig, work / "gpuslice.log", extra_args=["-v", "4"]).start()
        cp.start_scheduler(devcluster.render_scheduler_config(ext.url, cp.kubeconfig, SCHEDULER))
        yield Cluster(cp, ext)
    finally:
        if ext is not None:
            ext.stop()
        if sim is not None:
            sim.stop()
        cp.stop()


def limits(memory_mib: int, count: int = 1) -> dict[str, str]:
    return {"nvidia.com/gpu": str(count), "nvidia.com/gpumem": str(memory_mib)}


def mode(value: str | None) -> dict[str, str] | None:
    return None if value is None else {keys.VGPU_MODE: value}


def wait_allocated(c: Cluster, ns: str, name: str, timeout: float = 60.0) -> dict[str, Any]:
    """The pod once bound and past the device plugin's ``Allocate`` (``bind-phase: success``)."""

    def done() -> dict[str, Any] | None:
        pod = c.pod(ns, name)
        ann = pod["metadata"].get("annotations") or {}
        return pod if pod["spec"].get("nodeName") and ann.get(keys.BIND_PHASE) == "success" else None

    result: dict[str, Any] = c.wait(done, timeout, f"pod {ns}/{name} not allocated")
    return result


def records(pod: dict[str, Any]) -> list[dict[str, Any]]:
    value = (pod["metadata"].get("annotations") or {}).get(keys.MIG_ALLOCATIONS, "")
    out: list[dict[str, Any]] = json.loads(value) if value else []
    return out


def registered_modes(c: Cluster) -> dict[str, str]:
    nodes, _ = chaos_audit.read(c.cp)
    return {u: card.mode for u, card in migaudit.cards_of(nodes).items()}


def audit_clean(c: Cluster, context: str) -> None:
    nodes, pods = chaos_audit.read(c.cp)
    assert migaudit.findings(nodes, pods) == [], context
    assert gpuaudit.audit(nodes, pods).problems == [], context
    chaos_audit.audit(c.cp, extender_url=c.ext.url).assert_clean(context)


def smallest(memory_mib: int) -> str:
    """HAMi's choice of profile: the least memory that holds the request, then fewer compute slices."""
    fits = [p for p in migsim.A100_40GB if p.memory_mib >= memory_mib]
    return min(fits, key=lambda p: (p.memory_mib, p.slice_count)).name


def held_by_extender(c: Cluster) -> dict[str, int]:
    """``gpuslice_mig_slices{state="held"}`` per card UUID, as the extender's cache counts it."""
    out: dict[str, int] = {}
    for family in text_string_to_metric_families(chaos_audit.scrape(c.ext.url)):
        for sample in family.samples:
            if sample.name == "gpuslice_mig_slices" and sample.labels.get("state") == "held":
                out[sample.labels["uuid"]] = round(sample.value)
    return out


def held_by_api(c: Cluster) -> dict[str, int]:
    """Slices held per MIG card UUID, from the pods' MIG annotations (0 for an idle card)."""
    nodes, pods = chaos_audit.read(c.cp)
    held = migaudit.instances(pods)
    return {
        u: sum(x.size for x in held.get(u, []))
        for u, card in migaudit.cards_of(nodes).items()
        if card.mode == migaudit.MODE_MIG
    }


def free_1g(c: Cluster) -> int:
    """Free ``1g`` placements over every MIG card, from the API (registrations and held records)."""
    nodes, pods = chaos_audit.read(c.cp)
    held = migaudit.instances(pods)
    free = 0
    for u, card in migaudit.cards_of(nodes).items():
        prof = card.profiles.get("1g.5gb")
        if card.mode != "mig" or prof is None:
            continue
        taken = held.get(u, [])
        free += sum(
            1 for s, n in prof.placements if not any(s < x.start + x.size and x.start < s + n for x in taken)
        )
    return free


def test_mig_pods_through_kube_scheduler_and_a_restart(mig_cluster: Cluster) -> None:
    c = mig_cluster
    ns = c.namespace("mig")
    # (name, MiB, instances, mode, expected profile: the smallest that holds the memory, or None)
    wanted: list[tuple[str, int, int, str | None, str | None]] = [
        ("m-7g", 30000, 1, "mig", "7g.40gb"),
        ("m-3g-a", 15000, 1, "mig", "3g.20gb"),
        ("m-3g-b", PROFILES["3g.20gb"].memory_mib, 1, "mig", "3g.20gb"),
        ("m-1g10", 9000, 1, "mig", "1g.10gb"),
        ("m-1g", 4000, 1, "mig", "1g.5gb"),
        ("m-pair", 4000, 2, "mig", "1g.5gb"),
        ("core", 5000, 1, "hami-core", None),
        ("free-a", 3000, 1, None, None),
        ("free-b", 8000, 1, None, None),
    ]
    for _, mib, _, m, profile in wanted:
        assert m != "mig" or profile == smallest(mib)
    # Nothing offers 40500 MiB as one instance, though every card, still empty, registers 40960.
    c.create_pod(ns, "too-big", limits(40500), annotations=mode("mig"))
    event = c.wait_event(ns, "too-big", "FailedScheduling", timeout=45)
    assert "MigPlacementInfeasible" in event["message"], event["message"]
    placed: dict[str, dict[str, Any]] = {}
    for name, mib, n, m, _ in wanted:  # one at a time: the 7g needs a card nobody else took
        c.create_pod(ns, name, limits(mib, n), annotations=mode(m))
        placed[name] = wait_allocated(c, ns, name)
    modes = registered_modes(c)
    for name, _, n, m, profile in wanted:
        pod = placed[name]
        recs = records(pod)
        held = [
            g
            for row in hamiwire.decode_pod_devices(pod["metadata"]["annotations"][keys.DEVICES_ALLOCATED])
            for g in row
        ]
        assert len(held) == n, (name, held)
        if m == "mig" and profile is not None:
            assert [r["profile"] for r in recs] == [profile] * n, (name, recs)
            assert [(r["containerIndex"], r["deviceIndex"]) for r in recs] == [(0, d) for d in range(n)]
            for r, g in zip(recs, held, strict=True):
                assert modes[r["gpuUUID"]] == "mig" and g.uuid == r["gpuUUID"]
                assert MIG_UUID.match(r["migUUID"]) and isinstance(r["gpuInstanceID"], int), r
                assert r["computeInstanceID"] == 0
                assert (g.memory_mib, g.cores) == (PROFILES[profile].memory_mib, PROFILES[profile].cores)
                assert (r["placement"]["start"], r["placement"]["size"]) in {
                    (p.start, p.size) for p in PROFILES[profile].placements
                }
        elif m == "hami-core":
            assert recs == [] and all(modes[g.uuid] == "hami-core" for g in held), (name, held)
            assert pod["spec"]["nodeName"] == MIXED
        else:  # no mode: a share of the hami-core card or an instance, each consistent
            on_mig = [g for g in held if modes[g.uuid] == "mig"]
            assert len(recs) == len(on_mig), (name, recs, held)
    pair = records(placed["m-pair"])
    assert len({(r["gpuUUID"], r["placement"]["start"]) for r in pair}) == 2
    assert not c.pod(ns, "too-big")["spec"].get("nodeName")
    audit_clean(c, "after the first binds")

    # Restart: the extender knows the instances only from the pods' annotations.
    c.ext.restart()
    expected = held_by_api(c)
    assert sum(expected.values()) > 0
    c.wait(lambda: held_by_extender(c) == expected, 30, f"the restarted extender holds {expected} slices")
    free = free_1g(c)
    assert free > 0
    late = [f"late-{i}-{uuidlib.uuid4().hex[:4]}" for i in range(free + 1)]
    for name in late:
        c.create_pod(ns, name, limits(4000), annotations=mode("mig"))

    def settled() -> list[str] | None:
        pods = {p: c.pod(ns, p) for p in late}
        bound = [p for p, obj in pods.items() if obj["spec"].get("nodeName")]
        if len(bound) < free or any(
            (obj["metadata"].get("annotations") or {}).get(keys.BIND_PHASE) != "success"
            for p, obj in pods.items()
            if p in bound
        ):
            return None
        return bound

    try:
        bound = c.wait(settled, 90, f"{free} of {len(late)} late pods bound and allocated")
    except AssertionError as exc:
        why = {p: [e.get("message") for e in c.events(ns, p)] for p in late}
        raise AssertionError(f"{exc}\nevents of the late pods: {why}") from None
    (left,) = [p for p in late if p not in bound]
    event = c.wait_event(ns, left, "FailedScheduling", timeout=45)
    # gpuslice's reasons only (a MIG card's memory, instances or placements all taken; at bind when
    # a sibling took the last one after filter), not kube-scheduler's.
    assert re.search(r"MigPlacementInfeasible|InsufficientGPUMemory|GPUSlotsExhausted", event["message"]), (
        event["message"]
    )
    assert "nvidia.com/gpu" not in event["message"], event["message"]
    assert len([p for p in late if c.pod(ns, p)["spec"].get("nodeName")]) == free
    assert free_1g(c) == 0
    audit_clean(c, "after the restart and the late binds")
    c.wait(lambda: held_by_extender(c) == held_by_api(c), 30, "the extender's held slices match the API's")

    # A departure frees its instance: the 7g's card, emptied, takes a new 7g (the left-over 1g pod
    # goes first so that it cannot take a slice of the freed card).
    c.delete_pod(ns, left)
    (gone,) = records(placed["m-7g"])
    c.delete_pod(ns, "m-7g")
    c.wait(lambda: held_by_extender(c).get(gone["gpuUUID"]) == 0, 30, "the 7g's slices released")
    c.create_pod(ns, "again-7g", limits(30000), annotations=mode("mig"))
    (again,) = records(wait_allocated(c, ns, "again-7g"))
    assert (again["gpuUUID"], again["profile"]) == (gone["gpuUUID"], "7g.40gb")
    audit_clean(c, "after a departure and a new 7g")
