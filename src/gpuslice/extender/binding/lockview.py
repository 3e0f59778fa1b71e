"""Which nodes' HAMi node lock a new pod would find busy: the lock state the lock margin reads.

The lock margin (``lock_margin``, docs/node-choice.md) prefers, near the best score, a node whose
lock is free (``policy.lockchoice``). This module says which nodes are busy for one pod, from what
the extender already knows, with no API call:

* **The node watch.** The node's ``hami.io/mutex.lock`` value, judged as the bind path's acquire
  judges it (``kube.locks``): absent, naming this pod, expired (older than
  ``node_lock_expiry_s`` by the wall clock passed in) or unreadable is free, since the bind would
  take it at once; a lock whose owner is gone, being deleted or finished (dangling, as the pod
  watch shows it) is free too, the bind takes it over. A lock naming a live pod (bound and
  waiting for its device plugin's ``Allocate``, or binding) is busy, and so is a legacy lock
  without an owner until it expires.
* **This process's binds in flight** (``bind.BindFlow.in_flight``): a bind queued for the node or
  holding its lock, and, with ``node_choice: extender``, a node the filter has just answered for
  another pod whose bind has not arrived yet (kube-scheduler filters the next pod of a burst
  while the previous one binds, before the node watch can show its lock).

Nodes whose lock has been held too long are already excluded from the filter (``NodeLockHeld``,
``liveness``); this view only orders the nodes that remain.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from gpuslice.codec import locks as lockcodec
from gpuslice.kube import locks as klocks
from gpuslice.kube import objects


def holds(
    value: str,
    key: str,
    now: float,
    expiry_s: float,
    owner: Callable[[str], objects.Pod | None],
) -> bool:
    """True when the lock ``value`` keeps pod ``key`` (``namespace/name``) waiting.

    Args:
        value: the node's ``hami.io/mutex.lock`` annotation.
        key: the pod that would bind.
        now: wall clock, unix seconds (the lock value carries wall time).
        expiry_s: age after which a lock is expired (HAMi's ``--node-lock-timeout``).
        owner: the lock owner's pod as the pod watch shows it (None: gone).
    """
    namespace, _, name = key.partition("/")
    state = lockcodec.assess(value, namespace, name, now, expiry_s)
    if state.verdict is not lockcodec.Verdict.HELD_BY_OTHER:
        return False  # free, ours, expired or unreadable: the bind takes it at once
    lock = state.lock
    if lock is None or lock.namespace is None or lock.name is None:
        return True  # a legacy lock names nobody: it can only expire
    return not klocks.is_dangling(owner(f"{lock.namespace}/{lock.name}"))


class LockView:
    """The busy nodes for a pod (see the module docstring).

    Args:
        locks: node -> its lock value, for the nodes the node watch shows locked.
        owner: a pod by ``namespace/name`` as the pod watch shows it (None: not there).
        in_flight: the nodes this process's binds (and fresh filter answers) of pods other than
            the given one are taking.
        clock: wall clock, unix seconds.
        expiry_s: lock expiry (``node_lock_expiry_s``).
    """

    def __init__(
        self,
        locks: Callable[[], Mapping[str, str]],
        owner: Callable[[str], objects.Pod | None],
        in_flight: Callable[[str], Collection[str]],
        clock: Callable[[], float],
        expiry_s: float,
    ) -> None:
        self._locks = locks
        self._owner = owner
        self._in_flight = in_flight
        self._clock = clock
        self.expiry_s = expiry_s

    def busy(self, key: str) -> set[str]:
        """Nodes whose lock pod ``key`` would find busy now."""
        out = set(self._in_flight(key))
        locks = self._locks()
        if locks:
            now = self._clock()
            out.update(
                node
                for node, value in locks.items()
                if node not in out and holds(value, key, now, self.expiry_s, self._owner)
            )
        return out
