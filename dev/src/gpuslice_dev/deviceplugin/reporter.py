"""The plugin's Node annotations: ``hami.io/node-nvidia-register`` and ``hami.io/node-handshake``.

HAMi's plugin registers its cards at start and every 30 s (5 s after a failure; register.go
``WatchAndRegister``). Up to v2.7 it also wrote ``hami.io/node-handshake: Reported <Go
time.Now().String()>`` each round (v2.8 stopped); gpuslice writes both, in one merge patch, at
start, every ``period_s``, and at once when the inventory changes (a card's health).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from gpuslice.codec import keys
from gpuslice.kube import client as kclient
from gpuslice.kube import errors, locks
from gpuslice_dev import nodesim
from gpuslice_dev.deviceplugin import servicer

log = logging.getLogger(__name__)

PERIOD_S = 30.0
RETRY_S = 5.0


class Reporter:
    """Writes the Node annotations.

    Args:
        kube: the API client.
        node: the Node.
        cards: the inventory to register (and its changes).
        period_s: time between reports.
        retry_s: time before a failed report is retried.
        wall_ns: Unix time in nanoseconds (the handshake's wall clock).
        monotonic_ns: a monotonic clock in nanoseconds (the handshake's ``m=`` part).
    """

    def __init__(
        self,
        kube: kclient.KubeClient,
        node: str,
        cards: servicer.DeviceList,
        *,
        period_s: float = PERIOD_S,
        retry_s: float = RETRY_S,
        wall_ns: Callable[[], int] = time.time_ns,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.kube = kube
        self.node = node
        self.cards = cards
        self.period_s = period_s
        self.retry_s = retry_s
        self._wall_ns = wall_ns
        self._monotonic_ns = monotonic_ns
        self._started_ns = monotonic_ns()
        self.reports = 0
        """Successful reports."""

    def annotations(self) -> dict[str, str]:
        """The values to write now."""
        return {
            keys.NODE_REGISTER: self.cards.current.registration(),
            keys.NODE_HANDSHAKE: nodesim.reported_value(
                self._wall_ns(), self._monotonic_ns() - self._started_ns
            ),
        }

    async def report(self) -> None:
        """One merge patch of both annotations.

        Raises:
            errors.ApiError: the patch failed.
        """
        await self.kube.request(
            "PATCH",
            locks.node_path(self.node),
            body={"metadata": {"annotations": self.annotations()}},
            content_type=kclient.MERGE_PATCH,
        )
        self.reports += 1

    async def run(self, stop: asyncio.Event) -> None:
        """Report now, then every period or on a change, until ``stop`` is set."""
        while not stop.is_set():
            version = self.cards.version
            delay = self.period_s
            try:
                await self.report()
            except errors.ApiError as exc:
                log.warning(
                    "registering cards on node %s failed: %s; retrying in %gs", self.node, exc, self.retry_s
                )
                delay = self.retry_s
            waiters = {
                asyncio.ensure_future(stop.wait()),
                asyncio.ensure_future(self.cards.wait_newer(version)),
            }
            try:
                await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await waiter
