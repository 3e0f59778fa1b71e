"""Pending GPU pods the filter has seen fail: what they ask, since when, and the last summary.

The filter notes every GPU pod it answers (``note``): a pod no node fits is kept (uid -> its
parsed request, first-seen and last-seen times, the last ``3/5 nodes feasible, ...`` summary), a
pod some node fits is dropped, and so is a pod whose bind is asked for (``drop``). ``pods()``
lists what is still pending, oldest first, dropping the entries ``alive`` says are gone (the pod
was deleted, bound by someone else, or recreated under another uid). At most ``limit`` pods and
``budget`` bytes (``memo.Memo``) are kept; the one noted longest ago is forgotten first.

Each entry holds what ``explain.explain`` needs: ``explain.explain(snap, entry.request, ...)``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import msgspec

from gpuslice.framework import memo
from gpuslice.model import requests

DEFAULT_LIMIT = 1000
DEFAULT_BUDGET = 4 << 20


class Pending(msgspec.Struct, frozen=True, kw_only=True):
    """One pending GPU pod.

    Attributes:
        uid: pod UID.
        key: ``namespace/name``.
        request: its parsed GPU request (``explain.explain`` takes it as is).
        first_seen: when the filter first found no node for it (seconds since the epoch).
        last_seen: when the filter last did.
        summary: the filter's last summary (``0/3 nodes feasible, 3 InsufficientGPUMemory``).
    """

    uid: str
    key: str
    request: requests.PodRequest
    first_seen: float
    last_seen: float
    summary: str


class PendingPods:
    """The registry (see the module docstring); safe to call from any thread.

    Args:
        limit: most pods kept.
        budget: most bytes kept (their requests, keys and summaries).
        alive: ``(key, uid) -> bool``, False once the pod is deleted, bound or replaced (None:
            entries leave only through ``note`` and ``drop``).
        clock: seconds since the epoch.
    """

    def __init__(
        self,
        clock: Callable[[], float],
        limit: int = DEFAULT_LIMIT,
        alive: Callable[[str, str], bool] | None = None,
        budget: int = DEFAULT_BUDGET,
    ) -> None:
        self.limit = limit
        self.alive = alive
        self._clock = clock
        self._lock = threading.Lock()
        self._by_uid = memo.Memo(limit, budget, _weigh)

    def note(self, pod: requests.PodRequest, feasible: bool, summary: str) -> None:
        """Record one filter answer for a GPU pod: kept when nothing fits, dropped otherwise."""
        if not pod.uid:
            return
        if feasible or not pod.wants_gpu:
            self.drop(pod.uid)
            return
        now = self._clock()
        with self._lock:
            old: Pending | None = self._by_uid.get(pod.uid)
            self._by_uid.put(
                pod.uid,
                Pending(
                    uid=pod.uid,
                    key=f"{pod.namespace}/{pod.name}",
                    request=pod,
                    first_seen=now if old is None else old.first_seen,
                    last_seen=now,
                    summary=summary,
                ),
            )

    def drop(self, uid: str) -> None:
        """Forget a pod (it fits, is being bound, or is gone)."""
        if uid not in self._by_uid:  # the common case on the filter path: nothing to forget
            return  # (a lookup is atomic; an entry added meanwhile counts as added after the drop)
        with self._lock:
            self._by_uid.pop(uid, None)

    def get(self, key: str) -> Pending | None:
        """The pending entry of ``namespace/name``, if any (and still alive)."""
        return next((p for p in self.pods() if p.key == key), None)

    def pods(self) -> list[Pending]:
        """Every pending pod, first seen first; entries ``alive`` rejects are dropped."""
        with self._lock:
            entries = list(self._by_uid.values())
        if self.alive is not None:
            gone = {p.uid for p in entries if not self.alive(p.key, p.uid)}
            for uid in gone:
                self.drop(uid)
            entries = [p for p in entries if p.uid not in gone]
        return sorted(entries, key=lambda p: (p.first_seen, p.key))

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_uid)


def _weigh(entry: Pending) -> int:
    """Bytes a pending entry holds: its request (shared with the request memo, counted anyway)."""
    return requests.footprint(entry.request) + len(entry.key) + len(entry.summary)
