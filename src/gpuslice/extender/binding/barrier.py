"""The gang barrier: a gang member's bind waits until its plan's quorum is at bind (docs/gangs.md).

kube-scheduler runs each pod's binding cycle in a goroutine of its own, so a bind call held here
does not stop it scheduling other pods. A member's bind that arrives before its plan's quorum
waits, at most ``wait_s`` (kept below kube-scheduler's ``httpTimeout`` with room for the commit,
``BindFlow``). The member whose arrival makes the quorum opens the barrier and every waiting bind
goes on to commit at once. A bind that waits too long fails (kube-scheduler retries it), but the
member stays counted as arrived and the plan keeps its cards: members that kube-scheduler brings
back at different times (a long queue, backoffs) still add up to the quorum, and those not at
bind when it opens commit as soon as they are retried. A plan whose members stop coming is
released when it expires (``Gangs.expire``). So no member is bound before the quorum has arrived.

The plan itself (``framework.gangs.Gangs``) is pure; this module only adds the waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gpuslice.framework import gangs as gang_plans
from gpuslice.model import requests


class Barrier:
    """Holds gang members' binds until their plan opens (module docstring).

    Args:
        gangs: the plans.
        clock: wall-clock seconds (the plans' deadlines).
        monotonic: for the waits.
        wait_s: the longest a bind waits at the barrier.
    """

    def __init__(
        self,
        gangs: gang_plans.Gangs,
        clock: Callable[[], float],
        monotonic: Callable[[], float],
        wait_s: float,
    ) -> None:
        if wait_s <= 0:
            raise ValueError(f"gang barrier wait must be positive, got {wait_s}")
        self.gangs = gangs
        self.clock = clock
        self.monotonic = monotonic
        self.wait_s = wait_s
        self._events: dict[str, asyncio.Event] = {}  # gang key -> set when its plan opens or goes
        self.waiting: dict[str, set[str]] = {}
        """Gang key -> members whose bind waits here now (explain, the cluster view)."""

    def wake(self, gang: str) -> None:
        """The gang's plan opened or went: every waiting bind looks again."""
        event = self._events.pop(gang, None)
        if event is not None:
            event.set()

    async def pass_(self, pod: requests.PodRequest, node: str, deadline: float) -> str:
        """Wait until the member's plan opens; '' then, else why its bind must fail.

        ``deadline`` (monotonic) bounds the wait besides ``wait_s``.
        """
        ref = pod.gang
        if ref is None:
            return ""
        arrival = self.gangs.arrive(pod, node, self.clock())
        if arrival.error:
            return arrival.error
        if arrival.open:
            self.wake(ref.key)
            return ""
        key = f"{pod.namespace}/{pod.name}"
        until = min(deadline, self.monotonic() + self.wait_s)
        waiting = self.waiting.setdefault(ref.key, set())
        waiting.add(key)
        try:
            while True:
                left = until - self.monotonic()
                if left <= 0:
                    # This bind gives up, the plan does not: the member stays counted as arrived,
                    # so once the quorum has arrived the plan opens and this member, retried by
                    # kube-scheduler, commits at once.
                    state = self.gangs.state(ref.key, arrival.plan)
                    if state.error:
                        return state.error
                    return self.gangs.waiting_note(ref.key, self.wait_s)
                event = self._events.setdefault(ref.key, asyncio.Event())
                try:
                    await asyncio.wait_for(event.wait(), left)
                except TimeoutError:
                    continue
                state = self.gangs.state(ref.key, arrival.plan)
                if state.error:
                    return state.error
                if state.open:
                    return ""
        finally:
            waiting.discard(key)
            if not waiting:
                self.waiting.pop(ref.key, None)
