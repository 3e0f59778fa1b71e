"""Nominations: cards held for preemptors while their victims leave (docs/preemption.md).

kube-scheduler keeps its nominator beside the scheduling queue, not in its cache
(``pkg/scheduler/backend/queue/nominator.go``); this module sits beside the pending registry
(``framework.pending``) the same way. A ``Nominator`` holds one record per preemptor key: its UID,
its allocation (node and cards), its deadline and whether its bind has started (``claim``).

The rules, which the cache applies under its own lock (``cache.ClusterCache``, lock order: the
cache's lock, then ``Nominator.lock``, never the reverse):

* an unclaimed nomination counts as taken in every snapshot (``held``) and in every other pod's
  ``assume``, but not in its preemptor's own snapshot (``held(skip=key)``);
* a claimed one (its bind started) leaves the snapshots, so the bind path's fit sees the cards
  free, but is still refused to every other pod (``held_against``);
* the preemptor's ``assume`` converts it (``take``) in the same locked step as its charge.

A nomination ends with that ``take``, with ``release`` (the watch saw the preemptor placed, an
eviction failed, the sweep found the pod gone), with ``expire`` or when its node goes
(``drop_node``). Every change bumps ``version`` and records the node it touched, so the cache
rebuilds only those nodes (``changed_since``).

Pure: times are arguments, nothing is read from the clock, no I/O. Safe to call from any thread.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping

import msgspec

from gpuslice.model import allocations, nodes

Reservation = tuple[tuple[str, nodes.CardUsage], ...]
"""A nomination's charge per card, ``(uuid, usage)`` sorted by UUID."""


class Nomination(msgspec.Struct, frozen=True):
    """A nominated reservation as readers see it: the preemptor, its node and cards, the deadline."""

    key: str
    uid: str
    alloc: allocations.PodAllocation
    expires_at: float
    claimed: bool = False


@dataclasses.dataclass(slots=True)
class _Record:
    key: str
    uid: str
    alloc: allocations.PodAllocation
    reservation: Reservation
    expires_at: float
    claimed: bool = False
    """Its bind started: no longer in the snapshots, still refused to every other pod."""

    def view(self) -> Nomination:
        return Nomination(self.key, self.uid, self.alloc, self.expires_at, self.claimed)


def _add(into: dict[str, nodes.CardUsage], reservation: Reservation) -> None:
    for uuid, r in reservation:
        into[uuid] = into.get(uuid, nodes.EMPTY_CARD).plus(r)


class Journal:
    """The lock, the version and the nodes changed, shared by the holders one cache reads.

    Preemptors' nominations and gang plans (``framework.gangs``) are two ``Nominator`` objects on
    one journal, so the cache reads both (``Merged``) under one lock and one version.
    """

    def __init__(self) -> None:
        """Version 0, nothing changed."""
        self.lock = threading.RLock()
        self.version = 0
        self.changed: dict[str, int] = {}  # node -> the version of its last change

    def mark(self, node: str) -> None:
        """Something held on ``node`` changed."""
        self.version += 1
        self.changed[node] = self.version


class Nominator:
    """The preemptors' nominations (see the module docstring)."""

    def __init__(self, journal: Journal | None = None) -> None:
        """No nomination; ``journal``: shared with other holders the cache reads (default: its own)."""
        self._journal = journal or Journal()
        self.lock = self._journal.lock
        """Held by the cache across its reads and its ``take`` (after its own lock)."""
        self._records: dict[str, _Record] = {}  # preemptor key -> its nomination

    def _mark(self, node: str) -> None:
        self._journal.mark(node)

    def _drop(self, key: str) -> None:
        self._mark(self._records.pop(key).alloc.node)

    # ----- writers

    def nominate(self, key: str, uid: str, alloc: allocations.PodAllocation, expires_at: float) -> None:
        """Hold ``alloc``'s cards for the preemptor ``key`` until ``expires_at`` (replacing its earlier one).

        Whether the node is known is the cache's to check (``ClusterCache.nominate``).
        """
        reservation = tuple(sorted(allocations.card_reservation(alloc, False).items()))
        with self.lock:
            if key in self._records:
                self._drop(key)
            self._records[key] = _Record(key, uid, alloc, reservation, expires_at)
            self._mark(alloc.node)

    def claim(self, key: str, uid: str) -> bool:
        """The preemptor's bind starts: its cards leave the snapshots, still refused to other pods.

        The bind path fits the pod on a plain snapshot, so the held cards must look free there;
        until the bind's ``assume`` converts the nomination (or it expires), another pod's
        ``assume`` still counts them as taken. False when the pod (this UID) holds no nomination.
        """
        with self.lock:
            rec = self._records.get(key)
            if rec is None or rec.uid != uid:
                return False
            if not rec.claimed:
                rec.claimed = True
                self._mark(rec.alloc.node)
            return True

    def release(self, key: str) -> bool:
        """Drop the pod's nomination; False when it had none."""
        with self.lock:
            if key not in self._records:
                return False
            self._drop(key)
            return True

    def expire(self, now: float) -> tuple[str, ...]:
        """Drop the nominations whose deadline is ``now`` or earlier; their keys, sorted."""
        with self.lock:
            gone = sorted(k for k, r in self._records.items() if r.expires_at <= now)
            for k in gone:
                self._drop(k)
            return tuple(gone)

    def take(self, key: str, uid: str) -> bool:
        """The preemptor's ``assume`` succeeded: its own nomination (this UID) ends; False: none."""
        with self.lock:
            rec = self._records.get(key)
            if rec is None or rec.uid != uid:
                return False
            self._drop(key)
            return True

    def drop_node(self, node: str) -> None:
        """The node is gone: its cards are gone with it, nothing is left to hold there."""
        with self.lock:
            for k in [k for k, r in self._records.items() if r.alloc.node == node]:
                self._drop(k)

    # ----- readers

    def nomination(self, key: str) -> Nomination | None:
        """The pod's nomination, None when it has none."""
        with self.lock:
            rec = self._records.get(key)
            return None if rec is None else rec.view()

    def nominations(self) -> tuple[Nomination, ...]:
        """Every nomination, by preemptor key."""
        with self.lock:
            return tuple(r.view() for _, r in sorted(self._records.items()))

    def unclaimed_node(self, key: str) -> str | None:
        """The node of the pod's unclaimed nomination (what ``held(skip=key)`` leaves out); None: none."""
        with self.lock:
            rec = self._records.get(key)
            return None if rec is None or rec.claimed else rec.alloc.node

    def held(self, skip: str = "") -> Mapping[str, Mapping[str, nodes.CardUsage]]:
        """Node -> card UUID -> what unclaimed nominations hold there, ``skip``'s own left out.

        What every snapshot counts as taken on top of the pods (``skip``: the preemptor whose own
        view is built, ``ClusterCache.snapshot_for``).
        """
        out: dict[str, dict[str, nodes.CardUsage]] = {}
        with self.lock:
            for rec in self._records.values():
                if not rec.claimed and rec.key != skip:
                    _add(out.setdefault(rec.alloc.node, {}), rec.reservation)
        return out

    def held_against(self, node: str, key: str, uid: str) -> Mapping[str, nodes.CardUsage]:
        """Card UUID -> what nominations hold on ``node`` against the pod ``key`` (``uid``) assuming there.

        Every other pod's nomination counts, claimed or not; the pod's own does not (its
        ``assume`` converts it), nor a claimed one under its key. An unclaimed nomination under
        its key but another UID (a pod recreated under the same name) counts.
        """
        out: dict[str, nodes.CardUsage] = {}
        with self.lock:
            for rec in self._records.values():
                if rec.alloc.node != node or (rec.key == key and (rec.claimed or rec.uid == uid)):
                    continue
                _add(out, rec.reservation)
        return out

    def version(self) -> int:
        """A number that grows with every change (of any holder on the same journal)."""
        with self.lock:
            return self._journal.version

    def changed_since(self, version: int) -> tuple[str, ...]:
        """The nodes whose holds (on this journal) changed after ``version``, sorted."""
        with self.lock:
            return tuple(sorted(n for n, v in self._journal.changed.items() if v > version))


class Merged:
    """Several ``Nominator`` objects on one ``Journal``, read by the cache as one.

    ``nominate`` goes to the first (the preemptors'); every reader merges all of them, and
    ``take``, ``release`` and ``drop_node`` reach all of them.
    """

    def __init__(self, journal: Journal, *holders: Nominator) -> None:
        """``holders`` must all have been built on ``journal``."""
        if not holders or any(h.lock is not journal.lock for h in holders):
            raise ValueError("every holder must share the journal")
        self._journal = journal
        self._holders = holders
        self.lock = journal.lock

    def nominate(self, key: str, uid: str, alloc: allocations.PodAllocation, expires_at: float) -> None:
        """The first holder's ``nominate``."""
        self._holders[0].nominate(key, uid, alloc, expires_at)

    def take(self, key: str, uid: str) -> bool:
        """Every holder's ``take``; True when one held something for the pod."""
        with self.lock:
            return any([h.take(key, uid) for h in self._holders])

    def release(self, key: str) -> bool:
        """Every holder's ``release``."""
        with self.lock:
            return any([h.release(key) for h in self._holders])

    def drop_node(self, node: str) -> None:
        """Every holder's ``drop_node``."""
        with self.lock:
            for h in self._holders:
                h.drop_node(node)

    def unclaimed_node(self, key: str) -> str | None:
        """The first holder's unclaimed node for ``key``."""
        with self.lock:
            for h in self._holders:
                node = h.unclaimed_node(key)
                if node is not None:
                    return node
            return None

    def held(self, skip: str = "") -> Mapping[str, Mapping[str, nodes.CardUsage]]:
        """Every holder's ``held``, added up."""
        out: dict[str, dict[str, nodes.CardUsage]] = {}
        with self.lock:
            for h in self._holders:
                for node, cards in h.held(skip).items():
                    _add(out.setdefault(node, {}), tuple(cards.items()))
        return out

    def held_against(self, node: str, key: str, uid: str) -> Mapping[str, nodes.CardUsage]:
        """Every holder's ``held_against``, added up."""
        out: dict[str, nodes.CardUsage] = {}
        with self.lock:
            for h in self._holders:
                _add(out, tuple(h.held_against(node, key, uid).items()))
        return out

    def version(self) -> int:
        """The journal's version."""
        with self.lock:
            return self._journal.version

    def changed_since(self, version: int) -> tuple[str, ...]:
        """The nodes any holder changed after ``version``, sorted."""
        with self.lock:
            return tuple(sorted(n for n, v in self._journal.changed.items() if v > version))
