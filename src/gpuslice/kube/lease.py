"""Leader election on a ``coordination.k8s.io/v1`` Lease (control-plane.md section 6).

One replica holds the Lease and does the mutating work; the others wait. The protocol:

- read the Lease; create it if absent (a 409 means another replica created it first);
- held by another identity whose ``renewTime + leaseDurationSeconds`` is still in the future:
  not ours, try again after ``retry_period_s``;
- otherwise replace it with ``resourceVersion`` (compare-and-swap), bumping ``leaseTransitions``
  when the holder changes;
- the leader renews every ``retry_period_s``; when no renewal succeeded within
  ``renew_deadline_s`` it steps down (``leading`` turns False and ``on_stop`` runs) and goes back
  to acquiring. On a clean shutdown ``release`` empties the holder so a successor need not wait.

kube-scheduler's defaults: lease 15 s, renew deadline 10 s, retry period 2 s. Clocks are
injected: ``clock`` is wall time (Lease timestamps are wall time), ``monotonic`` measures the
renew deadline.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from gpuslice.kube import client as kclient
from gpuslice.kube import errors

log = logging.getLogger(__name__)

LEASE_DURATION_S = 15.0
RENEW_DEADLINE_S = 10.0
RETRY_PERIOD_S = 2.0


class LeaseSpec(msgspec.Struct, rename="camel", frozen=True):
    """The Lease spec fields."""

    holder_identity: str | None = None
    lease_duration_seconds: int | None = None
    acquire_time: str | None = None
    renew_time: str | None = None
    lease_transitions: int | None = None


class _Meta(msgspec.Struct, rename="camel", frozen=True):
    name: str = ""
    namespace: str = ""
    resource_version: str = ""


class Lease(msgspec.Struct, frozen=True):
    """A Lease object."""

    metadata: _Meta = _Meta()
    spec: LeaseSpec = LeaseSpec()


_LEASE = msgspec.json.Decoder(Lease)


def micro_time(now: float) -> str:
    """Unix seconds as a MicroTime string."""
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> float:
    """A MicroTime / RFC 3339 string as unix seconds."""
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def held_by_other(spec: LeaseSpec, identity: str, now: float) -> bool:
    """True when another identity holds an unexpired Lease at wall time ``now``."""
    if not spec.holder_identity or spec.holder_identity == identity:
        return False
    if spec.renew_time is None or spec.lease_duration_seconds is None:
        return False
    return parse_time(spec.renew_time) + spec.lease_duration_seconds > now


def next_spec(current: LeaseSpec | None, identity: str, now: float, duration_s: float) -> LeaseSpec:
    """The spec this identity writes to take or renew the Lease."""
    stamp = micro_time(now)
    if current is not None and current.holder_identity == identity:
        return msgspec.structs.replace(current, renew_time=stamp, lease_duration_seconds=int(duration_s))
    # A new holder (also after a release) counts as a transition, as client-go counts it.
    transitions = 0 if current is None else (current.lease_transitions or 0) + 1
    return LeaseSpec(
        holder_identity=identity,
        lease_duration_seconds=int(duration_s),
        acquire_time=stamp,
        renew_time=stamp,
        lease_transitions=transitions,
    )


class Elector:
    """Campaigns for and keeps one Lease.

    Args:
        kube: the API client.
        namespace: the Lease's namespace.
        name: the Lease's name.
        identity: this replica's identity (e.g. pod name + a random suffix).
        lease_duration_s: how long a non-renewed Lease blocks other candidates.
        renew_deadline_s: how long the leader keeps trying to renew before stepping down.
        retry_period_s: pause between attempts (and between renewals).
        on_start: called when this replica becomes leader.
        on_stop: called when it stops leading.
        clock: wall clock, unix seconds.
        monotonic: monotonic clock.
        sleep: async sleep.
    """

    def __init__(
        self,
        kube: kclient.KubeClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration_s: float = LEASE_DURATION_S,
        renew_deadline_s: float = RENEW_DEADLINE_S,
        retry_period_s: float = RETRY_PERIOD_S,
        on_start: Callable[[], None] | None = None,
        on_stop: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        if not lease_duration_s > renew_deadline_s > retry_period_s > 0:
            raise ValueError("need lease_duration_s > renew_deadline_s > retry_period_s > 0")
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.on_start = on_start
        self.on_stop = on_stop
        self._clock = clock
        self._monotonic = monotonic
        self._sleep = sleep
        self.leading = False
        self.transitions_seen = 0

    @property
    def path(self) -> str:
        """The Lease's API path."""
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    def _body(self, spec: LeaseSpec, resource_version: str = "") -> dict[str, Any]:
        meta: dict[str, str] = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": msgspec.to_builtins(spec),
        }

    async def read(self) -> Lease | None:
        """The Lease, or None when it does not exist."""
        try:
            return _LEASE.decode((await self.kube.request("GET", self.path)).content)
        except errors.NotFound:
            return None

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this identity holds the Lease afterwards."""
        now = self._clock()
        try:
            lease = await self.read()
            if lease is None:
                spec = next_spec(None, self.identity, now, self.lease_duration_s)
                collection = self.path.rsplit("/", 1)[0]
                await self.kube.request("POST", collection, body=self._body(spec))
                return True
            if held_by_other(lease.spec, self.identity, now):
                return False
            spec = next_spec(lease.spec, self.identity, now, self.lease_duration_s)
            await self.kube.request("PUT", self.path, body=self._body(spec, lease.metadata.resource_version))
            self.transitions_seen = spec.lease_transitions or 0
            return True
        except errors.Conflict:
            return False  # someone else wrote first; re-read next time
        except errors.ApiError as exc:
            log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            return False

    def _set_leading(self, leading: bool) -> None:
        if leading == self.leading:
            return
        self.leading = leading
        log.info(
            "lease %s/%s: %s %s",
            self.namespace,
            self.name,
            self.identity,
            "leads" if leading else "stepped down",
        )
        callback = self.on_start if leading else self.on_stop
        if callback is not None:
            callback()

    async def run(self) -> None:
        """Campaign, lead, renew, step down when renewal fails; until cancelled."""
        try:
            while True:
                while not await self.try_acquire_or_renew():
                    await self._sleep(self.retry_period_s)
                self._set_leading(True)
                renewed = self._monotonic()
                while self.leading:
                    await self._sleep(self.retry_period_s)
                    if await self.try_acquire_or_renew():
                        renewed = self._monotonic()
                    elif self._monotonic() - renewed > self.renew_deadline_s:
                        self._set_leading(False)
        finally:
            self._set_leading(False)

    async def release(self) -> bool:
        """Give the Lease up (holder emptied) if this identity holds it; True when released."""
        lease = await self.read()
        if lease is None or lease.spec.holder_identity != self.identity:
            return False
        spec = msgspec.structs.replace(
            lease.spec, holder_identity=None, lease_duration_seconds=1, renew_time=micro_time(self._clock())
        )
        try:
            await self.kube.request("PUT", self.path, body=self._body(spec, lease.metadata.resource_version))
        except errors.Conflict:
            return False
        self._set_leading(False)
        return True
