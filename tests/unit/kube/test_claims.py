"""Another scheduler's filter claim on an unbound pod: when it is held, when it is stale (``kube.claims``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from gpuslice.cache import cache as cluster_cache
from gpuslice.codec import keys, pod_devices, registrations
from gpuslice.codec import locks as lockcodec
from gpuslice.framework import nominations
from gpuslice.kube import claims, informer, objects, sync
from gpuslice.model import allocations, devices

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0
EXPIRY = 300.0
SEEN = NOW  # first seen now, unless a case says otherwise
DEVICES = "GPU-a,NVIDIA,1000,0:;"


def pod(
    written: float | str | None = NOW - 10,
    node_name: str = "",
    phase: str | None = None,
    claim: str | None = "n1",
) -> objects.Pod:
    ann: dict[str, str] = {}
    if claim is not None:
        ann = {keys.VGPU_NODE: claim, keys.DEVICES_ALLOCATED: DEVICES, keys.DEVICES_TO_ALLOCATE: DEVICES}
    if written is not None:
        ann[keys.VGPU_TIME] = written if isinstance(written, str) else str(int(written))
    if phase is not None:
        ann[keys.BIND_PHASE] = phase
        ann[keys.BIND_TIME] = str(int(NOW - 400))
    meta = objects.ObjectMeta(name="p", namespace="ns", uid="u1", annotations=ann)
    return objects.Pod(
        metadata=meta, spec=objects.PodSpec(node_name=node_name, containers=[objects.Container(name="c")])
    )


def lock(age_s: float, owner: str | None = "ns/p") -> str:
    taken = NOW - age_s
    if owner is None:
        return dt.datetime.fromtimestamp(taken, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ns, name = owner.split("/")
    return lockcodec.encode(taken, ns, name)


S = claims.State


@pytest.mark.parametrize(
    ("the_pod", "lock_value", "seen_at", "expected"),
    [
        # written 10 s ago: the scheduler that wrote it may still bind it
        (pod(NOW - 10), None, SEEN, S.FRESH),
        # 301 s counted from the end of its second (NOW - 300 + 1): not yet older than 300 s
        (pod(NOW - 300), None, SEEN, S.FRESH),
        (pod(NOW - 302), None, SEEN, S.STALE),
        (pod(NOW - 3600), None, SEEN, S.STALE),
        # a lock on the claimed node naming the pod: a bind may be between its lock and its Binding
        (pod(NOW - 3600), lock(10), SEEN, S.LOCKED),
        # ... but not once the lock itself has expired (HAMi's next acquirer takes it over)
        (pod(NOW - 3600), lock(EXPIRY + 5), SEEN, S.STALE),
        # a legacy lock without owner may be the pod's bind
        (pod(NOW - 3600), lock(10, owner=None), SEEN, S.LOCKED),
        (pod(NOW - 3600), lock(EXPIRY + 5, owner=None), SEEN, S.STALE),
        # another pod's lock, or one nobody can read, is no bind of this pod
        (pod(NOW - 3600), lock(10, owner="ns/other"), SEEN, S.STALE),
        (pod(NOW - 3600), lock(10, owner="other/p"), SEEN, S.STALE),
        (pod(NOW - 3600), "not a lock", SEEN, S.STALE),
        # without a readable time the age counts from when this process first saw the claim
        (pod(None), None, NOW - 10, S.FRESH),
        (pod(None), None, NOW - EXPIRY - 1, S.STALE),
        (pod("soon"), None, NOW - EXPIRY - 1, S.STALE),
        # stamped ahead of this clock: it existed when first seen, so it ages from then
        (pod(NOW + 86400), None, NOW - EXPIRY - 1, S.STALE),
        (pod(NOW + 86400), None, NOW - 10, S.FRESH),
    ],
    ids=[
        "young",
        "at-the-expiry",
        "just-past-the-expiry",
        "hour-old",
        "lock-names-the-pod",
        "lock-naming-the-pod-expired",
        "ownerless-lock",
        "ownerless-lock-expired",
        "lock-of-another-pod",
        "lock-of-same-name-other-namespace",
        "malformed-lock",
        "no-time-seen-lately",
        "no-time-seen-long-ago",
        "unreadable-time",
        "future-time-seen-long-ago",
        "future-time-seen-lately",
    ],
)
def test_judge(the_pod: objects.Pod, lock_value: str | None, seen_at: float, expected: claims.State) -> None:
    claim = claims.judge(the_pod, lock_value, NOW, EXPIRY, seen_at)
    assert claim is not None and claim.state is expected, claim
    assert claim.held is (expected is not S.STALE)
    assert claim.node == "n1"


@pytest.mark.parametrize(
    "the_pod",
    [
        pod(NOW - 3600, node_name="n1"),  # bound: the claim is its allocation
        pod(NOW - 3600, phase=keys.BIND_PHASE_ALLOCATING),  # a bind's (gpuslice's or HAMi's): recovery's
        pod(NOW - 3600, phase=keys.BIND_PHASE_SUCCESS),
        pod(NOW - 3600, claim=None),  # no claim at all
    ],
    ids=["bound", "bind-phase-allocating", "bind-phase-success", "no-claim"],
)
def test_claims_a_bind_took_up_are_never_judged(the_pod: objects.Pod) -> None:
    assert claims.judge(the_pod, None, NOW, EXPIRY, SEEN) is None
    assert not claims.unclaimed_by_a_bind(the_pod)


def test_gpuslices_own_claim_carries_a_bind_phase() -> None:
    """gpuslice writes a claim only with its Binding, phase included: never judged as another's."""
    alloc = allocations.PodAllocation(node="n1", containers=((allocations.DeviceGrant("GPU-a", 1000, 0),),))
    ann = pod_devices.bind_annotations(alloc, NOW - 3600)
    unbound = objects.Pod(
        metadata=objects.ObjectMeta(name="p", namespace="ns", annotations=ann), spec=objects.PodSpec()
    )
    assert keys.BIND_PHASE in ann
    assert claims.judge(unbound, None, NOW, EXPIRY, NOW - 3600) is None


def test_the_expiry_and_the_age_in_the_verdict() -> None:
    claim = claims.judge(pod(NOW - 100), None, NOW, EXPIRY, SEEN)
    assert claim is not None
    # written at NOW - 100, which may stand for any instant of that second: counted from NOW - 99
    assert (claim.written, claim.since, claim.stale_at, claim.age_s) == (
        int(NOW - 100),
        NOW - 99,
        NOW - 99 + EXPIRY,
        99,
    )


def test_the_notes_say_why_and_for_how_long() -> None:
    young = claims.judge(pod(NOW - 100), None, NOW, EXPIRY, SEEN)
    assert young is not None
    note = claims.waiting_note("ns/p", young, NOW)
    assert "another scheduler's claim on node n1" in note
    assert f"hami.io/vgpu-time {int(NOW - 100)}" in note and "99s old" in note
    assert "in 201s" in note  # 300 - 99
    locked = claims.judge(pod(NOW - 3600), lock(10), NOW, EXPIRY, SEEN)
    assert locked is not None and "node lock on n1" in claims.waiting_note("ns/p", locked, NOW)
    stale = claims.judge(pod(NOW - 3600), None, NOW, EXPIRY, SEEN)
    assert stale is not None
    replaced = claims.replaced_note(stale, "n2")
    assert "stale claim on node n1" in replaced and "bound to n2" in replaced and "3599s old" in replaced


@pytest.mark.parametrize(
    ("expiry", "charged"),
    [(None, True), (EXPIRY, False)],
    ids=["without-expiry-every-claim-charged", "with-expiry-stale-claim-dropped"],
)
def test_sync_charges_a_stale_claim_only_without_an_expiry(expiry: float | None, charged: bool) -> None:
    """``gpuslice explain`` and the extender pass the expiry; a ``Sync`` without one charges every claim."""
    cache = cluster_cache.ClusterCache(nominator=nominations.Nominator())
    kube: Any = object()  # informers are built but never run here
    s = sync.Sync(kube, cache, claim_expiry_s=expiry, clock=lambda: NOW)
    card = devices.GpuDevice(uuid="GPU-a", index=0, type="NVIDIA A100", memory_mib=40960)
    node = objects.Node(
        metadata=objects.ObjectMeta(
            name="n1", annotations={keys.NODE_REGISTER: registrations.encode_json([card])}
        )
    )
    s.nodes.store["n1"] = node
    s.on_node(informer.Event(informer.EventType.ADDED, node))
    s.on_pod(informer.Event(informer.EventType.ADDED, pod(NOW - 3600)))
    assert (cache.pod_state("ns/p") is not None) is charged
    assert [u.memory_mib for u in cache.snapshot().nodes["n1"].usage] == [1000 if charged else 0]
