"""Lease election against a real kube-apiserver: one leader, CAS, hand-over on release and expiry."""

from __future__ import annotations

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
