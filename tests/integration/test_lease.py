"""Lease election against a real kube-apiserver: one leader, CAS, hand-over on release and expiry."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpuslice.kube import client as kclient
from gpuslice.kube import errors, lease

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_one_leader_then_handover(kube: kclient.KubeClient, namespace: str) -> None:
    now = [1_800_000_000.0]
    a = lease.Elector(kube, namespace, "gpuslice", "a", clock=lambda: now[0])
    b = lease.Elector(kube, namespace, "gpuslice", "b", clock=lambda: now[0])

    assert await a.try_acquire_or_renew() is True  # created
    assert await b.try_acquire_or_renew() is False  # a's lease is live
    now[0] += 5
    assert await a.try_acquire_or_renew() is True  # renewed (CAS on resourceVersion)
    got = await a.read()
    assert got is not None and got.spec.holder_identity == "a" and got.spec.lease_transitions == 0

    now[0] += 16  # a stopped renewing: 16 s > 15 s lease
    assert await b.try_acquire_or_renew() is True
    got = await b.read()
    assert got is not None and (got.spec.holder_identity, got.spec.lease_transitions) == ("b", 1)

    b.leading = True
    assert await b.release() is True and b.leading is False
    assert await a.try_acquire_or_renew() is True  # released: no need to wait for expiry


async def test_stale_write_loses(kube: kclient.KubeClient, namespace: str) -> None:
    a = lease.Elector(kube, namespace, "race", "a")
    assert await a.try_acquire_or_renew() is True
    current = await a.read()
    assert current is not None
    # Someone renews between our read and our write: our CAS with the old resourceVersion fails.
    assert await a.try_acquire_or_renew() is True
    body = a._body(lease.next_spec(current.spec, "b", 2_000_000_000.0, 15), current.metadata.resource_version)
    with pytest.raises(errors.Conflict):
        await kube.request("PUT", a.path, body=body)


async def test_own_lease_mode_one_replica_leads_and_the_other_takes_over(
    kube: kclient.KubeClient, namespace: str
) -> None:
    import asyncio

    from gpuslice.extender.binding import leader

    def elector(identity: str) -> lease.Elector:
        return lease.Elector(
            kube,
            namespace,
            "gpuslice-ha",
            identity,
            lease_duration_s=2,
            renew_deadline_s=1.5,
            retry_period_s=0.2,
        )

    a, b = leader.OwnLease(elector("a")), leader.OwnLease(elector("b"))
    changes: list[tuple[str, bool]] = []
    a.on_change.add(lambda leading: changes.append(("a", leading)))
    b.on_change.add(lambda leading: changes.append(("b", leading)))

    async def until(pred: Callable[[], bool]) -> bool:
        for _ in range(50):
            if pred():
                return True
            await asyncio.sleep(0.1)
        return False

    async with b.running():
        async with a.running():
            assert await until(lambda: a.is_leading() or b.is_leading())
            first, second = (a, b) if a.is_leading() else (b, a)
            await asyncio.sleep(1.0)
            assert a.is_leading() != b.is_leading()  # exactly one leads
        # a shut down cleanly: it gave the Lease up (if it held it), so b leads without waiting.
        assert await until(b.is_leading)
        assert not a.is_leading()
    assert first is not second
    assert ("b", True) in changes


async def test_sidecar_mode_follows_the_schedulers_lease(kube: kclient.KubeClient, namespace: str) -> None:
    from gpuslice.extender.binding import leader

    scheduler = lease.Elector(kube, namespace, "kube-scheduler", "host-a_5f1e2d")
    assert await scheduler.try_acquire_or_renew() is True
    mine = leader.SchedulerLease(kube, namespace, "kube-scheduler", "host-a", period_s=0.2)
    other = leader.SchedulerLease(kube, namespace, "kube-scheduler", "host-b", period_s=0.2)
    assert await mine.check() is True
    assert await other.check() is False
    assert await scheduler.release() is True  # holder emptied: nobody leads
    assert await mine.check() is False
