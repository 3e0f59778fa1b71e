"""Taking HAMi's node lock for a bind, waiting briefly while another pod's Allocate holds it.

HAMi fails the bind at once on contention, which sends the pod into kube-scheduler's backoff;
waiting keeps binds to one node flowing. While the node watch says the lock is held, a waiter
sleeps until the watch sees it released (``changed``), polling the API at most every 0.5 s, so
waiting binds do not eat the client's request budget.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from gpuslice.extender import metrics
from gpuslice.extender.binding import binder as binders

CONTENTION = binders.CONTENTION
POLL_S = 0.5


class LockWaiter:
    """Node lock acquisition with a bounded wait.

    Args:
        binder: the API calls.
        clock: wall clock.
        metrics_: counts the waits.
        wait_s: the longest a bind waits for the lock.
    """

    def __init__(
        self, binder: binders.Binder, clock: Callable[[], float], metrics_: metrics.Metrics, wait_s: float
    ) -> None:
        self._binder = binder
        self._clock = clock
        self._metrics = metrics_
        self.wait_s = wait_s
        self._freed: dict[str, asyncio.Event] = {}
        self._held: dict[str, bool] = {}

    async def acquire(self, node: str, namespace: str, name: str) -> str:
        """Take the lock for the pod; the node's resourceVersion after the lock write.

        Raises:
            binders.BindFailure: it could not be taken within ``wait_s``.
        """
        deadline = self._clock() + self.wait_s
        while True:
            freed = self._freed.setdefault(node, asyncio.Event())
            freed.clear()
            left = deadline - self._clock()
            if self._held.get(node) and left > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(freed.wait(), min(left, POLL_S))
            try:
                version = await self._binder.lock_node(node, namespace, name)
                self._held[node] = True
                return version
            except binders.BindFailure as err:
                if err.reason != CONTENTION or deadline - self._clock() <= 0:
                    raise
                self._metrics.lock_waits.inc()
                self._held[node] = True

    def changed(self, node: str, held: bool) -> None:
        """The node watch saw the lock annotation set (held) or removed; wake waiters."""
        self._held[node] = held
        if not held and (event := self._freed.get(node)) is not None:
            event.set()
