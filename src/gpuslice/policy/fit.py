"""The filter: does a pod fit a node, on which cards, and if not, why (docs/hami-compat.md sections 3, 10).

``place`` is pure. Per GPU container it computes the eligible cards (``cards`` gives every other
card exactly one reason, then the namespace quota), asks the card policy for ``count`` distinct
cards (per NUMA node under ``numa_bind``), and turns the choices into an allocation. Init
containers are each fit on the node as given (they run one at a time); app containers are fit
cumulatively, each seeing the cards the earlier ones took. Native sidecars (init containers with
``restartPolicy: Always``) keep running: they are placed cumulatively like app containers, and the
init containers after them see their cards taken. A card policy that admits only idle
cards (``mutex``, ``api.CardChooser.idle_only``) rejects cards in use before any capacity check. The
pod's ``hami.io/device-scoring-weights`` reach the card policy through ``Context.card_weights``.

The namespace quota is checked card by card with what the cache will charge for the whole pod
(``allocations.card_charge``: per card the larger of the init containers' peak and the app
containers' sum, plus the sidecars). A container's cost on a card is how much that card's charge
grows, so an init container of 5000 MiB on one card and an app container of 1500 MiB on another
cost 6500 MiB, while the same app container on the init container's card costs nothing more.

A failed node gets the dominant card reason(s) of its first failing container (the most frequent
card reason; ties all kept, in ``status.ALL_REASONS`` order). Node-level reasons come first:
``NODE_UNREGISTERED`` (no cards), host CPU and memory (only when the inventory tracks them) and
``INSUFFICIENT_GPU_COUNT`` (fewer cards than asked). When enough cards are eligible but the card
policy refuses every choice, the reason is ``NUMA_UNSATISFIED`` under ``numa_bind`` (no NUMA node
has enough, tried in ascending id) and ``INSUFFICIENT_GPU_COUNT`` otherwise. The code:

* ``UNRESOLVABLE`` when the pod would not fit the same node even with all usage removed (and the
  namespace quota emptied): wrong type/UUID/NUMA/mode, unhealthy or cordoned cards, fewer cards
  than asked, an unregistered node, a request larger than a card, or a quota limit below it.
  Preemption cannot help.
* ``UNSCHEDULABLE`` otherwise (memory, cores, slots, exclusivity, quota now): freeing capacity could.

The second attempt on the emptied node runs only for failures, so it costs nothing on success.

Cards in MIG mode (docs/mig.md) are judged by ``cards.mig_reason`` and give GPU instances
(``policy.mig``, by ``Context.mig_rule``): a container takes shared cards when enough of them pass
and MIG instances otherwise, several of which may share a card; a request for more cards than
the node has is then no ``INSUFFICIENT_GPU_COUNT`` (HAMi's ``isMIGRequest``).

A pod's ``hami.io/gpu-topology-requirement`` (``requests.TopologyRequirement``, docs/topology.md)
restricts each container asking for two or more cards to a set whose every pair qualifies
(``linkreq``). It is a filter on card *sets*: the card policy's favourite set of all eligible
cards is kept when it qualifies; otherwise the policy chooses again within each maximal
qualifying group of eligible cards (``linkreq.groups``, tightest group first) and the first choice
wins. Without any group of enough cards the container fails with ``NVLINK_REQUIRED`` or
``INSUFFICIENT_GPU_BANDWIDTH`` (``linkreq.reason``), counted against every eligible card; the
empty-node attempt makes it ``UNRESOLVABLE`` when no such group exists among the node's usable
cards at all, ``UNSCHEDULABLE`` when one would exist once capacity is freed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from gpuslice.model import allocations, devices, mig, nodes, requests, status
from gpuslice.policy import api, cards, linkreq
from gpuslice.policy import mig as migs
from gpuslice.policy import quota as quotas

CardReasons = tuple[tuple[str, int], ...]
_ORDER = {r: k for k, r in enumerate(status.ALL_REASONS)}


class Placement(NamedTuple):
    """The filter outcome for one node.

    Attributes:
        status: success, or the code and the dominant reasons.
        allocation: the cards per container on success, else None.
        card_reasons: for a failure, how many cards failed for each reason (in ``ALL_REASONS``
            order), to build HAMi-style messages such as ``1/2 InsufficientGPUMemory``.
    """

    status: status.Status
    allocation: allocations.PodAllocation | None
    card_reasons: CardReasons = ()


class _Fail(NamedTuple):
    reasons: tuple[str, ...]
    card_reasons: CardReasons = ()


def place(
    state: nodes.NodeState,
    pod: requests.PodRequest,
    card_policy: api.CardChooser,
    ctx: api.Context = api.EMPTY_CONTEXT,
    quota: quotas.QuotaView | None = None,
) -> Placement:
    """Fit the pod on the node: an allocation, or why not (see the module docstring)."""
    if quota is not None and quota.unlimited:
        quota = None
    if pod.scoring_weights is not None and ctx.card_weights != pod.scoring_weights:
        ctx = dataclasses.replace(ctx, card_weights=pod.scoring_weights)
    out = _attempt(state, pod, card_policy, ctx, quota)
    if not isinstance(out, _Fail):
        return Placement(status.SUCCESS, out)
    empty = nodes.empty_state(state.inventory)
    again = _attempt(empty, pod, card_policy, ctx, None if quota is None else quota.cleared())
    code = status.Code.UNRESOLVABLE if isinstance(again, _Fail) else status.Code.UNSCHEDULABLE
    return Placement(status.Status(code, out.reasons), None, out.card_reasons)


INIT, APP, SIDECAR = 0, 1, 2
"""What a container is to the charge: an init container, an app container, a native sidecar."""

_Entry = tuple[tuple[int, int], tuple[int, int, int], tuple[int, int, int]]
_NO_ENTRY: _Entry = ((0, 0), (0, 0, 0), (0, 0, 0))


class _Charge:
    """What the pod placed so far costs its namespace, card by card, as the cache will charge it.

    Per card: the init containers' peak, the app containers' sum and the sidecars' sum, combined
    by ``allocations.card_charge`` (the cache's rule). A container's cost on a card is what that
    card's charge grows by, so an app container on the card an init container used can cost
    nothing.
    """

    __slots__ = ("cards", "totals")

    def __init__(self) -> None:
        self.cards: dict[int, _Entry] = {}
        self.totals = (0, 0, 0)

    def cost(self, i: int, kind: int, memory: int, cores: int) -> tuple[int, int, int]:
        """How much card i's charge grows by one more grant of ``memory`` / ``cores``."""
        old = self.cards.get(i)
        after = _charged(_plus(old or _NO_ENTRY, kind, memory, cores))
        if old is None:
            return after
        before = _charged(old)
        return after[0] - before[0], after[1] - before[1], after[2] - before[2]

    def add(self, i: int, kind: int, memory: int, cores: int) -> None:
        """Record one grant on card i."""
        slots, mem, c = self.cost(i, kind, memory, cores)
        self.cards[i] = _plus(self.cards.get(i) or _NO_ENTRY, kind, memory, cores)
        t = self.totals
        self.totals = (t[0] + slots, t[1] + mem, t[2] + c)


def _plus(entry: _Entry, kind: int, memory: int, cores: int) -> _Entry:
    init, app, side = entry
    if kind == INIT:
        return (max(init[0], memory), max(init[1], cores)), app, side
    if kind == APP:
        return init, (app[0] + memory, app[1] + cores, app[2] + 1), side
    return init, app, (side[0] + memory, side[1] + cores, side[2] + 1)


def _charged(entry: _Entry) -> tuple[int, int, int]:
    u = allocations.card_charge(*entry)
    return u.slots, u.memory_mib, u.cores


def _attempt(
    state: nodes.NodeState,
    pod: requests.PodRequest,
    policy: api.CardChooser,
    ctx: api.Context,
    quota: quotas.QuotaView | None,
) -> allocations.PodAllocation | _Fail:
    inv = state.inventory
    if not inv.devices and pod.wants_gpu:
        return _Fail((status.NODE_UNREGISTERED,))  # what HAMi says of a node without cards
    if inv.cpu_milli > 0 and pod.cpu_milli > state.cpu_free_milli:
        return _Fail((status.INSUFFICIENT_CPU,))
    if inv.memory_mib > 0 and pod.memory_mib > state.memory_free_mib:
        return _Fail((status.INSUFFICIENT_HOST_MEMORY,))
    ndev = len(inv.devices)
    out: list[allocations.ContainerAllocation] = []
    running = state  # the node with the sidecars and app containers placed so far
    charge = _Charge() if quota is not None else None
    idle_only = policy.idle_only
    last_gpu = max((k for k, c in enumerate(pod.containers) if c is not None and c.count > 0), default=-1)
    link = pod.topology if pod.topology is not None and pod.topology.active else None
    for position, req in enumerate(pod.containers):
        if req is None or req.count <= 0:
            out.append(())
            continue
        if req.count > ndev and not _mig_request(inv, pod.selectors):
            return _Fail((status.INSUFFICIENT_GPU_COUNT,))  # MIG cards may give several instances
        kind = SIDECAR if position in pod.sidecars else INIT if position < pod.init_count else APP
        got = _fit_container(running, req, pod.selectors, policy, ctx, quota, charge, kind, idle_only, link)
        if isinstance(got, _Fail):
            return got
        out.append(got)
        if kind != INIT and position < last_gpu:
            running = _take(running, got)
    return allocations.PodAllocation(
        node=inv.name,
        containers=tuple(out),
        init_count=pod.init_count,
        sidecars=pod.sidecars,
        cpu_milli=pod.cpu_milli if inv.cpu_milli > 0 else 0,
        memory_mib=pod.memory_mib if inv.memory_mib > 0 else 0,
    )


class _Scan(NamedTuple):
    """One container's card checks on a node: the cards that pass, and why the others fail.

    Attributes:
        shared: eligible cards not in MIG mode.
        rejected: reason -> cards, of the cards not in MIG mode.
        costs: per eligible shared card, what it adds to the namespace's charge (with a quota).
        mig: eligible cards in MIG mode (a serving profile has a free placement).
        mig_rejected: reason -> cards, of the cards in MIG mode.
    """

    shared: list[int]
    rejected: dict[str, int]
    costs: dict[int, tuple[int, int, int]]
    mig: list[int]
    mig_rejected: dict[str, int]


def _scan(
    state: nodes.NodeState,
    req: requests.ContainerRequest,
    sel: requests.Selectors,
    charge: _Charge | None,
    kind: int,
    idle_only: bool,
) -> _Scan:
    """Every card of the node against one container (``cards`` on shared, ``cards.mig_reason`` on MIG)."""
    inv = state.inventory
    usage = state.usage
    cores = req.cores_clamped
    exclusive = req.exclusive
    cordoned = inv.cordoned
    out = _Scan([], {}, {}, [], {})
    fixed = (
        req.memory_mib
        if req.memory_mib > 0 or req.memory_percentage == requests.MEMORY_PERCENTAGE_UNSET
        else None
    )
    for i, dev in enumerate(inv.devices):
        memory = fixed if fixed is not None else req.memory_on(dev.memory_mib)
        reason = cards.static_reason(dev, cordoned, sel)
        if dev.is_mig:
            reason = reason or cards.mig_reason(dev, usage[i], memory, cores, idle_only)
            if reason is None:
                out.mig.append(i)
            else:
                out.mig_rejected[reason] = out.mig_rejected.get(reason, 0) + 1
            continue
        reason = reason or cards.capacity_reason(dev, usage[i], memory, cores, exclusive, idle_only)
        if reason is None:
            out.shared.append(i)
            if charge is not None:
                out.costs[i] = charge.cost(i, kind, memory, cores)
        else:
            out.rejected[reason] = out.rejected.get(reason, 0) + 1
    return out


def _fit_container(
    state: nodes.NodeState,
    req: requests.ContainerRequest,
    sel: requests.Selectors,
    policy: api.CardChooser,
    ctx: api.Context,
    quota: quotas.QuotaView | None,
    charge: _Charge | None,
    kind: int,
    idle_only: bool,
    link: requests.TopologyRequirement | None = None,
) -> allocations.ContainerAllocation | _Fail:
    devs = state.inventory.devices
    cores = req.cores_clamped
    so_far = None if quota is None or charge is None else quota.plus(*charge.totals)
    scan = _scan(state, req, sel, charge, kind, idle_only)
    eligible, rejected, costs = scan.shared, scan.rejected, scan.costs
    if scan.mig or scan.mig_rejected:
        # Shared cards serve the container when enough of them can; MIG instances otherwise.
        if len(eligible) < req.count and scan.mig:
            return _fit_mig(state, req, sel, policy, ctx, so_far, charge, kind, tuple(scan.mig), rejected)
        for r, n in scan.mig_rejected.items():
            rejected[r] = rejected.get(r, 0) + n
    if so_far is not None:
        eligible = _within_quota(so_far, eligible, costs, req.count, rejected)
    if len(eligible) < req.count:
        return _dominant(rejected)
    linked: _Linked | None = None
    if link is not None and req.count >= 2:
        ok, found = linkreq.groups(state, link, tuple(eligible), req.count)
        if not found:
            why = linkreq.reason(state, link, tuple(eligible), req.count)
            return _Fail((why,), _sorted({**rejected, why: len(eligible)}))
        linked = _Linked(ok, found)
    chosen = _choose_linked(state, req, sel, policy, ctx, tuple(eligible), linked)
    if chosen is None:
        reason = status.NUMA_UNSATISFIED if sel.numa_bind else status.INSUFFICIENT_GPU_COUNT
        return _Fail((reason,), _sorted(rejected))
    if so_far is not None and not so_far.admits(*_sum(costs[i] for i in chosen)):
        # The policy's favourite set costs too much; the cheapest cards may still fit.
        cheapest = tuple(
            sorted(eligible, key=lambda i: (costs[i][1], costs[i][2], costs[i][0], i))[: req.count]
        )
        chosen = None
        if so_far.admits(*_sum(costs[i] for i in cheapest)) and (
            linked is None or linkreq.satisfied(linked.ok, tuple(sorted(cheapest)))
        ):
            chosen = _choose(state, req, sel, policy, ctx, tuple(sorted(cheapest)))
        if chosen is None:
            return _Fail((status.QUOTA_EXCEEDED,), ((status.QUOTA_EXCEEDED, req.count),))
    grants = tuple(
        allocations.DeviceGrant(devs[i].uuid, req.memory_on(devs[i].memory_mib), cores) for i in chosen
    )
    if charge is not None:
        for i, g in zip(chosen, grants, strict=True):
            charge.add(i, kind, g.memory_mib, cores)
    return grants


def _mig_request(inv: nodes.NodeInventory, sel: requests.Selectors) -> bool:
    """HAMi's ``isMIGRequest``: the node has a MIG card and the pod does not rule MIG out."""
    return (sel.mode is None or devices.MODE_MIG in sel.mode) and any(d.is_mig for d in inv.devices)


def _fit_mig(
    state: nodes.NodeState,
    req: requests.ContainerRequest,
    sel: requests.Selectors,
    policy: api.CardChooser,
    ctx: api.Context,
    so_far: quotas.QuotaView | None,
    charge: _Charge | None,
    kind: int,
    eligible: tuple[int, ...],
    rejected: dict[str, int],
) -> allocations.ContainerAllocation | _Fail:
    """The container's GPU instances on the node's MIG cards (``policy.mig``), or why not.

    Under ``first-fit`` the card policy orders the cards (HAMi scans them in its card order); the
    fragmentation rule weighs every card itself. Several instances may share a card. The quota
    is checked with the profiles' memory and cores, which is what the cache will charge.
    """
    devs = state.inventory.devices
    fixed = (
        req.memory_mib
        if req.memory_mib > 0 or req.memory_percentage == requests.MEMORY_PERCENTAGE_UNSET
        else None
    )
    memory = [fixed if fixed is not None else req.memory_on(d.memory_mib) for d in devs]
    order: tuple[int, ...] | None = None
    if ctx.mig_rule == migs.FIRST_FIT:
        order = _card_order(state, req, sel, policy, ctx, eligible)
    got = migs.assign(state, req, eligible, memory, ctx, ctx.mig_rule, order)
    if got is None:
        rejected[status.MIG_PLACEMENT_INFEASIBLE] = rejected.get(status.MIG_PLACEMENT_INFEASIBLE, 0) + len(
            eligible
        )
        return _dominant(rejected)
    grants: list[allocations.DeviceGrant] = []
    for c in got:
        prof = mig.find(devs[c.card].mig_profiles, c.slice.profile)
        assert prof is not None  # assign only picks registered profiles
        grants.append(allocations.DeviceGrant(devs[c.card].uuid, prof.memory_mib, prof.cores, mig=c.slice))
    if so_far is not None and charge is not None:
        trial = _Charge()
        trial.cards = dict(charge.cards)
        trial.totals = charge.totals
        for c, g in zip(got, grants, strict=True):
            trial.add(c.card, kind, g.memory_mib, g.cores)
        t0, t1 = charge.totals, trial.totals
        if not so_far.admits(t1[0] - t0[0], t1[1] - t0[1], t1[2] - t0[2]):
            return _Fail((status.QUOTA_EXCEEDED,), ((status.QUOTA_EXCEEDED, req.count),))
        charge.cards, charge.totals = trial.cards, trial.totals
    return tuple(grants)


def _card_order(
    state: nodes.NodeState,
    req: requests.ContainerRequest,
    sel: requests.Selectors,
    policy: api.CardChooser,
    ctx: api.Context,
    eligible: tuple[int, ...],
) -> tuple[int, ...]:
    """The MIG cards in the card policy's order: its choice of one card, then of one of the rest."""
    one = msgspec.structs.replace(req, count=1)
    left = list(eligible)
    out: list[int] = []
    while left:
        got = _choose(state, one, msgspec.structs.replace(sel, numa_bind=False), policy, ctx, tuple(left))
        i = got[0] if got else left[0]
        out.append(i)
        left.remove(i)
    return tuple(out)


def _sum(costs: Iterable[tuple[int, int, int]]) -> tuple[int, int, int]:
    slots = memory = cores = 0
    for c in costs:
        slots, memory, cores = slots + c[0], memory + c[1], cores + c[2]
    return slots, memory, cores


def _within_quota(
    so_far: quotas.QuotaView,
    eligible: list[int],
    costs: dict[int, tuple[int, int, int]],
    count: int,
    rejected: dict[str, int],
) -> list[int]:
    """The eligible cards that could be part of a set of ``count`` the quota admits.

    A card qualifies when its own cost plus the ``count - 1`` smallest costs of the other eligible
    cards (each resource on its own, so a lower bound; missing others count like this card) stays
    within the quota. When every card costs the same this is exactly "``count`` such cards fit",
    as ``vectorfit`` judges it; the chosen set is checked exactly.
    """
    smallest = [sorted(c[k] for c in costs.values())[:count] for k in range(3)]
    kept: list[int] = []
    for i in eligible:
        own = costs[i]
        bound = []
        for k in range(3):
            others = list(smallest[k])
            if own[k] in others:
                others.remove(own[k])
            others = (others + [own[k]] * count)[: count - 1]  # too few others: as if like this one
            bound.append(own[k] + sum(others))
        if so_far.admits(bound[0], bound[1], bound[2]):
            kept.append(i)
        else:
            rejected[status.QUOTA_EXCEEDED] = rejected.get(status.QUOTA_EXCEEDED, 0) + 1
    return kept


class _Linked(NamedTuple):
    """A container's link requirement on a node: the pair table and the qualifying groups."""

    ok: tuple[tuple[bool, ...], ...]
    groups: list[tuple[int, ...]]


def _choose_linked(
    state: nodes.NodeState,
    req: requests.ContainerRequest,
    sel: requests.Selectors,
    policy: api.CardChooser,
    ctx: api.Context,
    eligible: tuple[int, ...],
    linked: _Linked | None,
) -> tuple[int, ...] | None:
    """``_choose``, restricted to qualifying sets when the container has a link requirement."""
    if linked is None:
        return _choose(state, req, sel, policy, ctx, eligible)
    if len(linked.groups) == 1 and linked.groups[0] == eligible:
        return _choose(state, req, sel, policy, ctx, eligible)  # every eligible set qualifies
    got = _choose(state, req, sel, policy, ctx, eligible)
    if got is not None and linkreq.satisfied(linked.ok, tuple(sorted(got))):
        return got
    for group in linked.groups:
        got = _choose(state, req, sel, policy, ctx, group)
        if got is not None:
            return got
    return None


def _choose(
    state: nodes.NodeState,
    req: requests.ContainerRequest,
    sel: requests.Selectors,
    policy: api.CardChooser,
    ctx: api.Context,
    eligible: tuple[int, ...],
) -> tuple[int, ...] | None:
    """Ask the card policy; under numa_bind, per NUMA node in ascending id until one accepts."""
    if not sel.numa_bind:
        return _checked(policy.choose_cards(state, req, eligible, ctx), req, eligible)
    devs = state.inventory.devices
    for numa in sorted({devs[i].numa for i in eligible}):
        group = tuple(i for i in eligible if devs[i].numa == numa)
        if len(group) >= req.count:
            got = _checked(policy.choose_cards(state, req, group, ctx), req, group)
            if got is not None:
                return got
    return None


def _checked(
    got: tuple[int, ...] | None, req: requests.ContainerRequest, eligible: tuple[int, ...]
) -> tuple[int, ...] | None:
    if got is None:
        return None
    if len(got) != req.count or len(set(got)) != len(got) or not set(got).issubset(eligible):
        raise ValueError(f"card policy returned {got} for {req.count} of {eligible}")
    return got


def _take(state: nodes.NodeState, grants: allocations.ContainerAllocation) -> nodes.NodeState:
    """The state with one app container's grants added (slots +1 per card)."""
    usage = list(state.usage)
    by_uuid = {d.uuid: i for i, d in enumerate(state.inventory.devices)}
    for g in grants:
        i = by_uuid[g.uuid]
        usage[i] = usage[i].plus(allocations.grant_usage(g))
    return nodes.NodeState(
        inventory=state.inventory,
        usage=tuple(usage),
        cpu_used_milli=state.cpu_used_milli,
        memory_used_mib=state.memory_used_mib,
        jobs=state.jobs,
    )


def _sorted(counts: dict[str, int]) -> CardReasons:
    return tuple(sorted(((r, n) for r, n in counts.items() if n > 0), key=lambda rn: _ORDER[rn[0]]))


def _dominant(rejected: dict[str, int]) -> _Fail:
    """The most frequent card reason(s), ties all kept, in ``ALL_REASONS`` order."""
    ordered = _sorted(rejected)
    top = max(n for _, n in ordered)
    return _Fail(tuple(r for r, n in ordered if n == top), ordered)


def demand(pod: requests.PodRequest, card_memory_mib: int) -> tuple[int, int]:
    """A pod's total GPU memory and cores if every card had ``card_memory_mib`` (for scoring).

    Init containers run one at a time, so the pod holds max(largest init container, app sum),
    plus its native sidecars, which run beside both.
    """
    init_mem = init_cores = app_mem = app_cores = side_mem = side_cores = 0
    for position, req in enumerate(pod.containers):
        if req is None or req.count <= 0:
            continue
        mem = req.count * req.memory_on(card_memory_mib)
        cores = req.count * req.cores_clamped
        if position in pod.sidecars:
            side_mem, side_cores = side_mem + mem, side_cores + cores
        elif position < pod.init_count:
            init_mem, init_cores = max(init_mem, mem), max(init_cores, cores)
        else:
            app_mem, app_cores = app_mem + mem, app_cores + cores
    return side_mem + max(init_mem, app_mem), side_cores + max(init_cores, app_cores)
