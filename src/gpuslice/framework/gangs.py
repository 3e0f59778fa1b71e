"""Gang plans: all of a gang's members placed together, or none (docs/gangs.md).

kube-scheduler schedules one pod at a time. For a gang that is not enough: members placed one by
one can take half a cluster and then wait forever for room the other half never frees, and two
gangs can each hold what the other needs. kube-scheduler's own answer (KEP-4671, Coscheduling in
kubernetes-sigs/scheduler-plugins) waits in Permit until enough members are assumed; on a stock
kube-scheduler this module gives the extender the same guarantee:

* **Plan the whole gang at once.** At the first member's filter, ``Gangs.admit`` places every
  known pending member (at least the minimum still to place; members not created yet are taken to
  ask what this one asks) on a working copy of the snapshot, with the pod's profile (node and card
  policies, topology requirement, quota), largest first (``place_all``). Either every slot fits,
  or nothing is held and every member is refused with ``GangUnschedulable`` naming what is short.
* **Hold the plan.** Each slot's cards are held in a ``nominations.Nominator`` on the cache's
  journal, so every other pod's filter and ``assume`` sees them taken (the same soft holds a
  preemptor's nomination uses), until the member's own ``assume`` takes them. A plan is atomic:
  it is made and held without a pause, so no gang ever holds part of what it needs, and two gangs
  cannot deadlock on each other (no hold-and-wait).
* **Answer each member with its slot's node.** A member's filter passes only that node.
* **Barrier.** ``arrive`` counts the members at bind; the extender's barrier
  (``extender.binding.barrier``) holds their binds until the plan's quorum is there (``open``),
  or gives up and ``abort`` releases the whole plan.
* **Re-plan** when a plan no longer holds (a node went, a hold expired, the member's shape or the
  nodes kube-scheduler passes changed): the plan goes, and the member's filter plans again, the
  members already at the barrier or bound kept where they are.
* **Expire** plans whose members never come (``expire``).

Pure: times are arguments, no I/O; the caller serialises calls (the extender's event loop).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from gpuslice.cache import snapshot as snapshots
from gpuslice.framework import cycle as cycles
from gpuslice.framework import nominations, view
from gpuslice.framework import profile as profiles
from gpuslice.model import allocations, gangs, nodes, requests, status

DEFAULT_TTL_S = 60.0
"""How long a plan waits for its members when neither the pod nor its group says."""

STARVING_S = 30.0
"""A gang refused this long is the head of the line: no other gang's plan may take the room it needs
(``Gangs._behind``)."""

_PAD = "#"
"""Separates a gang key from a slot number in the key holding a slot no member has yet."""


class Member(msgspec.Struct, frozen=True):
    """A gang member as the pod watch shows it.

    Attributes:
        key: ``namespace/name``.
        uid: the pod's UID.
        request: its GPU request (None: it asks for no GPU, or it does not parse).
        node: the node it is bound to ('' while pending).
    """

    key: str
    uid: str
    request: requests.PodRequest | None
    node: str = ""


class Directory:
    """Gangs' members (from the pod watch) and their groups' minimums (from the group objects)."""

    def __init__(self) -> None:
        """Nothing known."""
        self._members: dict[str, dict[str, Member]] = {}  # gang key -> pod key -> member
        self._gang_of: dict[str, str] = {}  # pod key -> gang key
        self._uids: dict[str, str] = {}  # member UID -> pod key
        self._groups: dict[tuple[str, str, str, str], gangs.GroupSpec] = {}

    def pod(self, ref: gangs.GangRef | None, member: Member) -> None:
        """A pod event: the pod (still there) is a member of ``ref``'s gang, or of none."""
        old = self._gang_of.get(member.key)
        if old is not None and (ref is None or old != ref.key):
            self.gone(member.key)
        if ref is None:
            return
        self._gang_of[member.key] = ref.key
        old_member = self._members.setdefault(ref.key, {}).get(member.key)
        if old_member is not None and old_member.uid != member.uid:
            self._uids.pop(old_member.uid, None)
        self._members[ref.key][member.key] = member
        if member.uid:
            self._uids[member.uid] = member.key

    def gone(self, key: str) -> None:
        """The pod was deleted or finished."""
        gang = self._gang_of.pop(key, None)
        if gang is None:
            return
        members = self._members.get(gang)
        if members is not None:
            gone = members.pop(key, None)
            if gone is not None:
                self._uids.pop(gone.uid, None)
            if not members:
                del self._members[gang]

    def group(
        self, source: str, namespace: str, name: str, spec: gangs.GroupSpec | None, pod_group: str = ""
    ) -> None:
        """A group object's event: its spec, or None when it was deleted."""
        key = (source, namespace, name, pod_group)
        if spec is None:
            self._groups.pop(key, None)
        else:
            self._groups[key] = spec

    def spec(self, ref: gangs.GangRef) -> gangs.GroupSpec | None:
        """What the gang asks: the pod's own minimum, else its group object's; None: unknown yet."""
        if ref.min_member > 0:
            return gangs.GroupSpec(min_member=ref.min_member, timeout_s=ref.timeout_s)
        return self._groups.get((ref.source, ref.namespace, ref.group, ref.pod_group))

    def members(self, gang: str) -> tuple[Member, ...]:
        """The gang's members the watch shows, by key."""
        return tuple(m for _, m in sorted(self._members.get(gang, {}).items()))

    def gangs(self) -> tuple[str, ...]:
        """Every gang with a member, sorted."""
        return tuple(sorted(self._members))

    def has_uid(self, uid: str) -> bool:
        """True when the pod of this UID is a gang member the watch shows."""
        return uid in self._uids

    def gang_of(self, key: str) -> str | None:
        """The gang of the pod ``key``, None when it belongs to none."""
        return self._gang_of.get(key)


# ----- placing a whole gang


class Short(msgspec.Struct, frozen=True):
    """Why a gang does not fit: how many members were placed before one did not.

    Attributes:
        placed: members placed before the first that did not fit.
        wanted: members the plan needed.
        pod: the request that did not fit.
        reasons: the most common reasons the nodes gave for it, with counts.
    """

    placed: int
    wanted: int
    pod: requests.PodRequest
    reasons: tuple[tuple[str, int], ...]

    def describe(self) -> str:
        """``2 of 4 members fit; next: 1 GPU (8000 MiB, 50 cores): InsufficientGPUMemory on 3 nodes``."""
        why = ", ".join(f"{r} on {n} node{'s' if n != 1 else ''}" for r, n in self.reasons) or "no node"
        return f"{self.placed} of {self.wanted} members fit; next: {shape_text(self.pod)}: {why}"


def shape_text(pod: requests.PodRequest) -> str:
    """What a member asks, short: ``2 GPU (8000 MiB, 50 cores)`` per container that asks."""
    parts = []
    for c in pod.containers:
        if c is None or c.count == 0:
            continue
        mem = f"{c.memory_mib} MiB" if c.memory_mib else f"{c.memory_percentage}%"
        if c.memory_percentage == requests.MEMORY_PERCENTAGE_UNSET and not c.memory_mib:
            mem = "whole memory"
        parts.append(f"{c.count} GPU ({mem}, {c.cores} cores)")
    return " + ".join(parts) or "no GPU"


def _weight(pod: requests.PodRequest) -> tuple[int, int, int, int]:
    """Larger first: cards, then memory (MiB or percent), then cores."""
    cards = memory = pct = cores = 0
    for c in pod.containers:
        if c is None:
            continue
        cards += c.count
        memory += c.count * c.memory_mib
        pct += c.count * (
            0 if c.memory_percentage == requests.MEMORY_PERCENTAGE_UNSET else c.memory_percentage
        )
        cores += c.count * c.cores_clamped
    return (-cards, -memory, -pct, -cores)


def place_all(
    profile: profiles.Profile,
    snap: view.Snapshot,
    pods: Sequence[requests.PodRequest],
    names: Sequence[str],
    excluded: Mapping[str, str] | None = None,
    fixed: Iterable[allocations.PodAllocation] = (),
    released: Iterable[allocations.PodAllocation] = (),
) -> list[allocations.PodAllocation] | Short:
    """Every pod placed on one working copy of ``snap`` (``names`` only), in ``pods`` order; or why not.

    Each pod is judged by its own cycle (its node and card policies, topology requirement and its
    namespace's quota) against the nodes as the pods before it left them, and goes to its node
    policy's best node whose cards its card rule accepts (``Cycle.first_placed``), as the filter
    would choose for it alone. ``fixed`` allocations are charged first, and ``released`` ones
    (holds the pods may take over) taken off. Pure: the snapshot is not changed.
    """
    excluded = excluded or {}
    usable = [n for n in names if n not in excluded and n in snap.nodes]
    states: dict[str, nodes.NodeState] = {n: snap.nodes[n] for n in usable}
    quota = view.quota(snap, pods[0].namespace) if pods else None

    def charge(alloc: allocations.PodAllocation) -> None:
        nonlocal quota
        state = states.get(alloc.node)
        if state is not None:
            states[alloc.node] = allocations.apply(state, alloc)
        if quota is not None:
            quota = quota.plus(*allocations.charge_totals(allocations.card_reservation(alloc)))

    for alloc in fixed:
        charge(alloc)
    for alloc in released:
        state = states.get(alloc.node)
        if state is not None:
            states[alloc.node] = allocations.apply(state, alloc, sign=-1)
        if quota is not None:
            quota = quota.plus(*(-x for x in allocations.charge_totals(allocations.card_reservation(alloc))))
    out: list[allocations.PodAllocation] = []
    for pod in pods:
        ctx = cycles.context_of(profile, snap, pod)
        cyc = cycles.Cycle.detached(profile, pod, ctx, states, None, quota)
        ev = cyc.evaluate(usable)
        idx = [i for i, ok in enumerate(ev.feasible.tolist()) if ok]
        placed = None
        if idx:
            fit_names = [ev.names[i] for i in idx]
            keys = cyc.stepped(ev.scores)[idx]
            placed = cyc.first_placed(fit_names, keys)
        if placed is None:
            counts: dict[str, int] = {}
            for st, _ in ev.failures.values():
                for r in st.reasons[:1]:
                    counts[r] = counts.get(r, 0) + 1
            top = tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3])
            return Short(len(out), len(pods), pod, top)
        alloc = placed[1]
        charge(alloc)
        out.append(alloc)
    return out


# ----- plans


@dataclasses.dataclass(slots=True)
class _Slot:
    shape: requests.PodRequest
    alloc: allocations.PodAllocation
    hold: str
    """The key its cards are held under: the member's pod key, or ``gang#n`` while nobody has it."""
    member: str = ""
    uid: str = ""
    arrived: bool = False
    bound: bool = False


@dataclasses.dataclass(slots=True)
class _Plan:
    ref: gangs.GangRef
    quorum: int
    """Members that must be at the barrier before any binds (the minimum less those bound before)."""
    slots: list[_Slot]
    names: tuple[str, ...]
    created: float
    expires_at: float
    ttl_s: float
    id: int = 0
    open: bool = False
    """The quorum was reached: every member at the barrier (and every later one) commits."""
    aborted: str = ""


class Verdict(msgspec.Struct, frozen=True):
    """A member's filter answer from its gang's plan.

    Attributes:
        gated: False when the gang does not gate the pod (its minimum is met already, or the pod
            asks for no GPU): it is filtered as any pod.
        node: the node its slot holds (None: refused, see ``reason``).
        reason: the refusal's status code.
        message: what the pod's event says.
        planned: this filter made the plan: the gang's other members kube-scheduler set aside as
            unschedulable should be tried again now (``extender.binding.requeue``).
    """

    gated: bool
    node: str | None = None
    reason: str = ""
    message: str = ""
    planned: bool = False


NOT_GATED = Verdict(False)


class SlotView(msgspec.Struct, frozen=True):
    """One slot of a plan, for explain and the cluster view."""

    member: str
    node: str
    cards: tuple[str, ...]
    state: str
    """``planned`` (no member took it), ``filtered``, ``waiting`` (at the barrier) or ``bound``."""


class PlanView(msgspec.Struct, frozen=True):
    """A plan as explain and the cluster view show it."""

    gang: str
    source: str
    quorum: int
    arrived: int
    open: bool
    expires_in_s: float
    slots: tuple[SlotView, ...]


class Arrival(msgspec.Struct, frozen=True):
    """A member at bind: whether the barrier is open, or why its bind must fail.

    Attributes:
        open: the quorum is there: commit.
        error: why the bind must fail ('' otherwise).
        plan: the plan the member waits in (``state`` checks it is still the gang's).
    """

    open: bool
    error: str = ""
    plan: int = 0


def _shape(pod: requests.PodRequest) -> requests.PodRequest:
    """The parts of a request that say what it needs (identity and labels cleared)."""
    return msgspec.structs.replace(pod, namespace="", name="", uid="", owner="", labels=(), gang=None)


def _key(pod: requests.PodRequest) -> str:
    return f"{pod.namespace}/{pod.name}"


class Gangs:
    """The gangs' plans and their holds (module docstring).

    Args:
        profile: the profile members are placed with.
        directory: members and group specs, fed by the watches.
        holder: where the plans' cards are held (a ``Nominator`` on the cache's journal).
        default_ttl_s: how long a plan waits for its members when neither pod nor group says.
    """

    def __init__(
        self,
        profile: profiles.Profile,
        directory: Directory,
        holder: nominations.Nominator,
        default_ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        self.profile = profile
        self.directory = directory
        self.holder = holder
        self.default_ttl_s = default_ttl_s
        self._plans: dict[str, _Plan] = {}
        self._ids = 0
        self._why: dict[int, str] = {}  # plan id -> why it was released (the last 1024)
        self._refused_since: dict[str, tuple[float, requests.PodRequest, int]] = {}
        """Gang -> (first refusal, a member's request, members needed), while it is refused."""
        self._fits_empty: dict[tuple[str, int], bool] = {}  # (gang, members) -> fits an empty cluster
        self._refusals: dict[str, tuple[tuple[int, int, int, tuple[str, ...]], Verdict]] = {}
        """Gang -> (snapshot generation, members needed, members known, nodes) and the refusal then."""
        self.planned = 0
        """Plans made (metrics)."""
        self.refused = 0
        """Plans that found no room (metrics)."""
        self.released = 0
        """Plans given up before their gang was bound (metrics)."""

    # ----- the filter

    def admit(
        self,
        pod: requests.PodRequest,
        snap: view.Snapshot,
        names: Sequence[str],
        now: float,
        excluded: Mapping[str, str] | None = None,
    ) -> Verdict:
        """The member's node from its gang's plan, planning the gang when no plan holds (module docstring)."""
        ref = pod.gang
        if ref is None or not pod.wants_gpu:
            return NOT_GATED
        spec = self.directory.spec(ref)
        if spec is None:
            return Verdict(
                True,
                reason=status.GANG_GROUP_MISSING,
                message=f"gang {ref.key}: its {_group_kind(ref)} {ref.group!r} was not found",
            )
        key = _key(pod)
        plan = self._plans.get(ref.key)
        if plan is not None:
            why = self._broken(plan, pod, names, now)
            if why:
                self._drop(plan, why)
                plan = None
        if plan is not None:
            slot = self._slot_for(plan, key, pod)
            if slot is None and not plan.open:
                slot = self._fit_in(plan, pod, snap, names, excluded)
            if slot is not None:
                return self._answer(plan, slot, pod, names)
            if plan.open:
                return NOT_GATED  # the quorum is there; a member beyond the plan binds as any pod
            if not any(not s.member for s in plan.slots):
                # A member beyond the minimum that does not fit beside the plan: the gang can
                # still start without it; it waits (the plan is kept).
                return Verdict(
                    True,
                    reason=status.GANG_UNSCHEDULABLE,
                    message=f"gang {ref.key}: {key} does not fit beside its gang's plan",
                )
            self._drop(plan, f"member {key} fits no slot of the plan")
        need = self._needed(ref, spec, key)
        if need <= 0:
            return NOT_GATED
        memo_key = (view.generation(snap), need, len(self.directory.members(ref.key)), tuple(names))
        last = self._refusals.get(ref.key)
        if last is not None and last[0] == memo_key:
            self.refused += 1
            return last[1]  # nothing changed since the same plan was refused: refused again
        made = self._plan(pod, ref, spec, need, snap, names, now, excluded)
        if isinstance(made, str):  # it fits, but would take the room of a gang refused for long
            self.refused += 1
            self._refused_since.setdefault(ref.key, (now, pod, need))  # it ages in the line too
            return Verdict(True, reason=status.GANG_UNSCHEDULABLE, message=f"gang {ref.key}: {made}")
        if isinstance(made, Short):
            self.refused += 1
            first = self._refused_since.get(ref.key, (now, pod, need))[0]
            self._refused_since[ref.key] = (first, pod, need)
            refusal = Verdict(
                True,
                reason=status.GANG_UNSCHEDULABLE,
                message=f"gang {ref.key} (minimum {spec.min_member}): {made.describe()}",
            )
            self._refusals[ref.key] = (memo_key, refusal)
            if len(self._refusals) > 4096:
                del self._refusals[next(iter(self._refusals))]
            return refusal
        self._refusals.pop(ref.key, None)
        self._refused_since.pop(ref.key, None)
        slot = self._slot_for(made, key, pod)
        if slot is None:  # cannot happen: the plan was made with a slot for this pod
            self._drop(made, "no slot for the planning member")
            return Verdict(True, reason=status.GANG_UNSCHEDULABLE, message=f"gang {ref.key}: no slot")
        return msgspec.structs.replace(self._answer(made, slot, pod, names), planned=True)

    def _answer(self, plan: _Plan, slot: _Slot, pod: requests.PodRequest, names: Sequence[str]) -> Verdict:
        node = slot.alloc.node
        if node not in names:
            return Verdict(
                True,
                reason=status.GANG_PLANNED_ELSEWHERE,
                message=f"gang {plan.ref.key}: planned on node {node}, which kube-scheduler did not pass",
            )
        return Verdict(True, node=node, message=f"gang {plan.ref.key}: slot on node {node}")

    def _needed(self, ref: gangs.GangRef, spec: gangs.GroupSpec, key: str) -> int:
        """GPU members still to place: the minimum less those bound and those asking no GPU."""
        members = self.directory.members(ref.key)
        bound = sum(1 for m in members if m.node and m.key != key)
        gpuless = sum(
            1
            for m in members
            if not m.node and m.key != key and (m.request is None or not m.request.wants_gpu)
        )
        return spec.min_member - bound - gpuless

    def _plan(
        self,
        pod: requests.PodRequest,
        ref: gangs.GangRef,
        spec: gangs.GroupSpec,
        need: int,
        snap: view.Snapshot,
        names: Sequence[str],
        now: float,
        excluded: Mapping[str, str] | None,
    ) -> _Plan | Short | str:
        """Place the pending members (at least ``need``, padded with ``pod``'s shape) and hold them.

        A ``Short`` when they do not fit; a sentence when they fit but would take the room of the
        gang at the head of the line (``_behind``).
        """
        key = _key(pod)
        known = [
            (m.key, m.uid, m.request)
            for m in self.directory.members(ref.key)
            if not m.node and m.key != key and m.request is not None and m.request.wants_gpu
        ]
        wanted: list[tuple[str, str, requests.PodRequest]] = [(key, pod.uid, pod), *known]
        while len(wanted) < need:
            wanted.append(("", "", pod))
        attempts = [wanted] if len(wanted) <= need else [wanted, wanted[:need]]
        result: list[allocations.PodAllocation] | Short = Short(0, need, pod, ())
        order: list[tuple[str, str, requests.PodRequest]] = []
        for members in attempts:
            order = sorted(members, key=lambda m: _weight(m[2]))
            result = place_all(self.profile, snap, [m[2] for m in order], names, excluded)
            if not isinstance(result, Short):
                break
        if isinstance(result, Short):
            return result
        behind = self._behind(ref.key, [m[2] for m in order], snap, names, now, excluded)
        if behind:
            return behind
        ttl = float(ref.timeout_s or spec.timeout_s or self.default_ttl_s)
        self._ids += 1
        plan = _Plan(ref, need, [], tuple(names), now, now + ttl, ttl, id=self._ids)
        with self.holder.lock:
            for n, ((mkey, uid, req), alloc) in enumerate(zip(order, result, strict=True)):
                hold = mkey or f"{ref.key}{_PAD}{n}"
                self.holder.nominate(hold, uid, alloc, math.inf)
                plan.slots.append(_Slot(_shape(req), alloc, hold, member=mkey, uid=uid))
        self._plans[ref.key] = plan
        self.planned += 1
        return plan

    def _behind(
        self,
        gang: str,
        pods: Sequence[requests.PodRequest],
        snap: view.Snapshot,
        names: Sequence[str],
        now: float,
        excluded: Mapping[str, str] | None,
    ) -> str:
        """Why ``gang`` must wait behind the head of the line ('' when it need not).

        Gangs that arrive later, or ask less, fit into freed room sooner; without a rule a large
        gang can wait for ever while smaller ones keep taking what frees. The gang refused for the
        longest, once refused for ``STARVING_S`` and able to fit an empty cluster, is the head of
        the line: another gang is planned only when both fit together now, so the room that frees
        goes to the head first (a reservation without runtimes, as EASY backfilling keeps one for
        the first queued job). Pods outside gangs are not held back.
        """
        head = self._head(gang, now, snap)
        if head is None:
            return ""
        key, (first, shape, need) = head
        together = place_all(self.profile, snap, [*([shape] * need), *pods], names, excluded)
        if not isinstance(together, Short):
            return ""
        return f"waits behind gang {key}, refused for {now - first:.0f} s: both do not fit together"

    def _head(
        self, gang: str, now: float, snap: view.Snapshot
    ) -> tuple[str, tuple[float, requests.PodRequest, int]] | None:
        """The oldest refused gang (not ``gang``) past ``STARVING_S`` that still waits and can fit."""
        for key, entry in sorted(self._refused_since.items(), key=lambda kv: kv[1][0]):
            first, shape, need = entry
            if now - first < STARVING_S:
                return None  # the oldest is not starving yet, so none is
            if key == gang:
                return None  # the gang itself is the oldest waiting: nobody is ahead of it
            if not any(not m.node for m in self.directory.members(key)) or key in self._plans:
                del self._refused_since[key]  # it left, or it is planned: no longer waiting
                continue
            if not self.fits_empty(key, [shape] * need, snap):
                continue  # it can never fit: it holds nobody back
            return key, entry
        return None

    def fits_empty(self, gang: str, pods: Sequence[requests.PodRequest], snap: view.Snapshot) -> bool:
        """Whether ``pods`` fit the snapshot's nodes with nothing on them (cached per gang and size)."""
        cache_key = (gang, len(pods))
        known = self._fits_empty.get(cache_key)
        if known is None:
            empty = snapshots.from_states([nodes.empty_state(st.inventory) for st in snap.nodes.values()])
            known = not isinstance(place_all(self.profile, empty, pods, sorted(empty.nodes)), Short)
            if len(self._fits_empty) > 4096:
                self._fits_empty.clear()
            self._fits_empty[cache_key] = known
        return known

    def _slot_for(self, plan: _Plan, key: str, pod: requests.PodRequest) -> _Slot | None:
        """The member's slot: the one it has, or a free one of its shape (taken over now)."""
        for slot in plan.slots:
            if slot.member == key:
                if slot.uid != pod.uid and pod.uid:
                    self._rehold(slot, key, pod.uid)  # recreated under the same name
                return slot
        shape = _shape(pod)
        for slot in plan.slots:
            if not slot.member and slot.shape == shape:
                self._rehold(slot, key, pod.uid)
                return slot
        return None

    def _fit_in(
        self,
        plan: _Plan,
        pod: requests.PodRequest,
        snap: view.Snapshot,
        names: Sequence[str],
        excluded: Mapping[str, str] | None,
    ) -> _Slot | None:
        """A slot for a member the plan has none of its shape for, keeping the plan; None: none.

        The member takes over a slot no member has yet (held for a member not created when the
        plan was made, with another shape): that slot's cards count as free for it. Without
        such a slot (a member beyond the minimum) it gets a new slot where it fits beside the plan.
        """
        key = _key(pod)
        spare = next((s for s in plan.slots if not s.member), None)
        freed = () if spare is None else (spare.alloc,)
        placed = place_all(self.profile, snap, [pod], names, excluded, released=freed)
        if isinstance(placed, Short):
            return None
        alloc = placed[0]
        with self.holder.lock:
            if spare is not None:
                self.holder.release(spare.hold)
                spare.shape, spare.alloc = _shape(pod), alloc
                slot = spare
            else:
                slot = _Slot(_shape(pod), alloc, key)
                plan.slots.append(slot)
            self.holder.nominate(key, pod.uid, alloc, math.inf)
        slot.hold, slot.member, slot.uid = key, key, pod.uid
        return slot

    def _rehold(self, slot: _Slot, key: str, uid: str) -> None:
        """Hold the slot's cards under the member's key and UID (its own ``assume`` takes them)."""
        with self.holder.lock:
            self.holder.release(slot.hold)
            self.holder.nominate(key, uid, slot.alloc, math.inf)
        slot.hold, slot.member, slot.uid = key, key, uid

    def _broken(self, plan: _Plan, pod: requests.PodRequest, names: Sequence[str], now: float) -> str:
        """Why the plan no longer holds for this member's filter ('' when it does)."""
        if plan.aborted:
            return plan.aborted
        if now >= plan.expires_at and not plan.open:
            return "expired"
        for slot in plan.slots:
            if not slot.bound and self.holder.nomination(slot.hold) is None and not slot.arrived:
                return f"the hold on node {slot.alloc.node} went"
        key = _key(pod)
        for slot in plan.slots:
            if slot.member == key and slot.shape != _shape(pod):
                return f"member {key} changed"
        if not plan.open and not any(s.arrived for s in plan.slots) and tuple(names) != plan.names:
            mine = next((s for s in plan.slots if s.member == key), None)
            if mine is not None and mine.alloc.node not in names:
                return "kube-scheduler passes other nodes"
        return ""

    def _drop(self, plan: _Plan, why: str) -> None:
        """Release every hold of the plan; members at the barrier learn ``why`` (``arrive``)."""
        with self.holder.lock:
            for slot in plan.slots:
                if not slot.bound:
                    self.holder.release(slot.hold)
        if not plan.aborted:
            self.released += 1
        plan.aborted = plan.aborted or why
        self._why[plan.id] = plan.aborted
        if len(self._why) > 1024:
            del self._why[next(iter(self._why))]
        if self._plans.get(plan.ref.key) is plan:
            del self._plans[plan.ref.key]

    # ----- the bind

    def arrive(self, pod: requests.PodRequest, node: str, now: float) -> Arrival:
        """The member's bind arrived for ``node``: counted at the barrier; whether it is open."""
        ref = pod.gang
        plan = self._plans.get(ref.key) if ref is not None else None
        key = _key(pod)
        if plan is None or ref is None:
            return Arrival(
                False, f"gang {ref.key if ref else '?'}: no plan holds (re-planned at the next filter)"
            )
        slot = next((s for s in plan.slots if s.member == key), None)
        if slot is None:
            return Arrival(False, f"gang {ref.key}: {key} has no slot in the plan")
        if slot.alloc.node != node:
            return Arrival(False, f"gang {ref.key}: {key} is planned on node {slot.alloc.node}, not {node}")
        slot.arrived = True
        if not plan.open and sum(1 for s in plan.slots if s.arrived or s.bound) >= plan.quorum:
            plan.open = True
        if not plan.open:
            plan.expires_at = max(plan.expires_at, now + plan.ttl_s)
        return Arrival(plan.open, plan=plan.id)

    def state(self, gang: str, plan_id: int) -> Arrival:
        """For a member waiting at the barrier in plan ``plan_id``: open, still waiting, or why not."""
        plan = self._plans.get(gang)
        if plan is None or plan.id != plan_id:
            why = self._why.get(plan_id, "the plan was released")
            return Arrival(False, f"gang {gang}: {why}", plan_id)
        return Arrival(plan.open, plan=plan_id)

    def waiting_note(self, gang: str, waited_s: float) -> str:
        """Why a member's bind gives up at the barrier while its plan holds: who is still missing."""
        plan = self._plans.get(gang)
        if plan is None:
            return f"gang {gang}: the plan was released"
        arrived = sum(1 for s in plan.slots if s.arrived or s.bound)
        return (
            f"gang {gang}: {arrived} of {plan.quorum} members have come to bind after {waited_s:g}s; "
            "the plan keeps their cards, retry"
        )

    def abort(self, gang: str, why: str) -> None:
        """Give the plan up (the barrier waited too long): every hold goes, every waiting bind fails."""
        plan = self._plans.get(gang)
        if plan is not None and not plan.open:
            self._drop(plan, why)

    def claim(self, pod: requests.PodRequest) -> None:
        """The member's bind proceeds: its held cards leave the snapshots for its own re-fit.

        They stay refused to every other pod until its ``assume`` takes them (``Nominator.claim``).
        """
        self.holder.claim(_key(pod), pod.uid)

    def bound(self, pod: requests.PodRequest) -> None:
        """The member is bound; a plan whose every slot is bound is done."""
        ref = pod.gang
        plan = self._plans.get(ref.key) if ref is not None else None
        if plan is None:
            return
        key = _key(pod)
        for slot in plan.slots:
            if slot.member == key:
                slot.bound = True
        if all(s.bound for s in plan.slots):
            del self._plans[plan.ref.key]

    def failed(self, pod: requests.PodRequest, alloc: allocations.PodAllocation | None, now: float) -> None:
        """The member's bind failed after the barrier opened: its slot is held again for its retry."""
        ref = pod.gang
        plan = self._plans.get(ref.key) if ref is not None else None
        if plan is None or not plan.open:
            return
        key = _key(pod)
        for slot in plan.slots:
            if slot.member == key and not slot.bound:
                if alloc is not None and alloc.node == slot.alloc.node:
                    slot.alloc = alloc
                with self.holder.lock:
                    self.holder.release(key)
                    self.holder.nominate(key, pod.uid, slot.alloc, math.inf)
                plan.expires_at = max(plan.expires_at, now + plan.ttl_s)

    # ----- housekeeping

    def expire(self, now: float) -> tuple[str, ...]:
        """Release the plans past their deadline (an open one too: its members stopped coming)."""
        gone = sorted(k for k, p in self._plans.items() if now >= p.expires_at)
        for k in gone:
            self._drop(self._plans[k], "expired: its members did not all come")
        return tuple(gone)

    def member_gone(self, key: str) -> None:
        """A member's pod went away: a plan it held a slot in, not yet open, is given up."""
        gang = self.directory.gang_of(key)
        if gang is not None and not any(not m.node and m.key != key for m in self.directory.members(gang)):
            self._refused_since.pop(gang, None)
        for plan in list(self._plans.values()):
            if not plan.open and any(s.member == key and not s.bound for s in plan.slots):
                self._drop(plan, f"member {key} went away")

    def gated(self, pod: requests.PodRequest) -> bool:
        """True when the pod's bind must go through the barrier: its gang still waits for members.

        That is every GPU member of a gang, unless its gang's plan is open and holds no slot for
        it (a member beyond the quorum), or no plan holds and the gang's minimum is bound already.
        A member whose plan went between its filter and its bind is gated too: the barrier then
        refuses it (``arrive``) and its next filter plans again, so no member binds alone.
        """
        ref = pod.gang
        if ref is None or not pod.wants_gpu:
            return False
        plan = self._plans.get(ref.key)
        key = _key(pod)
        if plan is not None:
            return not plan.open or any(s.member == key for s in plan.slots)
        spec = self.directory.spec(ref)
        return spec is None or self._needed(ref, spec, key) > 0

    def held(self) -> int:
        """Plans holding cards now."""
        return len(self._plans)

    def views(self, now: float) -> tuple[PlanView, ...]:
        """Every plan, by gang (safe from the cluster view's thread: the plans are copied at once)."""
        plans = list(self._plans.values())  # one C-level copy under the GIL
        return tuple(sorted((self._view(p, now) for p in plans), key=lambda v: v.gang))

    def view(self, gang: str, now: float) -> PlanView | None:
        """One gang's plan, None when it has none."""
        plan = self._plans.get(gang)
        return None if plan is None else self._view(plan, now)

    def _view(self, plan: _Plan, now: float) -> PlanView:
        slots = tuple(
            SlotView(
                s.member or "(not created yet)",
                s.alloc.node,
                tuple(g.uuid for grants in s.alloc.containers for g in grants),
                "bound" if s.bound else "waiting" if s.arrived else "filtered" if s.member else "planned",
            )
            for s in plan.slots
        )
        arrived = sum(1 for s in plan.slots if s.arrived or s.bound)
        left = max(0.0, plan.expires_at - now)
        return PlanView(plan.ref.key, plan.ref.source, plan.quorum, arrived, plan.open, round(left, 1), slots)


def _group_kind(ref: gangs.GangRef) -> str:
    if ref.source == gangs.SOURCE_WORKLOAD:
        return "Workload"
    return "PodGroup"
