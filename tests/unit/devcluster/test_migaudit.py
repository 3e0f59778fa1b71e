"""The MIG audit must be able to fail: each finding comes from a hand-made API read.

Nodes and pods are the JSON shapes ``GET /api/v1/nodes`` and ``/pods`` return; the annotations are
written by gpuslice's encoders and the stand-ins' ``Allocate`` (``migsim``), the audit reads them
with its own decoder.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuslice.codec import keys, pod_devices, registrations
from gpuslice.model import allocations, mig
from gpuslice_dev import migsim, nodesim
from tests.chaos import audit as chaos_audit
from tests.e2e import gpuaudit, migaudit

pytestmark = pytest.mark.unit

NODE = "mig-0"
CARDS = nodesim.cards(NODE, count=3, memory_mib=40960, mig_cards={0, 1})
A, B, SHARED = (c.uuid for c in CARDS)
PROFILES = {p.name: p for p in migsim.A100_40GB}


def node() -> dict[str, Any]:
    return {"metadata": {"name": NODE, "annotations": {keys.NODE_REGISTER: registrations.encode_json(CARDS)}}}


def grant(uuid: str, profile: str, start: int) -> allocations.DeviceGrant:
    p = PROFILES[profile]
    return allocations.DeviceGrant(uuid, p.memory_mib, p.cores, mig=mig.Slice(start, p.size, profile))


def pod(
    name: str,
    *containers: tuple[allocations.DeviceGrant, ...],
    realised: bool = True,
    mode: str | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    alloc = allocations.PodAllocation(node=NODE, containers=tuple(containers))
    ann = pod_devices.bind_annotations(alloc, 1_800_000_000.0)
    ann[keys.BIND_PHASE] = keys.BIND_PHASE_SUCCESS if realised else keys.BIND_PHASE_ALLOCATING
    if realised and keys.MIG_ALLOCATIONS in ann:
        value = migsim.realised_value(ann[keys.MIG_ALLOCATIONS])
        assert value is not None
        ann[keys.MIG_ALLOCATIONS] = value
    if mode is not None:
        ann[keys.VGPU_MODE] = mode
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": ann},
        "spec": {"nodeName": NODE, "containers": [{"name": f"c{i}"} for i in range(len(containers))]},
        "status": {"phase": phase},
    }


def records(p: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = json.loads(p["metadata"]["annotations"][keys.MIG_ALLOCATIONS])
    return out


def set_records(p: dict[str, Any], recs: list[dict[str, Any]]) -> dict[str, Any]:
    p["metadata"]["annotations"][keys.MIG_ALLOCATIONS] = json.dumps(recs)
    return p


def clean() -> list[dict[str, Any]]:
    return [
        pod("small", (grant(A, "1g.5gb", 6), grant(A, "1g.5gb", 5))),
        pod("mid", (grant(A, "2g.10gb", 0),), mode="mig"),
        pod("half", (grant(B, "3g.20gb", 4),)),
        pod("core", (allocations.DeviceGrant(SHARED, 1000, 10),), mode="hami-core"),
    ]


def test_a_clean_read_has_no_findings_in_any_audit() -> None:
    pods = clean()
    assert migaudit.findings([node()], pods) == []
    assert gpuaudit.audit([node()], pods).problems == []
    assert chaos_audit.api_usage([node()], pods).mig == []
    held = migaudit.instances(pods)
    assert sorted((x.start, x.size) for x in held[A]) == [(0, 2), (5, 1), (6, 1)]


def test_seven_1g_instances_are_not_over_committed_cores() -> None:
    # Profile cores are rounded up: 7 x 15 = 105 % of a card that registers 100.
    pods = [pod("one", (grant(A, "1g.5gb", 0), grant(A, "1g.5gb", 1), grant(A, "1g.5gb", 2)))]
    pods += [pod(f"p{s}", (grant(A, "1g.5gb", s),)) for s in range(3, 7)]
    assert migaudit.findings([node()], pods) == []
    assert gpuaudit.audit([node()], pods).problems == []
    report = chaos_audit.api_usage([node()], pods)
    assert report.cards[A].cores == 105 and report.problems() == []
    # A hami-core card still has its sums checked.
    shared = [pod(f"s{i}", (allocations.DeviceGrant(SHARED, 1000, 60),)) for i in range(2)]
    assert any("cores" in p for p in gpuaudit.audit([node()], shared).problems)
    assert any("cores 120 > 100" in p for p in chaos_audit.api_usage([node()], shared).problems())


def test_overlapping_instances_across_pods() -> None:
    pods = [*clean(), pod("clash", (grant(A, "2g.10gb", 4),))]  # slices 4-5: 5 is "small"'s
    (f,) = migaudit.findings([node()], pods)
    assert "overlaps" in f and A in f
    report = chaos_audit.api_usage([node()], pods)
    assert any("overlaps" in p for p in report.problems())
    assert any("overlaps" in p for p in gpuaudit.audit([node()], pods).problems)


def test_overlap_of_a_finished_pod_does_not_count() -> None:
    pods = [*clean(), pod("gone", (grant(A, "2g.10gb", 4),), phase="Succeeded")]
    assert migaudit.findings([node()], pods) == []


def test_illegal_placement_and_unknown_profile() -> None:
    odd = pod("odd", (grant(B, "3g.20gb", 0),))
    recs = records(odd)
    recs[0]["placement"] = {"start": 2, "size": 4}  # 3g may start at 0 or 4 only
    found = migaudit.findings([node()], [set_records(odd, recs)])
    assert any("not a legal placement" in f for f in found), found
    recs[0]["profile"] = "5g.99gb"
    found = migaudit.findings([node()], [set_records(odd, recs)])
    assert any("offers no profile" in f for f in found), found


def test_record_on_a_shared_card_or_foreign_card() -> None:
    odd = pod("odd", (grant(B, "1g.5gb", 0),))
    recs = records(odd)
    recs[0]["gpuUUID"] = SHARED
    found = migaudit.findings([node()], [set_records(odd, recs)])
    assert any("not MIG" in f for f in found), found
    recs[0]["gpuUUID"] = "GPU-elsewhere"
    found = migaudit.findings([node()], [set_records(odd, recs)])
    assert any("not registered by the pod's node" in f for f in found), found


def test_runtime_identity_partial_missing_and_duplicated() -> None:
    p = pod("p", (grant(A, "1g.5gb", 0),))
    recs = records(p)
    del recs[0]["computeInstanceID"]
    assert any("partial runtime identity" in f for f in migaudit.findings([node()], [set_records(p, recs)]))
    for k in migaudit.RUNTIME[:2]:
        del recs[0][k]
    assert any("no runtime identity" in f for f in migaudit.findings([node()], [set_records(p, recs)]))
    # Before Allocate (bind-phase allocating) a record has no identity yet: fine.
    assert migaudit.findings([node()], [pod("early", (grant(A, "1g.5gb", 0),), realised=False)]) == []
    a, b = pod("a", (grant(A, "1g.5gb", 0),)), pod("b", (grant(A, "1g.5gb", 1),))
    rb = records(b)
    rb[0]["gpuInstanceID"] = records(a)[0]["gpuInstanceID"]
    rb[0]["migUUID"] = records(a)[0]["migUUID"]
    found = migaudit.findings([node()], [a, set_records(b, rb)])
    assert any("GPU instance id" in f for f in found) and any("MIG UUID" in f for f in found), found


def test_grant_must_equal_the_profile_and_have_a_record() -> None:
    p = pod("p", (grant(A, "3g.20gb", 0),))
    ann = p["metadata"]["annotations"]
    mib = PROFILES["3g.20gb"].memory_mib
    ann[keys.DEVICES_ALLOCATED] = ann[keys.DEVICES_ALLOCATED].replace(f",{mib},43", ",20000,43")
    found = migaudit.findings([node()], [p])
    assert any("grant 20000 MiB/43 cores" in f for f in found), found
    bare = pod("bare", (allocations.DeviceGrant(B, 4864, 15),))
    found = migaudit.findings([node()], [bare])
    assert any("without a MIG record" in f for f in found), found
    moved = pod("moved", (grant(A, "1g.5gb", 3),))
    recs = records(moved)
    recs[0]["deviceIndex"] = 1
    found = migaudit.findings([node()], [set_records(moved, recs)])
    assert any("container 0 device 1" in f for f in found), found


def test_a_pod_asking_hami_core_on_a_mig_card() -> None:
    found = migaudit.findings([node()], [pod("p", (grant(A, "1g.5gb", 0),), mode="hami-core")])
    assert any("hami-core" in f and "'mig' card" in f for f in found), found
    assert migaudit.findings([node()], [pod("q", (grant(A, "1g.5gb", 0),), mode="hami-core,mig")]) == []


def test_undecodable_annotation() -> None:
    p = pod("p", (grant(A, "1g.5gb", 0),))
    p["metadata"]["annotations"][keys.MIG_ALLOCATIONS] = "{not json"
    found = migaudit.findings([node()], [p])
    assert any("does not decode" in f for f in found), found
