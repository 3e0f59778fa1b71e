"""The recovery loop's decisions, node liveness and leader following, as tables (no cluster)."""

from __future__ import annotations

import datetime as dt

import pytest

from gpuslice.codec import handshake, keys
from gpuslice.codec import locks as lockcodec
from gpuslice.extender import recovery
from gpuslice.extender.binding import leader, liveness
from gpuslice.kube import lease, objects
from gpuslice.model import status

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0
LIMITS = recovery.Limits(orphan_grace_s=6.0, allocate_timeout_s=60.0, expiry_s=300.0)


def lock(age_s: float, owner: bool = True) -> lockcodec.NodeLock:
    taken = dt.datetime.fromtimestamp(int(NOW - age_s), dt.UTC)
    if not owner:
        return lockcodec.NodeLock(taken=taken)
    return lockcodec.NodeLock(taken=taken, namespace="ns", name="p")


def pod(
    node_name: str = "",
    phase: str | None = keys.BIND_PHASE_ALLOCATING,
    claim: str | None = "n1",
    pod_phase: str = "Pending",
    deleting: bool = False,
    bind_time: float | None = None,
) -> objects.Pod:
    ann = {}
    if claim is not None:
        ann[keys.VGPU_NODE] = claim
        ann[keys.DEVICES_ALLOCATED] = "GPU-a,NVIDIA,1000,10:;"
    if phase is not None:
        ann[keys.BIND_PHASE] = phase
    if bind_time is not None:
        ann[keys.BIND_TIME] = str(int(bind_time))
    meta = objects.ObjectMeta(
        name="p",
        namespace="ns",
        uid="u1",
        annotations=ann,
        deletion_timestamp="2026-01-01T00:00:00Z" if deleting else None,
    )
    return objects.Pod(
        metadata=meta, spec=objects.PodSpec(node_name=node_name), status=objects.PodStatus(phase=pod_phase)
    )


A = recovery.Action


@pytest.mark.parametrize(
    ("case", "the_lock", "owner", "live", "expected"),
    [
        # A young lock of an unbound pod: a bind may still be running (another replica's).
        ("young orphan", lock(3), pod(), False, A.KEEP),
        # Older than the grace (6 s; +1 s for the whole-second timestamp): nothing binds it.
        ("old orphan", lock(8), pod(), False, A.CLEAR_ORPHAN),
        ("exactly grace+resolution", lock(7), pod(), False, A.KEEP),
        # A live bind of this process is never touched, however old.
        ("live", lock(100), pod(), True, A.KEEP),
        # Owner gone, being deleted, or finished: dangling, released at once.
        ("owner gone", lock(1), None, False, A.RELEASE_DANGLING),
        ("owner deleting", lock(1), pod(deleting=True), False, A.RELEASE_DANGLING),
        ("owner succeeded", lock(1), pod(node_name="n1", pod_phase="Succeeded"), False, A.RELEASE_DANGLING),
        ("owner failed", lock(1), pod(node_name="n1", pod_phase="Failed"), False, A.RELEASE_DANGLING),
        # Owner bound to another node: the lock on n1 serves nobody.
        ("bound elsewhere", lock(1), pod(node_name="n2"), False, A.RELEASE_ELSEWHERE),
        # Owner bound here, device plugin still allocating: kept until the allocate timeout.
        ("allocating", lock(30), pod(node_name="n1"), False, A.KEEP),
        ("allocate timeout", lock(62), pod(node_name="n1"), False, A.RELEASE_ALLOCATE_TIMEOUT),
        # The plugin answered but left the lock.
        ("answered", lock(8), pod(node_name="n1", phase=keys.BIND_PHASE_SUCCESS), False, A.RELEASE_ANSWERED),
        ("answered young", lock(2), pod(node_name="n1", phase=keys.BIND_PHASE_SUCCESS), False, A.KEEP),
        # A legacy lock names nobody: only the expiry releases it.
        ("legacy young", lock(100, owner=False), None, False, A.KEEP),
        ("legacy expired", lock(302, owner=False), None, False, A.RELEASE_EXPIRED),
        # A lock naming an unbound pod that carries no annotations (lost lock write): orphan too.
        ("lock without claim", lock(8), pod(claim=None, phase=None), False, A.CLEAR_ORPHAN),
    ],
)
def test_judge_lock(
    case: str,
    the_lock: lockcodec.NodeLock,
    owner: objects.Pod | None,
    live: bool,
    expected: recovery.Action,
) -> None:
    assert recovery.judge_lock("n1", the_lock, owner, live, NOW, LIMITS) is expected, case


@pytest.mark.parametrize(
    ("case", "the_pod", "live", "named", "expected"),
    [
        ("old allocating claim", pod(bind_time=NOW - 10), False, False, True),
        ("young claim", pod(bind_time=NOW - 3), False, False, False),
        ("live", pod(bind_time=NOW - 100), True, False, False),
        ("a lock names it", pod(bind_time=NOW - 100), False, True, False),
        ("bound", pod(node_name="n1", bind_time=NOW - 100), False, False, False),
        # HAMi's own filter writes the claim without a phase: not ours to clear.
        ("no phase", pod(phase=None, bind_time=NOW - 100), False, False, False),
        ("answered", pod(phase=keys.BIND_PHASE_SUCCESS, bind_time=NOW - 100), False, False, False),
        ("no time", pod(), False, False, True),
        ("terminated", pod(pod_phase="Failed", bind_time=NOW - 100), False, False, False),
    ],
)
def test_orphan_claim(case: str, the_pod: objects.Pod, live: bool, named: bool, expected: bool) -> None:
    assert recovery.orphan_claim(the_pod, live, named, NOW, 6.0) is expected, case


def node(
    name: str = "n1", allocatable: str | None = "80", shake: str | None = None, lock_value: str | None = None
) -> objects.Node:
    ann = {keys.NODE_REGISTER: "[]"}
    if shake is not None:
        ann[keys.NODE_HANDSHAKE] = shake
    if lock_value is not None:
        ann[keys.NODE_LOCK] = lock_value
    alloc = {} if allocatable is None else {"nvidia.com/gpu": allocatable}
    return objects.Node(
        metadata=objects.ObjectMeta(name=name, annotations=ann), status=objects.NodeStatus(allocatable=alloc)
    )


def test_advertised_node_is_live_and_a_drop_to_zero_is_stale_at_once() -> None:
    h = liveness.NodeHealth(handshake_timeout_s=60, stuck_lock_s=5)
    h.observe(node(allocatable="80"), False, NOW, 0.0)
    assert h.excluded == {}
    h.observe(node(allocatable="0"), False, NOW + 1, 1.0)
    assert h.excluded == {"n1": status.NODE_HANDSHAKE_STALE}
    # It stays stale as time passes, and comes back when kubelet advertises cards again.
    h.tick(NOW + 100, 100.0)
    assert h.excluded == {"n1": status.NODE_HANDSHAKE_STALE}
    h.observe(node(allocatable="80"), False, NOW + 101, 101.0)
    assert h.excluded == {}


def test_without_allocatable_the_handshake_decides() -> None:
    h = liveness.NodeHealth(handshake_timeout_s=60, stuck_lock_s=5)
    # No handshake yet: the leader is asked to write one; the node is live meanwhile.
    h.observe(node(allocatable=None), False, NOW, 0.0)
    assert h.excluded == {} and h.needs_handshake() == ["n1"]
    requested = handshake.requesting_value(NOW)
    h.observe(node(allocatable=None, shake=requested), False, NOW, 0.0)
    assert h.needs_handshake() == []
    h.tick(NOW + 59, 59.0)
    assert h.excluded == {}
    h.tick(NOW + 61, 61.0)  # nobody answered within 60 s
    assert h.excluded == {"n1": status.NODE_HANDSHAKE_STALE}
    # A live plugin overwrites it with "Reported ...": live again, and a new request is due.
    h.observe(node(allocatable=None, shake="Reported 2027-01-15 08:00:00 +0000 UTC"), False, NOW + 62, 62.0)
    assert h.excluded == {} and h.needs_handshake() == ["n1"]


def test_a_lock_held_too_long_excludes_the_node_until_released() -> None:
    h = liveness.NodeHealth(handshake_timeout_s=60, stuck_lock_s=5)
    value = lockcodec.encode(NOW, "ns", "p")
    h.observe(node(lock_value=value), False, NOW, 10.0)
    h.tick(NOW + 4, 14.0)
    assert h.excluded == {}
    h.tick(NOW + 6, 16.0)
    assert h.excluded == {"n1": status.NODE_LOCK_HELD}
    assert h.counts()[status.NODE_LOCK_HELD] == 1
    # Another owner restarts the clock; a release clears it.
    h.observe(node(lock_value=lockcodec.encode(NOW + 6, "ns", "q")), False, NOW + 6, 16.0)
    assert h.excluded == {}
    h.observe(node(), False, NOW + 7, 17.0)
    h.tick(NOW + 30, 40.0)
    assert h.excluded == {}


def test_deleted_or_unregistered_nodes_are_forgotten() -> None:
    h = liveness.NodeHealth(handshake_timeout_s=60, stuck_lock_s=5)
    h.observe(node(allocatable="80"), False, NOW, 0.0)
    h.observe(node(allocatable="0"), False, NOW, 0.0)
    assert "n1" in h.excluded
    h.observe(node(allocatable="0"), True, NOW, 0.0)
    assert h.excluded == {} and h.needs_handshake() == []


def spec(holder: str | None, renewed_ago: float, duration: int = 15) -> lease.LeaseSpec:
    return lease.LeaseSpec(
        holder_identity=holder,
        lease_duration_seconds=duration,
        renew_time=lease.micro_time(NOW - renewed_ago),
    )


@pytest.mark.parametrize(
    ("holder", "renewed_ago", "expected"),
    [
        ("host-a_3f2c", 1.0, True),  # kube-scheduler's identity is <hostname>_<uuid>
        ("host-a_3f2c", 16.0, False),  # expired
        ("host-b_9911", 1.0, False),
        (None, 1.0, False),
    ],
)
def test_sidecar_follows_the_schedulers_lease(holder: str | None, renewed_ago: float, expected: bool) -> None:
    assert leader.follows(spec(holder, renewed_ago), "host-a", NOW) is expected


def test_a_stalled_allocate_excludes_the_node_until_the_plugin_answers_or_it_cools_off() -> None:
    h = liveness.NodeHealth(handshake_timeout_s=60, stuck_lock_s=5, stall_cooloff_s=30)
    h.observe(node(allocatable="80"), False, NOW, 0.0)
    h.allocate_stalled("n1", NOW, 0.0)
    assert h.excluded == {"n1": status.NODE_ALLOCATE_STALLED}
    # An old pod's answered phase proves nothing; a pod bound after the stall does.
    h.allocate_answered("n1", NOW - 100, NOW + 1, 1.0)
    assert h.excluded == {"n1": status.NODE_ALLOCATE_STALLED}
    h.allocate_answered("n1", NOW + 2, NOW + 3, 3.0)
    assert h.excluded == {}
    # Without an answer the node gets a probe pod again after the cool-off.
    h.allocate_stalled("n1", NOW + 10, 10.0)
    h.tick(NOW + 39, 39.0)
    assert h.excluded == {"n1": status.NODE_ALLOCATE_STALLED}
    h.tick(NOW + 41, 41.0)
    assert h.excluded == {}


def test_a_renamed_count_resource_is_what_liveness_reads() -> None:
    def gpu_node(count: str) -> objects.Node:
        meta = objects.ObjectMeta(name="n1", annotations={keys.NODE_REGISTER: "[]"})
        return objects.Node(metadata=meta, status=objects.NodeStatus(allocatable={"example.com/vgpu": count}))

    h = liveness.NodeHealth(handshake_timeout_s=60, stuck_lock_s=5, gpu_resource="example.com/vgpu")
    h.observe(gpu_node("8"), False, NOW, 0.0)
    assert h.excluded == {}
    h.observe(gpu_node("0"), False, NOW + 1, 1.0)
    assert h.excluded == {"n1": status.NODE_HANDSHAKE_STALE}
    # the default name is not consulted once renamed
    assert liveness.allocatable_gpus(gpu_node("8")) == 0
    assert liveness.allocatable_gpus(gpu_node("8"), "example.com/vgpu") == 8
