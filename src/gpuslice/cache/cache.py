"""The cluster cache: the only mutable state of the scheduler, guarded by one lock.

Pod states (after kube-scheduler's cache)::

       +-------------------------------------------+  +----+
       |                            Add            |  |    |
       |                                           |  |    | Update
       +      Assume                Add            v  v    |
    Initial +--------> Assumed +------------+---> Added <--+
       ^                +   +               |       +
       |                |   |               |       |
       |                |   |     Add       |       | Remove
       |                |   +---------------+       |
       +----------------+ Forget / Expire           |
       +--------------------------------------------+

* ``assume`` reserves a pod's cards the moment the filter picks them, atomically *checking* that
  they are still free and that the namespace's GPU quota still admits the pod's charge (so two
  concurrent requests can never take the same capacity, nor overrun a quota together);
  ``finish_binding`` starts its TTL; ``expire`` drops assumed pods whose binding finished more than
  ``ttl`` ago without the watch confirming them; ``forget`` drops one (failed bind).
* ``add_pod`` comes from the watch (a pod with allocation annotations on a node). It confirms an
  assumed pod, or charges a pod the scheduler never assumed (e.g. after a restart). It never
  refuses: the pod is placed already, and the cache must say what the cluster holds. A pod is
  never assumed twice; ``remove_pod`` works from any state.
* Nominations, cards held for a preemptor while its victims leave (docs/preemption.md), are kept
  by a ``Nominations`` object (``framework.nominations.Nominator``) given to the cache, as
  kube-scheduler keeps its nominator beside its queue rather than in its cache. The cache applies
  them under its lock (then the nominator's, never the reverse): an unclaimed nomination counts
  as taken in every snapshot and every other pod's ``assume``, but not in the preemptor's own
  view (``snapshot_for``); a claimed one (its bind started) is out of the snapshots but still
  refused to every other pod's ``assume``; the preemptor's ``assume`` converts its own in the same
  locked step. ``nominate`` checks the node is known; ``add_pod`` of the preemptor (placed
  anywhere) and ``remove_node`` end nominations; ``remove_pod`` leaves them (the sync calls it on
  every update of a pending pod).

Init containers (``docs/init-containers.md``): a pod is charged max(init peak, app sum) per card
until the watch reports every init container succeeded (``add_pod(..., inits_done=True)``); it
is then recharged with its app containers only. Should kubelet report the init containers as not
done again (it re-runs them after a pod sandbox restart), the next ``add_pod`` grows the charge
back. HAMi's scheduler does the same on every pod update (``InitContainersAllSucceeded`` and
``AppContainersOnly`` in ``pkg/device/initcontainer.go``).

Accounting is incremental: each event charges or uncharges one pod's per-card reservation
(``allocations.card_reservation``) and namespace totals (``allocations.charge_totals``). Each
node carries a generation, and ``snapshot`` rebuilds only the nodes changed since the previous
snapshot. Grants on UUIDs a node does not have (or on nodes not registered yet) are kept as
orphans and charged again when the node (re)registers. Time is always a parameter (``now``);
nothing here reads the clock.

Memory: a cluster of 150 000 pods is held in about 500 bytes a pod. Each pod is one slotted
record whose key, namespace, node and card UUIDs are interned (one string object per distinct
value, shared with the informer's store), whose grants are shared with every other pod holding an
equal grant, and whose reservation is a sorted tuple of ``(uuid, usage)`` with the usage objects
shared too (a one-card pod's reservation is two small tuples, where a dict took three times the
memory).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import sys
import threading
import types
from collections.abc import Mapping
from typing import Protocol

import msgspec

from gpuslice.cache import shapes, snapshot
from gpuslice.model import allocations, devices, nodes, requests, status
from gpuslice.policy import api, cards, columns
from gpuslice.policy import quota as quotas


class PodState(enum.Enum):
    """Where a pod is in the state machine."""

    ASSUMED = "assumed"
    ADDED = "added"


Reservation = tuple[tuple[str, nodes.CardUsage], ...]
"""A pod's charge per card, ``(uuid, usage)`` sorted by UUID (``allocations.card_reservation`` as
a tuple: a third of the memory of the dict for a one-card pod)."""


class Holder(msgspec.Struct, frozen=True):
    """A pod charged on a card (``ClusterCache.holders``): its key, node, charge and whether assumed."""

    pod: str
    node: str
    usage: nodes.CardUsage
    assumed: bool


def _holder_key(h: Holder) -> str:
    return h.pod


@dataclasses.dataclass(slots=True)
class _Pod:
    """One held pod.

    Its strings (key, namespace, node and card UUIDs) are interned and its grants and usages
    shared with equal ones (``ClusterCache._compact``, ``ClusterCache._reservation``).
    """

    key: str
    uid: str
    namespace: str
    alloc: allocations.PodAllocation
    reservation: Reservation
    state: PodState
    inits_done: bool = False
    bound_at: float | None = None
    job: str = ""
    """The pod's job (``requests.PodRequest.job``, interned; '' = none): ``NodeState.jobs``."""


@dataclasses.dataclass(slots=True)
class _Node:
    inventory: nodes.NodeInventory
    index: dict[str, int]
    usage: list[nodes.CardUsage]
    cpu_used: int = 0
    memory_used: int = 0
    generation: int = 0


class HeldPod(msgspec.Struct, frozen=True):
    """A pod charged on a node (``ClusterCache.pods_on``): its charge per card and its state."""

    key: str
    uid: str
    reservation: Reservation
    cpu_milli: int
    memory_mib: int
    state: PodState


def _pod_key(p: _Pod) -> str:
    return p.key


class Nominations(Protocol):
    """What the cache needs of the preemptors' nominations (``framework.nominations.Nominator``).

    The cache holds ``lock`` (after its own) across the reads and the ``take`` of one step.
    """

    @property
    def lock(self) -> contextlib.AbstractContextManager[object]:
        """Taken after the cache's lock, never before it."""
        ...

    def nominate(self, key: str, uid: str, alloc: allocations.PodAllocation, expires_at: float) -> None:
        """Hold ``alloc``'s cards for the preemptor ``key`` (replacing its earlier nomination)."""
        ...

    def take(self, key: str, uid: str) -> bool:
        """The preemptor's ``assume`` succeeded: its own nomination ends."""
        ...

    def release(self, key: str) -> bool:
        """Drop the pod's nomination."""
        ...

    def drop_node(self, node: str) -> None:
        """The node is gone: drop the nominations on it."""
        ...

    def unclaimed_node(self, key: str) -> str | None:
        """The node of the pod's unclaimed nomination, None when it has none."""
        ...

    def held(self, skip: str = "") -> Mapping[str, Mapping[str, nodes.CardUsage]]:
        """Node -> UUID -> what unclaimed nominations hold (``skip``'s own left out)."""
        ...

    def held_against(self, node: str, key: str, uid: str) -> Mapping[str, nodes.CardUsage]:
        """UUID -> what nominations hold on ``node`` against the pod ``key`` (``uid``)."""
        ...

    def version(self) -> int:
        """Grows with every change."""
        ...

    def changed_since(self, version: int) -> tuple[str, ...]:
        """The nodes whose nominations changed after ``version``."""
        ...


def _namespace(key: str) -> str:
    return sys.intern(key.split("/", 1)[0] if "/" in key else "default")


_SHARED_MAX = 65536
"""Distinct card usages (and grants) remembered for sharing; when full the table starts anew
(held pods keep what they share), so churn over months cannot grow it without bound."""


class ClusterCache:
    """Nodes, pods and namespace usage; see the module docstring for the state machine."""

    def __init__(self, histogram: shapes.ShapeHistogram | None = None, *, nominator: Nominations) -> None:
        """An empty cache; ``nominator`` keeps the preemptors' nominations (module docstring)."""
        self._lock = threading.RLock()  # reentrant: ``snapshot_for`` takes a snapshot under it
        self.nominator = nominator
        self._nom_seen = 0  # the nominator's version the nodes were last marked dirty for
        self._nom_skip = ""  # ``snapshot_for``: the preemptor whose own nomination is left out
        self._nodes: dict[str, _Node] = {}
        self._pods: dict[str, _Pod] = {}
        self._by_node: dict[str, set[str]] = {}
        self._assumed: set[str] = set()
        self._ns_used: dict[str, list[int]] = {}
        self._limits: dict[str, quotas.QuotaView] = {}
        self._orphans: dict[str, tuple[snapshot.Orphan, ...]] = {}
        self._hist = histogram or shapes.ShapeHistogram()
        self._gen = 0
        self._dirty: set[str] = set()
        self._removed: set[str] = set()
        self._states: dict[str, nodes.NodeState] = {}
        self._cols = columns.ColumnsBuilder()
        self._last: snapshot.Snapshot | None = None
        self._usages: dict[nodes.CardUsage, nodes.CardUsage] = {}
        self._models: dict[str, int] = {}  # cards per model over all nodes (``Snapshot.capacity``)
        self._capacity: tuple[tuple[str, int], ...] | None = None
        self._grants: dict[allocations.DeviceGrant, allocations.DeviceGrant] = {}
        # ``Snapshot.jobs``: job -> node -> JobOnNode, from ``_states``' jobs. Copy-on-write: a
        # mapping handed to a snapshot is never changed; a job whose nodes change gets a new one.
        self._job_nodes: dict[str, Mapping[str, nodes.JobOnNode]] = {}
        self._jobs_view: Mapping[str, Mapping[str, nodes.JobOnNode]] = types.MappingProxyType({})

    # ----- nodes

    def upsert_node(self, inventory: nodes.NodeInventory) -> None:
        """Add a node or replace its inventory; its pods are charged again on the new cards."""
        with self._lock:
            old = self._nodes.get(inventory.name)
            if old is not None and old.inventory == inventory:
                return
            if old is not None:
                self._count_models(old.inventory, -1)
            self._count_models(inventory, 1)
            self._nodes[inventory.name] = _Node(
                inventory=inventory,
                index={d.uuid: i for i, d in enumerate(inventory.devices)},
                usage=[nodes.EMPTY_CARD] * len(inventory.devices),
            )
            self._removed.discard(inventory.name)
            for key in self._by_node.get(inventory.name, ()):
                self._charge_node(self._pods[key], 1)
            self._touch(inventory.name)

    def _count_models(self, inventory: nodes.NodeInventory, sign: int) -> None:
        """Add (1) or take away (-1) a node's cards from the cards-per-model count (under the lock)."""
        for d in inventory.devices:
            if d.type:
                left = self._models.get(d.type, 0) + sign
                if left:
                    self._models[d.type] = left
                else:
                    self._models.pop(d.type, None)
        self._capacity = None

    def remove_node(self, name: str) -> None:
        """Forget a node; its pods stay (as orphans) until removed or the node comes back."""
        with self._lock:
            gone = self._nodes.pop(name, None)
            if gone is None:
                return
            self._count_models(gone.inventory, -1)
            for key in self._by_node.get(name, ()):
                pod = self._pods[key]
                self._orphans[key] = tuple(snapshot.Orphan(name, u, key) for u, _ in pod.reservation)
            self.nominator.drop_node(name)  # the node's cards are gone: nothing left to hold
            self._dirty.discard(name)
            self._removed.add(name)
            self._gen += 1

    # ----- quota and workload

    def set_quota(self, namespace: str, limits: quotas.QuotaView | None) -> None:
        """Set (or clear, with None) a namespace's limits; usage fields of ``limits`` are ignored."""
        with self._lock:
            if limits is None or limits.unlimited:
                self._limits.pop(namespace, None)
            else:
                self._limits[namespace] = limits.cleared()
            self._gen += 1

    def observe_request(self, shape: api.Shape) -> None:
        """Record a requested pod shape for the target-workload histogram.

        The snapshot changes only when the histogram re-takes its target workload (``drift``), so
        only then does a new generation start.
        """
        with self._lock:
            if self._hist.observe(shape):
                self._gen += 1

    # ----- pods

    def assume(
        self, key: str, uid: str, alloc: allocations.PodAllocation, now: float, job: str = ""
    ) -> status.Status:
        """Reserve the pod's cards if they are still free; the outcome says why not otherwise.

        The pod is refused (``UNSCHEDULABLE``, ``QUOTA_EXCEEDED``) when its charge
        (``allocations.charge_totals``) would take its namespace past a GPU quota limit. The
        charge is the full one (init peak included): a pod being bound has not run yet.

        ``now`` is accepted for symmetry with the other transitions (the TTL starts at
        ``finish_binding``). A pod the cache holds already is refused (``ALREADY_CACHED``).

        A preemptor's own nomination (same key and UID) does not count against it: it is
        converted into the assumption in the same locked step, so its cards are never free in
        between; other pods' nominations, claimed or not, count as taken.
        """
        del now
        key = sys.intern(key)
        with self._lock, self.nominator.lock:
            if key in self._pods:
                return _ALREADY_CACHED
            reservation = self._reservation(alloc, False)
            namespace = _namespace(key)
            verdict = self._admits(alloc, reservation, namespace, key, uid)
            if not verdict.ok:
                return verdict
            self.nominator.take(key, uid)  # its own nomination, if any, becomes this assumption
            pod = _Pod(key, uid, namespace, self._compact(alloc), reservation, PodState.ASSUMED)
            pod.job = sys.intern(job)  # its job, for NodeState.jobs (the balanced task affinity)
            self._charge(pod, 1)
            self._pods[key] = pod
            self._assumed.add(key)
            return status.SUCCESS

    def finish_binding(self, key: str, now: float) -> None:
        """The Binding call returned: start the assumed pod's TTL."""
        with self._lock:
            pod = self._pods.get(key)
            if pod is not None and pod.state is PodState.ASSUMED:
                pod.bound_at = now

    def forget(self, key: str) -> bool:
        """Drop an assumed pod (its bind failed); False when it was not assumed."""
        with self._lock:
            pod = self._pods.get(key)
            if pod is None or pod.state is not PodState.ASSUMED:
                return False
            self._drop(pod)
            return True

    def expire(self, now: float, ttl: float) -> tuple[str, ...]:
        """Drop assumed pods whose binding finished at least ``ttl`` ago; their keys, sorted."""
        with self._lock:
            gone = sorted(
                k for k in self._assumed if (b := self._pods[k].bound_at) is not None and now - b >= ttl
            )
            for k in gone:
                self._drop(self._pods[k])
            return tuple(gone)

    def add_pod(
        self, key: str, uid: str, alloc: allocations.PodAllocation, inits_done: bool = False, job: str = ""
    ) -> None:
        """A pod with an allocation seen by the watch: confirm it if assumed, else (re)charge it.

        ``inits_done`` (``kube.objects.Pod.inits_done``): every init container succeeded, so only
        the app containers are charged. A held pod whose flag flipped is recharged: its usage
        shrinks, or grows back when kubelet reports the init containers as not done again. Never
        refuses (quota and capacity are only checked by ``assume``). ``job``: the pod's job
        (``NodeState.jobs``); a held pod whose job changed (a relabelled pod) is counted anew.
        """
        job = sys.intern(job)
        key = sys.intern(key)
        with self._lock:
            self.nominator.release(key)  # the preemptor is placed (here or elsewhere): hold no more
            pod = self._pods.get(key)
            if pod is not None and pod.uid == uid and pod.alloc == alloc:
                pod.state = PodState.ADDED
                pod.bound_at = None
                self._assumed.discard(key)
                if pod.job != job:
                    pod.job = job
                    if pod.alloc.node in self._nodes:
                        self._touch(pod.alloc.node)
                if pod.inits_done != inits_done:
                    self._charge(pod, -1)
                    pod.inits_done = inits_done
                    pod.reservation = self._reservation(alloc, inits_done)
                    self._charge(pod, 1)
                return
            if pod is not None:
                self._drop(pod)
            reservation = self._reservation(alloc, inits_done)
            alloc = self._compact(alloc)
            pod = _Pod(key, uid, _namespace(key), alloc, reservation, PodState.ADDED, inits_done, job=job)
            self._charge(pod, 1)
            self._pods[key] = pod

    def remove_pod(self, key: str) -> None:
        """The pod is gone (deleted or finished), whatever its state."""
        with self._lock:
            pod = self._pods.get(key)
            if pod is not None:
                self._drop(pod)

    def pod_allocation(self, key: str) -> allocations.PodAllocation | None:
        """The allocation the cache charges for the pod, None when it holds none."""
        with self._lock:
            pod = self._pods.get(key)
            return None if pod is None else pod.alloc

    def pod_state(self, key: str) -> PodState | None:
        """The pod's state, None when the cache does not hold it."""
        with self._lock:
            pod = self._pods.get(key)
            return None if pod is None else pod.state

    def holders(self) -> Mapping[str, tuple[Holder, ...]]:
        """Card UUID -> the pods charged on it, sorted by pod key (read-only; for the cluster view).

        Under the lock only the pods' (immutable) fields are copied; the records are built after.
        Orphaned grants are included under their UUID (``Snapshot.orphans`` names them).
        """
        with self._lock:
            rows = [(p.key, p.alloc.node, p.reservation, p.state) for p in self._pods.values()]
        out: dict[str, list[Holder]] = {}
        for key, node, reservation, state in rows:
            assumed = state is PodState.ASSUMED
            for uuid, usage in reservation:
                out.setdefault(uuid, []).append(Holder(key, node, usage, assumed))
        return types.MappingProxyType({u: tuple(sorted(hs, key=_holder_key)) for u, hs in out.items()})

    # ----- nominated reservations (GPU-aware preemption, docs/preemption.md)

    def pods_on(self, node: str) -> tuple[HeldPod, ...]:
        """What each pod the cache charges on ``node`` holds, by pod key (preemption's residents)."""
        with self._lock:
            return tuple(
                HeldPod(p.key, p.uid, p.reservation, p.alloc.cpu_milli, p.alloc.memory_mib, p.state)
                for p in sorted((self._pods[k] for k in self._by_node.get(node, ())), key=_pod_key)
            )

    def nominate(self, key: str, uid: str, alloc: allocations.PodAllocation, expires_at: float) -> bool:
        """Hold ``alloc``'s cards for a preemptor until ``expires_at`` (the nominator's ``nominate``).

        Checked against the nodes under the lock, so no nomination outlives its node's removal;
        False when the node is unknown.
        """
        with self._lock:
            if alloc.node not in self._nodes:
                return False
            self.nominator.nominate(sys.intern(key), uid, alloc, expires_at)
            return True

    def snapshot_for(self, key: str) -> snapshot.Snapshot:
        """``snapshot`` as the preemptor ``key`` sees it: its own nominated cards free.

        Built by leaving the nomination out of its node for one snapshot (only that node is
        rebuilt, twice: now and at the next plain snapshot). Without a (visible) nomination this
        is the plain snapshot.
        """
        if self.nominator.unclaimed_node(key) is None:  # most pods: the plain snapshot
            return self.snapshot()
        with self._lock, self.nominator.lock:
            node = self.nominator.unclaimed_node(key)
            if node is None or node not in self._nodes:
                return self.snapshot()
            self._nom_skip = key
            self._touch(node)
            try:
                snap = self.snapshot()
            finally:
                self._nom_skip = ""
                self._touch(node)  # a new generation: the next snapshot rebuilds the node
            return snap

    def _sync_nominations(self) -> None:
        """Mark dirty the nodes whose nominations changed since the last look (both locks held)."""
        version = self.nominator.version()
        if version == self._nom_seen:
            return
        for name in self.nominator.changed_since(self._nom_seen):
            if name in self._nodes:
                self._touch(name)
        self._nom_seen = version

    # ----- snapshot

    def _cards_per_model(self) -> tuple[tuple[str, int], ...]:
        """``api.Context.capacity`` of the registered nodes (recomputed after inventory changes)."""
        if self._capacity is None:
            self._capacity = tuple(sorted(self._models.items()))
        return self._capacity

    def snapshot(self) -> snapshot.Snapshot:
        """An immutable view; only nodes changed since the last snapshot are rebuilt."""
        with self._lock, self.nominator.lock:
            self._sync_nominations()
            if self._last is not None and self._last.generation == self._gen:
                return self._last
            nodes_changed = bool(self._removed or self._dirty) or self._last is None
            jobs_changed: dict[str, dict[str, nodes.JobOnNode]] = {}  # job -> its new node map
            held = self.nominator.held(self._nom_skip) if self._dirty else {}
            for name in self._removed:
                gone = self._states.pop(name, None)
                if gone is not None and gone.jobs:
                    self._reindex_jobs(jobs_changed, name, gone.jobs, ())
                self._cols.remove(name)
            for name in self._dirty:
                n = self._nodes[name]
                old = self._states.get(name)
                state = nodes.NodeState(
                    inventory=n.inventory,
                    usage=_with_held(n, held.get(name)),
                    cpu_used_milli=n.cpu_used,
                    memory_used_mib=n.memory_used,
                    jobs=self._node_jobs(name, n),
                )
                self._states[name] = state
                self._cols.set(state)
                old_jobs = () if old is None else old.jobs
                if old_jobs != state.jobs:
                    self._reindex_jobs(jobs_changed, name, old_jobs, state.jobs)
            self._removed.clear()
            self._dirty.clear()
            if jobs_changed:
                for job, on in jobs_changed.items():
                    if on:
                        self._job_nodes[job] = types.MappingProxyType(on)
                    else:
                        self._job_nodes.pop(job, None)
                self._jobs_view = types.MappingProxyType(dict(self._job_nodes))
            if nodes_changed or self._last is None:
                node_map: Mapping[str, nodes.NodeState] = types.MappingProxyType(dict(self._states))
                cols = self._cols.freeze()
            else:  # only quota, workload or orphans changed: share the node views
                node_map, cols = self._last.nodes, self._last.columns
            views = {}
            for ns, limits in self._limits.items():
                c, m, k = self._ns_used.get(ns, (0, 0, 0))
                views[ns] = limits.plus(c, m, k)
            self._last = snapshot.Snapshot(
                generation=self._gen,
                nodes=node_map,
                columns=cols,
                quotas=types.MappingProxyType(views),
                workload=self._hist.workload(),
                capacity=self._cards_per_model(),
                orphans=tuple(sorted(o for os in self._orphans.values() for o in os)),
                jobs=self._jobs_view,
            )
            return self._last

    def node_generation(self, name: str) -> int | None:
        """The generation at which the node last changed (None if unknown)."""
        with self._lock, self.nominator.lock:
            self._sync_nominations()
            n = self._nodes.get(name)
            return None if n is None else n.generation

    # ----- internals (lock held)

    def _reservation(self, alloc: allocations.PodAllocation, inits_done: bool) -> Reservation:
        """``allocations.card_reservation`` as a sorted tuple, interned UUIDs, shared usages."""
        containers = alloc.containers
        if not alloc.init_count and len(containers) == 1 and len(containers[0]) == 1:
            # One card in one app container (most pods): what card_charge gives for it.
            g = containers[0][0]
            r = nodes.CardUsage(1, max(0, g.memory_mib), max(0, g.cores), () if g.mig is None else (g.mig,))
            return ((sys.intern(g.uuid), self._usage(r)),)
        out = []
        for uuid, r in allocations.card_reservation(alloc, inits_done).items():
            out.append((sys.intern(uuid), self._usage(r)))
        out.sort()
        return tuple(out)

    def _usage(self, usage: nodes.CardUsage) -> nodes.CardUsage:
        """The shared usage equal to ``usage``."""
        shared = self._usages.get(usage)
        if shared is None:
            if len(self._usages) >= _SHARED_MAX:
                self._usages.clear()  # the pods keep theirs; sharing starts anew
            shared = self._usages[usage] = usage
        return shared

    def _compact(self, alloc: allocations.PodAllocation) -> allocations.PodAllocation:
        """An equal allocation whose grants are shared with other pods' (and strings interned)."""
        grants = self._grants
        containers = []
        for c in alloc.containers:
            out = []
            for g in c:
                shared = grants.get(g)
                if shared is None:
                    if len(grants) >= _SHARED_MAX:
                        grants.clear()  # the pods keep theirs; sharing starts anew
                    shared = allocations.DeviceGrant(
                        sys.intern(g.uuid), g.memory_mib, g.cores, sys.intern(g.vendor)
                    )
                    grants[shared] = shared
                out.append(shared)
            containers.append(tuple(out))
        return msgspec.structs.replace(alloc, node=sys.intern(alloc.node), containers=tuple(containers))

    def _reindex_jobs(
        self,
        changed: dict[str, dict[str, nodes.JobOnNode]],
        name: str,
        old: tuple[nodes.JobOnNode, ...],
        new: tuple[nodes.JobOnNode, ...],
    ) -> None:
        """Move the node's entries of the job index from ``old`` jobs to ``new`` ones (lock held).

        A job touched gets a copy of its node map in ``changed`` (the snapshot installs them), so
        the mappings older snapshots hold never change.
        """
        before = {j.job: j for j in old}
        after = {j.job: j for j in new}
        for job in before.keys() | after.keys():
            j = after.get(job)
            if before.get(job) == j:
                continue
            on = changed.get(job)
            if on is None:
                on = changed[job] = dict(self._job_nodes.get(job, {}))
            if j is None:
                on.pop(name, None)
            else:
                on[name] = j

    def _node_jobs(self, name: str, node: _Node) -> tuple[nodes.JobOnNode, ...]:
        """The jobs whose pods the node holds, sorted: pods per job and the cards they hold."""
        pods: dict[str, int] = {}
        held: dict[str, set[int]] = {}
        for key in self._by_node.get(name, ()):
            pod = self._pods[key]
            if not pod.job:
                continue
            pods[pod.job] = pods.get(pod.job, 0) + 1
            mine = held.setdefault(pod.job, set())
            for uuid, _ in pod.reservation:
                i = node.index.get(uuid)
                if i is not None:
                    mine.add(i)
        return tuple(nodes.JobOnNode(j, pods[j], tuple(sorted(held[j]))) for j in sorted(pods))

    def _touch(self, name: str) -> None:
        self._gen += 1
        self._nodes[name].generation = self._gen
        self._dirty.add(name)

    def _admits(
        self, alloc: allocations.PodAllocation, reservation: Reservation, namespace: str, key: str, uid: str
    ) -> status.Status:
        """Whether the pod fits; ``node.usage`` is the pods', the nominations held against it are added."""
        node = self._nodes.get(alloc.node)
        if node is None:
            return status.Status(status.Code.UNRESOLVABLE, (status.NODE_UNREGISTERED,))
        held = self.nominator.held_against(alloc.node, key, uid)
        inv = node.inventory
        if inv.cpu_milli > 0 and alloc.cpu_milli > inv.cpu_milli - node.cpu_used:
            return status.Status(status.Code.UNSCHEDULABLE, (status.INSUFFICIENT_CPU,))
        if inv.memory_mib > 0 and alloc.memory_mib > inv.memory_mib - node.memory_used:
            return status.Status(status.Code.UNSCHEDULABLE, (status.INSUFFICIENT_HOST_MEMORY,))
        exclusive = {g.uuid for c in alloc.containers for g in c if g.cores >= devices.FULL_CORES}
        for uuid, r in reservation:
            i = node.index.get(uuid)
            if i is None:
                return status.Status(status.Code.UNRESOLVABLE, (status.INVALID_REQUEST,))
            dev = inv.devices[i]
            reason = cards.static_reason(dev, inv.cordoned, _NO_SELECTORS)
            if reason is not None:
                return status.Status(status.Code.UNRESOLVABLE, (reason,))
            taken = node.usage[i]
            extra = held.get(uuid)
            if extra is not None:  # held for a preemptor (its victims leaving, or its bind under way)
                taken = taken.plus(extra)
            reason = cards.admits(dev, taken, r, uuid in exclusive)
            if reason is not None:
                return status.Status(status.Code.UNSCHEDULABLE, (reason,))
        limits = self._limits.get(namespace)
        if limits is not None:
            used = self._ns_used.get(namespace, (0, 0, 0))
            if not limits.plus(*used).admits(*allocations.charge_totals(reservation)):
                return status.Status(status.Code.UNSCHEDULABLE, (status.QUOTA_EXCEEDED,))
        return status.SUCCESS

    def _charge(self, pod: _Pod, sign: int) -> None:
        """Add (sign 1) or remove (-1) a pod's reservation: its node's cards and its namespace."""
        if sign > 0:
            self._by_node.setdefault(pod.alloc.node, set()).add(pod.key)
        else:
            on = self._by_node.get(pod.alloc.node)
            if on is not None:
                on.discard(pod.key)
                if not on:
                    del self._by_node[pod.alloc.node]
        c, m, k = allocations.charge_totals(pod.reservation)
        used = self._ns_used.get(pod.namespace)
        if used is None:
            used = self._ns_used[pod.namespace] = [0, 0, 0]
        used[0] += sign * c
        used[1] += sign * m
        used[2] += sign * k
        if used == [0, 0, 0]:
            del self._ns_used[pod.namespace]
        self._gen += 1
        if sign > 0:
            self._charge_node(pod, 1)
        else:
            self._orphans.pop(pod.key, None)
            if pod.alloc.node in self._nodes:
                self._charge_node(pod, -1)

    def _charge_node(self, pod: _Pod, sign: int) -> None:
        """Charge the pod's cards on its node; UUIDs the node lacks become orphans."""
        name = pod.alloc.node
        node = self._nodes.get(name)
        if node is None:
            self._orphans[pod.key] = tuple(snapshot.Orphan(name, u, pod.key) for u, _ in pod.reservation)
            return
        missing = []
        for uuid, r in pod.reservation:
            i = node.index.get(uuid)
            if i is None:
                missing.append(snapshot.Orphan(name, uuid, pod.key))
                continue
            node.usage[i] = node.usage[i].add(r, sign)
        node.cpu_used += sign * pod.alloc.cpu_milli
        node.memory_used += sign * pod.alloc.memory_mib
        if sign > 0 and missing:
            self._orphans[pod.key] = tuple(sorted(missing))
        else:
            self._orphans.pop(pod.key, None)
        self._touch(name)

    def _drop(self, pod: _Pod) -> None:
        self._charge(pod, -1)
        del self._pods[pod.key]
        self._assumed.discard(pod.key)


def _with_held(node: _Node, held: Mapping[str, nodes.CardUsage] | None) -> tuple[nodes.CardUsage, ...]:
    """The node's card usage as snapshots show it: its pods' plus what nominations hold."""
    if not held:
        return tuple(node.usage)
    usage = list(node.usage)
    for uuid, r in held.items():
        i = node.index.get(uuid)
        if i is not None:
            usage[i] = usage[i].plus(r)
    return tuple(usage)


_NO_SELECTORS = requests.NO_SELECTORS
_ALREADY_CACHED = status.Status(status.Code.UNRESOLVABLE, (status.ALREADY_CACHED,))
