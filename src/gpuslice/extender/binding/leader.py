"""Which replica binds: leader election in the two layouts gpuslice runs in.

* ``lease`` — gpuslice as its own Deployment behind a Service: the replicas campaign for a
  ``coordination.k8s.io/v1`` Lease of their own (``kube.lease.Elector``, kube-scheduler's
  defaults 15/10/2 s). Followers keep their caches warm. Told its pod (``--pod-name``,
  ``--pod-namespace``), a replica reports ready once synced, follower or not (``/readyz`` says
  ``ok (follower)``), so rolling updates and node drains proceed, and the leader labels its pod
  ``gpuslice.io/leader: "true"`` (``extender.leaderlabel``) for the Service to select; without
  it, followers report not-ready and the Service routes by readiness. A follower that is called
  anyway refuses binds and closes the connection after each answer.
  The leader stops binding once it could not renew within the renew deadline, which is shorter
  than the lease duration, so two replicas never lead at once (clocks within that margin).
* ``scheduler`` — gpuslice as a sidecar of each kube-scheduler replica (HAMi's layout): only the
  leading kube-scheduler calls its sidecar, so the sidecar follows kube-scheduler's own Lease and
  counts itself leader while the holder identity starts with ``leader_identity`` (the host name,
  which kube-scheduler's identity ``<hostname>_<uuid>`` starts with) and the Lease is unexpired.
  HAMi's scheduler does the same (``pkg/scheduler`` leader checks in Project-HAMi/HAMi). All
  sidecars report ready once synced (the scheduler container decides who gets calls).
* ``none`` — one replica that always leads.

Only the leader binds and runs the recovery loop; every replica answers filter and prioritize.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from gpuslice.extender import listeners, tasks
from gpuslice.kube import client as kclient
from gpuslice.kube import errors as kerrors
from gpuslice.kube import lease

log = logging.getLogger(__name__)


class Leadership:
    """Whether this replica leads now; ``running`` keeps it current.

    Subclasses set ``leading`` and call ``_changed`` on transitions, which ``on_change`` hears.
    """

    mode = "none"
    calls_go_to_leader = False
    """True where only the leader should get kube-scheduler's calls (``lease``): a follower then
    says so on ``/readyz`` and closes each connection after its answer."""

    def __init__(self) -> None:
        self.leading = True
        self.on_change: listeners.Listeners[[bool]] = listeners.Listeners()
        """Told (leading) on every transition."""

    def is_leading(self) -> bool:
        """True while this replica leads."""
        return self.leading

    def _changed(self, leading: bool) -> None:
        if leading == self.leading:
            return
        self.leading = leading
        log.info("leadership: %s", "leading" if leading else "following")
        self.on_change.emit(leading)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Leadership]:
        """Keep ``leading`` current until the context exits (always leading here)."""
        yield self


class OwnLease(Leadership):
    """gpuslice's own Lease (``lease`` mode).

    Args:
        elector: the Lease elector (its callbacks are set here).
    """

    mode = "lease"
    calls_go_to_leader = True

    def __init__(self, elector: lease.Elector) -> None:
        super().__init__()
        self.leading = False
        self.elector = elector
        elector.on_start = lambda: self._changed(True)
        elector.on_stop = lambda: self._changed(False)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Leadership]:
        """Campaign until the context exits; give the Lease up on a clean shutdown."""
        try:
            async with tasks.background(self.elector.run(), "lease-elector"):
                yield self
        finally:
            with contextlib.suppress(kerrors.ApiError):
                await self.elector.release()


def follows(spec: lease.LeaseSpec, identity: str, now: float) -> bool:
    """True when kube-scheduler's Lease is held, unexpired, by an identity starting with ours."""
    holder = spec.holder_identity or ""
    if not holder or not holder.startswith(identity) or spec.renew_time is None:
        return False
    duration = spec.lease_duration_seconds or 0
    return lease.parse_time(spec.renew_time) + duration > now


class SchedulerLease(Leadership):
    """Follow kube-scheduler's Lease (``scheduler`` mode).

    Args:
        kube: the API client.
        namespace: the Lease's namespace (kube-scheduler's ``--leader-elect-resource-namespace``).
        name: the Lease's name (``--leader-elect-resource-name``).
        identity: the prefix of our scheduler's holder identity (the host name).
        period_s: how often the Lease is read.
        clock: wall clock (Lease times are wall time).
    """

    mode = "scheduler"

    def __init__(
        self,
        kube: kclient.KubeClient,
        namespace: str,
        name: str,
        identity: str,
        period_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.leading = False
        self._reader = lease.Elector(kube, namespace, name, identity)
        self.identity = identity
        self.period_s = period_s
        self.clock = clock

    async def check(self) -> bool:
        """Read the Lease once and update ``leading`` (unreadable: not leading)."""
        try:
            current = await self._reader.read()
        except kerrors.ApiError as err:
            log.warning("leadership: cannot read kube-scheduler's lease: %s", err)
            current = None
        self._changed(current is not None and follows(current.spec, self.identity, self.clock()))
        return self.leading

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Leadership]:
        """Poll kube-scheduler's Lease every ``period_s`` until the context exits."""

        async def poll() -> None:
            while True:
                await self.check()
                await asyncio.sleep(self.period_s)

        async with tasks.background(poll(), "scheduler-lease"):
            yield self
