"""The leader's pod label: how a Service in front of ``lease`` replicas reaches the leader only.

In ``lease`` mode with its pod known, every synced replica reports ready, so a rolling update
with ``maxSurge: 1, maxUnavailable: 0`` can finish and a PodDisruptionBudget lets nodes drain; the
Service selects the leader by a label on its pod, ``gpuslice.io/leader: "true"`` (``LEADER_LABEL``), as
HAMi's chart routes to its scheduler's leader by the label ``hami.io/scheduler-role``
(Project-HAMi/HAMi). ``PodLabel`` keeps that label equal to "this replica leads":

* ``want(leading)`` records the wish and wakes the writer; it never waits, so stepping down is
  never held up by the apiserver;
* the writer (``running``) merge-patches the pod, setting the label or removing it, until the pod
  shows the latest wish; a failed write is logged and retried, ``retry_s`` doubling up to
  ``MAX_BACKOFF_S``;
* the first wish is "not leading", so the restarted container of an old leader removes the label
  its predecessor left, unless it takes its Lease back first;
* ``drain()`` (on SIGTERM, before the listeners close) and the end of ``running`` remove the
  label, each waiting at most ``drain_s``.

A follower whose label could not be removed (apiserver unreachable) may still get calls: it
refuses binds and closes each connection after its answer (``extender.leader``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from gpuslice.extender import tasks
from gpuslice.kube import client as kclient
from gpuslice.kube import errors as kerrors
from gpuslice.kube import pods

log = logging.getLogger(__name__)

LEADER_LABEL = "gpuslice.io/leader"
"""The label the leader's pod carries in ``lease`` mode; a Service selects ``LEADER_LABEL: "true"``."""
LEADER_VALUE = "true"
MAX_BACKOFF_S = 30.0
"""Longest pause between two attempts of a failing label write."""
DRAIN_S = 3.0
"""How long a shutdown waits for the label's removal."""

Write = Callable[[bool], Awaitable[None]]
"""Set (True) or remove (False) the label on this replica's pod."""


def pod_writer(kube: kclient.KubeClient, namespace: str, name: str, timeout_s: float = 5.0) -> Write:
    """The label write for pod ``namespace/name`` (a JSON merge patch; removal patches ``null``)."""

    async def write(leading: bool) -> None:
        value = LEADER_VALUE if leading else None
        await pods.patch_labels(kube, namespace, name, {LEADER_LABEL: value}, timeout=timeout_s)

    return write


class PodLabel:
    """Keeps ``LEADER_LABEL`` on this replica's pod while it leads (module docstring).

    Args:
        write: the label write (``pod_writer``).
        pod: ``namespace/name``, for the log.
        retry_s: first pause after a failed write (the lease retry period).
        drain_s: how long ``drain`` and the end of ``running`` wait for the removal.
    """

    def __init__(self, write: Write, pod: str, retry_s: float, drain_s: float = DRAIN_S) -> None:
        self._write = write
        self.pod = pod
        self.retry_s = retry_s
        self.drain_s = drain_s
        self._wanted = False
        self._shown: bool | None = None  # what the pod shows; unknown until the first write
        self._closed = False
        self._wake = asyncio.Event()

    @property
    def shown(self) -> bool | None:
        """Whether the pod carries the label, as far as our writes tell (None before the first)."""
        return self._shown

    def want(self, leading: bool) -> None:
        """Ask for the label (True) or its removal (False); returns at once."""
        self._wanted = leading and not self._closed
        self._wake.set()

    async def sync(self) -> bool:
        """One write if the pod does not show the wish yet; False when that write failed."""
        target = self._wanted
        if self._shown is target:
            return True
        try:
            await self._write(target)
        except kerrors.ApiError as err:
            verb = "set" if target else "remove"
            log.warning("leader label: cannot %s %s on pod %s: %s", verb, LEADER_LABEL, self.pod, err)
            return False
        self._shown = target
        log.info("leader label: %s %s on pod %s", "set" if target else "removed", LEADER_LABEL, self.pod)
        return True

    async def run(self) -> None:
        """Write until the pod shows the wish, wait for the next one; until cancelled."""
        delay = self.retry_s
        while True:
            self._wake.clear()
            if await self.sync():
                delay = self.retry_s
                if self._shown is self._wanted:
                    await self._wake.wait()
                continue
            with contextlib.suppress(TimeoutError):  # a new wish retries at once
                await asyncio.wait_for(self._wake.wait(), delay)
            delay = min(delay * 2, MAX_BACKOFF_S)

    def _removed(self) -> bool:
        return self._shown is False

    async def drain(self) -> None:
        """Remove the label for good, waiting at most ``drain_s`` (for shutdown; never raises)."""
        self._closed = True
        self.want(False)
        deadline = time.monotonic() + self.drain_s
        while not self._removed() and time.monotonic() < deadline:
            try:
                written = await asyncio.wait_for(self.sync(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
            if not written:
                await asyncio.sleep(min(self.retry_s, max(0.0, deadline - time.monotonic())))
        if not self._removed():
            log.warning(
                "leader label: could not remove %s from pod %s before exiting", LEADER_LABEL, self.pod
            )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[PodLabel]:
        """Run the writer until the context exits, then remove the label (``drain``)."""
        async with tasks.background(self.run(), "leader-label"):
            yield self
        await self.drain()
