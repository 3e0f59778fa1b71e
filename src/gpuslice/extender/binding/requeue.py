"""Requeue nudges: make kube-scheduler retry pods waiting for GPU capacity once it is back.

kube-scheduler retries pods an extender rejected on any cluster event, but the event that frees
capacity (a pod's deletion) may reach it before it reaches our cache, leaving the pod pending
until the next unrelated event. When a pod holding GPUs goes away while pods wait, the ``Nudger``
touches an annotation of that node once our cache has the capacity back: a node update is such an
event. HAMi has no requeue signal at all (docs/hami-compat.md section 15).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from gpuslice.extender import metrics
from gpuslice.extender.binding import binder as binders
from gpuslice.framework import logs, memo

CAPACITY_FREED = "gpuslice.io/capacity-freed"
"""The node annotation touched (value: unix time)."""
PENDING_WINDOW_S = 600.0
"""Pods rejected longer ago than this no longer count as waiting."""
PERIOD_S = 1.0
"""At most one touch per node and period."""
WAITING_MEMO = (20_000, 4 << 20)
"""Entries and bytes of the pods remembered as waiting (``memo.Memo``; UIDs and times)."""

Touch = Callable[[str, Mapping[str, str]], Awaitable[None]]


class Nudger:
    """Tracks pods our filter left without a node and touches nodes where capacity frees.

    Args:
        touch: merge-patches node annotations (``Binder.touch_node``).
        clock: wall clock.
        metrics_: counts touches and failures.
        log: logger.
    """

    def __init__(
        self, touch: Touch, clock: Callable[[], float], metrics_: metrics.Metrics, log: logs.Log
    ) -> None:
        self._touch_node = touch
        self._clock = clock
        self._metrics = metrics_
        self._log = log
        self._waiting = memo.Memo(*WAITING_MEMO)  # uid -> when our filter left it without a node
        self._last: dict[str, float] = {}
        self._pending: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def mark(self, uid: str, unschedulable: bool) -> None:
        """Record whether our filter left the pod without any node."""
        if not uid:
            return
        if unschedulable:
            self._waiting.put(uid, self._clock())
        else:
            self._waiting.pop(uid, None)

    def capacity_freed(self, node: str) -> None:
        """A pod holding GPUs on ``node`` went away; touch the node if pods wait (coalesced)."""
        if not self._waiting or node in self._pending:
            return
        now = self._clock()
        latest: float = next(reversed(self._waiting.values()))
        if now - latest > PENDING_WINDOW_S:
            return
        # A release inside the period is served at its end, not dropped.
        delay = max(0.0, self._last.get(node, -PERIOD_S) + PERIOD_S - now)
        self._pending.add(node)
        task = asyncio.ensure_future(self._touch(node, delay))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _touch(self, node: str, delay: float) -> None:
        try:
            if delay > 0:
                await asyncio.sleep(delay)
            now = self._clock()
            self._last[node] = now
            self._pending.discard(node)
            await self._touch_node(node, {CAPACITY_FREED: f"{now:.3f}"})
            self._metrics.requeue_nudges.inc()
        except binders.BindFailure as err:
            self._metrics.api_errors.labels("touch").inc()
            self._log.v(2, "cannot touch node", node=node, err=str(err))
        finally:
            self._pending.discard(node)
