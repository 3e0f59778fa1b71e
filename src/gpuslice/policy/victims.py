"""GPU-aware preemption, the pure part: which pods to evict on a node, and which node to pick.

kube-scheduler's own preemption cannot help a pod that waits for GPU capacity: the GPU resources
are hidden from its fit (``ignoredByScheduler``), so its dry run finds that the pod "fits" every
node without evicting anyone. This module does the dry run on concrete cards instead, with
kube-scheduler's rules (``SelectVictimsOnNode``, ``filterPodsWithPDBViolation`` and
``pickOneNodeForPreemption`` in ``pkg/scheduler/framework/preemption/preemption.go`` and
``pkg/scheduler/framework/plugins/defaultpreemption/default_preemption.go``):

1. Only pods of strictly lower priority than the preemptor are potential victims; a preemptor
   whose ``preemptionPolicy`` is ``Never`` preempts nobody (``can_preempt``).
2. On a node, every potential victim is removed; if the pod still does not fit on the node's
   cards (``fit.place`` with the pod's card policy), the node is no candidate.
3. The potential victims are then *reprieved* one by one, most important first (higher
   priority, then earlier start), those whose eviction would violate a PodDisruptionBudget before
   the others: a pod is put back when the preemptor still fits with it, and is a victim
   otherwise. Putting a pod back only adds load, so no victim of the result could be spared on
   its own: the set is minimal in that sense, and biased towards evicting few, low-priority pods
   that no budget protects.
4. Candidates are ordered (``order``) by: fewest PDB violations, lowest priority of the most
   important victim, smallest sum of victim priorities, fewest victims, latest start of the most
   important victims, and finally the node name (kube-scheduler takes the first of its list).

A PodDisruptionBudget protects a pod when it selects it (same namespace, label selector) and its
``disruptionsAllowed`` is used up; as in kube-scheduler, each earlier victim the budget selects
uses one of its allowed disruptions (``violations``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import msgspec

from gpuslice.model import allocations, nodes, requests
from gpuslice.policy import api, fit

PREEMPT_NEVER = "Never"
"""``spec.preemptionPolicy`` of a pod that must not preempt others."""
DEFAULT_PRIORITY = 0
"""The priority of a pod without one (no PriorityClass and no global default)."""


class Requirement(msgspec.Struct, frozen=True):
    """One ``matchExpressions`` entry of a label selector."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


class Selector(msgspec.Struct, frozen=True):
    """A label selector (``metav1.LabelSelector``); ``policy/v1`` treats an empty one as "every pod"."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when the labels satisfy every term (unknown operators match nothing)."""
        if any(labels.get(k) != v for k, v in self.match_labels):
            return False
        for r in self.match_expressions:
            present = r.key in labels
            if r.operator == "In":
                ok = present and labels[r.key] in r.values
            elif r.operator == "NotIn":
                ok = not present or labels[r.key] not in r.values
            elif r.operator == "Exists":
                ok = present
            elif r.operator == "DoesNotExist":
                ok = not present
            else:
                ok = False
            if not ok:
                return False
        return True


class Budget(msgspec.Struct, frozen=True):
    """A PodDisruptionBudget as preemption reads it.

    Attributes:
        namespace: the budget's namespace (it only selects pods there).
        name: its name, for events.
        selector: its pod selector; None (no selector) selects nothing.
        allowed: ``status.disruptionsAllowed``.
        disrupted: ``status.disruptedPods``' names: already being disrupted, not counted again.
    """

    namespace: str
    name: str
    selector: Selector | None
    allowed: int
    disrupted: frozenset[str] = frozenset()

    def selects(self, resident: Resident) -> bool:
        """True when the budget covers the pod."""
        return (
            self.selector is not None
            and resident.namespace == self.namespace
            and self.selector.matches(dict(resident.labels))
        )


class Resident(msgspec.Struct, frozen=True, kw_only=True):
    """A pod holding cards on the node, as a potential victim.

    Attributes:
        key: ``namespace/name``.
        uid: the pod UID (the eviction's precondition).
        priority: ``spec.priority``.
        reservation: what the cache charges it per card UUID.
        cpu_milli: host CPU it holds where the node tracks it.
        memory_mib: host memory it holds where the node tracks it.
        labels: its labels (for PodDisruptionBudget selectors), sorted pairs.
        start: its start (or creation) time, seconds; earlier is more important among equals.
    """

    key: str
    uid: str = ""
    priority: int = DEFAULT_PRIORITY
    reservation: tuple[tuple[str, nodes.CardUsage], ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    labels: tuple[tuple[str, str], ...] = ()
    start: float = 0.0

    @property
    def namespace(self) -> str:
        """The pod's namespace."""
        return self.key.split("/", 1)[0]

    @property
    def name(self) -> str:
        """The pod's name."""
        return self.key.split("/", 1)[-1]


class Candidate(msgspec.Struct, frozen=True):
    """A node where evicting ``victims`` lets the preemptor in, and where it would go.

    Attributes:
        node: the node name.
        victims: the pods to evict, most important first.
        violations: how many of them a PodDisruptionBudget protects.
        allocation: the preemptor's cards once the victims are gone.
    """

    node: str
    victims: tuple[Resident, ...]
    violations: int
    allocation: allocations.PodAllocation

    @property
    def cards(self) -> tuple[str, ...]:
        """The UUIDs the preemptor would get, in allocation order, each once."""
        return tuple(dict.fromkeys(g.uuid for c in self.allocation.containers for g in c))


def can_preempt(priority: int, preemption_policy: str | None) -> bool:
    """False for a preemptor that must not preempt (``preemptionPolicy: Never``)."""
    del priority
    return preemption_policy != PREEMPT_NEVER


def _more_important(r: Resident) -> tuple[int, float, str]:
    """Sort key, most important first: higher priority, then earlier start (``MoreImportantPod``)."""
    return (-r.priority, r.start, r.key)


def _shift(state: nodes.NodeState, r: Resident, sign: int) -> nodes.NodeState:
    """The node with the resident's charge added (1) or removed (-1)."""
    index = {d.uuid: i for i, d in enumerate(state.inventory.devices)}
    usage = list(state.usage)
    for uuid, u in r.reservation:
        i = index.get(uuid)
        if i is None:
            continue
        usage[i] = usage[i].add(u, sign)
    return nodes.NodeState(
        inventory=state.inventory,
        usage=tuple(usage),
        cpu_used_milli=state.cpu_used_milli + sign * r.cpu_milli,
        memory_used_mib=state.memory_used_mib + sign * r.memory_mib,
    )


def split_by_budget(
    ordered: Sequence[Resident], budgets: Iterable[Budget]
) -> tuple[list[Resident], list[Resident]]:
    """(violating, not violating), each in the given order (``filterPodsWithPDBViolation``).

    Every pod a budget selects uses one of its allowed disruptions (unless the budget already
    lists it as disrupted); once none is left, the pod violates the budget.
    """
    budgets = list(budgets)
    left = [b.allowed for b in budgets]
    violating: list[Resident] = []
    fine: list[Resident] = []
    for r in ordered:
        broken = False
        for k, b in enumerate(budgets):
            if not b.selects(r) or r.name in b.disrupted:
                continue
            left[k] -= 1
            broken = broken or left[k] < 0
        (violating if broken else fine).append(r)
    return violating, fine


def select_on_node(
    state: nodes.NodeState,
    residents: Iterable[Resident],
    pod: requests.PodRequest,
    priority: int,
    card_policy: api.CardChooser,
    ctx: api.Context = api.EMPTY_CONTEXT,
    budgets: Iterable[Budget] = (),
) -> Candidate | None:
    """The victims on one node (see the module docstring), or None when evicting cannot help.

    ``state`` is the node as the cache sees it, ``residents`` what each pod on it holds (pods of
    equal or higher priority are never victims). Quota is left out: evicting frees capacity, not
    the preemptor's namespace quota.
    """
    lower = sorted((r for r in residents if r.priority < priority), key=_more_important)
    if not lower:
        return None
    emptied = state
    for r in lower:
        emptied = _shift(emptied, r, -1)
    if not fit.place(emptied, pod, card_policy, ctx).status.ok:
        return None
    violating, fine = split_by_budget(lower, budgets)
    victims: list[Resident] = []
    violations = 0
    current = emptied
    for group, counts in ((violating, True), (fine, False)):
        for r in group:
            back = _shift(current, r, 1)
            if fit.place(back, pod, card_policy, ctx).status.ok:
                current = back  # reprieved
            else:
                victims.append(r)
                violations += counts
    placed = fit.place(current, pod, card_policy, ctx)
    if placed.allocation is None:  # cannot happen: ``current`` is a state where the pod fitted
        return None
    victims.sort(key=_more_important)
    return Candidate(state.name, tuple(victims), violations, placed.allocation)


_INT32 = 2**31
"""kube-scheduler adds MaxInt32 + 1 to each priority before summing, so negatives order right."""


def rank(c: Candidate) -> tuple[int, int, int, int, float, str]:
    """``order``'s sort key of one candidate (smaller is better)."""
    prios = [v.priority for v in c.victims]
    highest = max(prios) if prios else -_INT32
    earliest = min((v.start for v in c.victims if v.priority == highest), default=0.0)
    return (
        c.violations,
        highest,
        sum(p + _INT32 for p in prios),
        len(c.victims),
        -earliest,  # the latest start among the most important victims wins
        c.node,
    )


def order(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Candidates best first, by kube-scheduler's ``pickOneNodeForPreemption`` criteria."""
    return sorted(candidates, key=rank)
