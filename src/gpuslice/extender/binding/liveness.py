"""Node liveness: which registered GPU nodes must not get new pods right now, and why.

Two conditions, both judged from the node as the watch shows it, with the time passed in:

* **Device plugin gone** (``NodeHandshakeStale``), HAMi's rule on ``hami.io/node-handshake``
  (``pkg/device/nvidia/device.go`` ``CheckHealth`` in Project-HAMi/HAMi): while kubelet advertises
  ``nvidia.com/gpu`` the plugin is registered with it, so the node is live. When the allocatable
  count drops to 0 after we saw it positive, the plugin went away: stale at once. When it was
  never positive (a plugin that only writes the handshake), the handshake decides: the scheduler
  writes ``Requesting_<time>`` and a live plugin overwrites it with ``Reported <time>``; a
  ``Requesting_`` older than the timeout means nobody answered. Unlike HAMi, a stale node is not
  re-admitted by the next ``Requesting_`` write: it stays stale until kubelet advertises cards
  again or the plugin reports (HAMi issue #1839 is the opposite failure, a node blocked forever).
* **Allocate stalled** (``NodeAllocateStalled``): the recovery loop released a lock because the
  node's device plugin left a bound pod's Allocate unanswered past the allocate timeout. Kubelet
  may still advertise the GPUs (the plugin is registered but hangs), so nothing else shows it;
  without this the node would take one pod per timeout forever. It ends when a pod on the node
  reaches ``bind-phase: success`` or ``failed`` (the plugin answers again) or after
  ``stall_cooloff_s``, when one pod probes it again.
* **Stuck lock** (``NodeLockHeld``): HAMi's node lock has named the same pod for longer than
  ``stuck_lock_s`` by our own monotonic clock (no cross-machine clock comparison). A healthy
  Allocate holds it for tens of milliseconds; a node whose lock is stuck would otherwise keep
  winning filter and prioritize and collect binds that can only wait.

``NodeHealth.excluded`` is a live node -> reason map that filter and bind read on every request,
kept current by ``observe`` (node events) and ``tick`` (time passing).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from gpuslice.codec import handshake, keys
from gpuslice.kube import objects
from gpuslice.model import status


def allocatable_gpus(node: objects.Node, resource: str = handshake.GPU_RESOURCE) -> int:
    """The node's allocatable count resource (``nvidia.com/gpu`` unless renamed; 0 when absent)."""
    text = node.status.allocatable.get(resource, "0")
    return int(text) if text.isdigit() else 0


class NodeHealth:
    """Tracks each node's handshake and lock; ``excluded`` says which nodes to avoid.

    Args:
        handshake_timeout_s: how long a ``Requesting_`` handshake may stay unanswered.
        stuck_lock_s: how long one owner may hold the node lock before the node is avoided.
        stall_cooloff_s: how long a node whose device plugin left an Allocate unanswered is avoided.
        gpu_resource: the count resource kubelet advertises (HAMi's ``resourceCountName``).
    """

    def __init__(
        self,
        handshake_timeout_s: float,
        stuck_lock_s: float,
        stall_cooloff_s: float = 300.0,
        gpu_resource: str = handshake.GPU_RESOURCE,
    ) -> None:
        self.gpu_resource = gpu_resource
        self.handshake_ttl = dt.timedelta(seconds=handshake_timeout_s)
        self.stuck_lock_s = stuck_lock_s
        self.stall_cooloff_s = stall_cooloff_s
        self._stalled: dict[str, tuple[float, float]] = {}
        """Node -> (monotonic, wall) time its Allocate stall was seen."""
        self.excluded: dict[str, str] = {}
        """Node -> reason code, for nodes that must not get new pods now."""
        self._advertised: set[str] = set()
        self._locks: dict[str, tuple[str, float]] = {}
        self._nodes: dict[str, objects.Node] = {}
        self._timed: set[str] = set()
        """Nodes whose verdict depends on the time: a held lock, or a handshake that decides."""

    def observe(self, node: objects.Node, deleted: bool, now: float, monotonic: float) -> None:
        """Apply a node event (wall ``now`` for the handshake, ``monotonic`` for lock ages)."""
        name = node.metadata.name
        if deleted or keys.NODE_REGISTER not in node.metadata.annotations:
            self.forget(name)
            return
        old = self._nodes.get(name)
        shake = node.metadata.annotations.get(keys.NODE_HANDSHAKE, "")
        if old is not None and shake != old.metadata.annotations.get(keys.NODE_HANDSHAKE, ""):
            if shake.startswith(handshake.REPORTED):
                self._advertised.discard(name)  # the plugin answers again: the handshake decides
        self._nodes[name] = node
        lock = node.metadata.annotations.get(keys.NODE_LOCK)
        if lock is None:
            self._locks.pop(name, None)
        elif self._locks.get(name, ("", 0.0))[0] != lock:
            self._locks[name] = (lock, monotonic)
        self._judge(name, now, monotonic)

    def allocate_stalled(self, name: str, now: float, monotonic: float) -> None:
        """The recovery loop released the node's lock after an unanswered Allocate."""
        if name in self._nodes:
            self._stalled[name] = (monotonic, now)
            self._judge(name, now, monotonic)

    def allocate_answered(self, name: str, bind_time: float, now: float, monotonic: float) -> None:
        """A pod on the node bound at ``bind_time`` shows ``bind-phase`` success/failed.

        Only a pod bound after the stall was seen proves the device plugin answers again (old
        pods keep their answered phase for their whole life).
        """
        stalled = self._stalled.get(name)
        if stalled is not None and bind_time >= stalled[1] - 1.0:
            del self._stalled[name]
            if name in self._nodes:
                self._judge(name, now, monotonic)

    def forget(self, name: str) -> None:
        """The node is gone or no longer a GPU node."""
        self._stalled.pop(name, None)
        self._nodes.pop(name, None)
        self._locks.pop(name, None)
        self._advertised.discard(name)
        self._timed.discard(name)
        self.excluded.pop(name, None)

    def tick(self, now: float, monotonic: float) -> None:
        """Re-judge the nodes whose verdict time can change (aging handshakes, held locks)."""
        for name in list(self._timed):
            self._judge(name, now, monotonic)

    def lock_age(self, name: str, monotonic: float) -> float | None:
        """Seconds the current lock value has been seen on the node, None when unlocked."""
        seen = self._locks.get(name)
        return None if seen is None else monotonic - seen[1]

    def lock_values(self) -> dict[str, str]:
        """Node -> its ``hami.io/mutex.lock`` value, for the registered nodes the watch shows locked."""
        return {name: seen[0] for name, seen in self._locks.items()}

    def needs_handshake(self, names: Iterable[str] | None = None) -> list[str]:
        """Nodes whose handshake lacks a ``Requesting_`` (the leader writes one, as HAMi does)."""
        out = []
        for name in self._nodes if names is None else names:
            node = self._nodes.get(name)
            if node is not None and handshake.REQUESTING not in node.metadata.annotations.get(
                keys.NODE_HANDSHAKE, ""
            ):
                out.append(name)
        return out

    def counts(self) -> dict[str, int]:
        """How many nodes are excluded for each reason."""
        out = dict.fromkeys(
            (status.NODE_HANDSHAKE_STALE, status.NODE_LOCK_HELD, status.NODE_ALLOCATE_STALLED), 0
        )
        for reason in self.excluded.values():
            out[reason] = out.get(reason, 0) + 1
        return out

    def _judge(self, name: str, now: float, monotonic: float) -> None:
        node = self._nodes[name]
        handshake_decides = allocatable_gpus(node, self.gpu_resource) == 0 and name not in self._advertised
        if handshake_decides or name in self._locks or name in self._stalled:
            self._timed.add(name)
        else:
            self._timed.discard(name)
        reason = self._reason(name, now, monotonic)
        if reason is None:
            self.excluded.pop(name, None)
        else:
            self.excluded[name] = reason

    def _reason(self, name: str, now: float, monotonic: float) -> str | None:
        node = self._nodes[name]
        if allocatable_gpus(node, self.gpu_resource) > 0:
            self._advertised.add(name)
        elif name in self._advertised or not self._answered(node, now):
            return status.NODE_HANDSHAKE_STALE
        stalled = self._stalled.get(name)
        if stalled is not None:
            if monotonic - stalled[0] <= self.stall_cooloff_s:
                return status.NODE_ALLOCATE_STALLED
            del self._stalled[name]  # cooled off: one pod probes the node again
        age = self.lock_age(name, monotonic)
        if age is not None and age > self.stuck_lock_s:
            return status.NODE_LOCK_HELD
        return None

    def _answered(self, node: objects.Node, now: float) -> bool:
        value = node.metadata.annotations.get(keys.NODE_HANDSHAKE)
        return handshake.handshake_health(value, 0, now, self.handshake_ttl).healthy
