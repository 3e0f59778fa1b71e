"""The filter: does a pod fit a node, on which cards, and if not, why (hami-protocol.md sections 3, 10).

``place`` is pure. Per GPU container it computes the eligible cards (``cards`` gives every other
card exactly one reason, then the namespace quota), asks the card policy for ``count`` distinct
cards (per NUMA node under ``numa_bind``), and turns the choices into an allocation. Init
containers are each fit on the node as given (they run one at a time); app containers are fit
cumulatively, each seeing the cards the earlier ones took.

A failed node gets the dominant card reason(s) of its first failing container (the most frequent
card reason; ties all kept, in ``status.ALL_REASONS`` order). Node-level reasons come first: host
CPU and memory (only when the inventory tracks them), ``NODE_UNREGISTERED`` (no cards) and
``INSUFFICIENT_GPU_COUNT`` (fewer cards than asked). When enough cards are eligible but the card
policy refuses every choice, the reason is ``NUMA_UNSATISFIED`` under ``numa_bind`` (no NUMA node
has enough, tried in ascending id) and ``INSUFFICIENT_GPU_COUNT`` otherwise. The code:

* ``UNRESOLVABLE`` when the pod would not fit the same node even with all usage removed (and the
  namespace quota emptied): wrong type/UUID/NUMA/mode, unhealthy or cordoned cards, fewer cards
  than asked, an unregistered node, a request larger than a card, or a quota limit below it.
  Preemption cannot help.
* ``UNSCHEDULABLE`` otherwise (memory, cores, slots, exclusivity, quota now): freeing capacity could.

The second attempt on the emptied node runs only for failures, so it costs nothing on success.
"""

from __future__ import annotations

from typing import NamedTuple

from gpuslice.model import allocations, nodes, requests, status
from gpuslice.policy import cards, registry
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
    card_policy: registry.Policy,
    ctx: registry.Context = registry.EMPTY_CONTEXT,
    quota: quotas.QuotaView | None = None,
) -> Placement:
    """Fit the pod on the node: an allocation, or why not (see the module docstring)."""
    if quota is not None and quota.unlimited:
        quota = None
    out = _attempt(state, pod, card_policy, ctx, quota)
    if not isinstance(out, _Fail):
        return Placement(status.SUCCESS, out)
    empty = nodes.empty_state(state.inventory)
    again = _attempt(empty, pod, card_policy, ctx, None if quota is None else quota.cleared())
    code = status.Code.UNRESOLVABLE if isinstance(again, _Fail) else status.Code.UNSCHEDULABLE
    return Placement(status.Status(code, out.reasons), None, out.card_reasons)


def _attempt(
    state: nodes.NodeState,
    pod: requests.PodRequest,
    policy: registry.Policy,
    ctx: registry.Context,
    quota: quotas.QuotaView | None,
) -> allocations.PodAllocation | _Fail:
    inv = state.inventory
    if inv.cpu_milli > 0 and pod.cpu_milli > state.cpu_free_milli:
        return _Fail((status.INSUFFICIENT_CPU,))
    if inv.memory_mib > 0 and pod.memory_mib > state.memory_free_mib:
        return _Fail((status.INSUFFICIENT_HOST_MEMORY,))
    ndev = len(inv.devices)
    out: list[allocations.ContainerAllocation] = []
    app_state = state
    app_quota = quota
    last_gpu = max((k for k, c in enumerate(pod.containers) if c is not None and c.count > 0), default=-1)
    for position, req in enumerate(pod.containers):
        if req is None or req.count <= 0:
            out.append(())
            continue
        if ndev == 0:
            return _Fail((status.NODE_UNREGISTERED,))
        if req.count > ndev:
            return _Fail((status.INSUFFICIENT_GPU_COUNT,))
        is_init = position < pod.init_count
        here = state if is_init else app_state
        q = quota if is_init else app_quota
        got = _fit_container(here, req, pod.selectors, policy, ctx, q)
        if isinstance(got, _Fail):
            return got
        out.append(got)
        if not is_init and position < last_gpu:
            app_state = _take(app_state, got)
            if app_quota is not None:
                app_quota = app_quota.plus(
                    len(got), sum(g.memory_mib for g in got), sum(g.cores for g in got)
                )
    return allocations.PodAllocation(
        node=inv.name,
        containers=tuple(out),
        init_count=pod.init_count,
        cpu_milli=pod.cpu_milli if inv.cpu_milli > 0 else 0,
        memory_mib=pod.memory_mib if inv.memory_mib > 0 else 0,
    )


def _fit_container(
    state: nodes.NodeState,
    req: requests.ContainerRequest,
    sel: requests.Selectors,
    policy: registry.Policy,
    ctx: registry.Context,
    quota: quotas.QuotaView | None,
) -> allocations.ContainerAllocation | _Fail:
    inv = state.inventory
    devs = inv.devices
    usage = state.usage
    cores = req.cores_clamped
    exclusive = req.exclusive
    cordoned = inv.cordoned
    eligible: list[int] = []
    rejected: dict[str, int] = {}
    fixed = (
        req.memory_mib
        if req.memory_mib > 0 or req.memory_percentage == requests.MEMORY_PERCENTAGE_UNSET
        else None
    )
    for i, dev in enumerate(devs):
        memory = fixed if fixed is not None else req.memory_on(dev.memory_mib)
        reason = cards.static_reason(dev, cordoned, sel) or cards.capacity_reason(
            dev, usage[i], memory, cores, exclusive
        )
        if (
            reason is None
            and quota is not None
            and not quota.admits(req.count, req.count * memory, req.count * cores)
        ):
            reason = status.QUOTA_EXCEEDED
        if reason is None:
            eligible.append(i)
        else:
            rejected[reason] = rejected.get(reason, 0) + 1
    if len(eligible) < req.count:
        return _dominant(rejected)
    chosen = _choose(state, req, sel, policy, ctx, tuple(eligible))
    if chosen is None:
        reason = status.NUMA_UNSATISFIED if sel.numa_bind else status.INSUFFICIENT_GPU_COUNT
        return _Fail((reason,), _sorted(rejected))
    grants = tuple(
        allocations.DeviceGrant(devs[i].uuid, req.memory_on(devs[i].memory_mib), cores) for i in chosen
    )
    if quota is not None and not quota.admits(
        len(grants), sum(g.memory_mib for g in grants), len(grants) * cores
    ):
        return _Fail((status.QUOTA_EXCEEDED,), ((status.QUOTA_EXCEEDED, len(grants)),))
    return grants


def _choose(
    state: nodes.NodeState,
    req: requests.ContainerRequest,
    sel: requests.Selectors,
    policy: registry.Policy,
    ctx: registry.Context,
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
        u = usage[i]
        usage[i] = nodes.CardUsage(u.slots + 1, u.memory_mib + g.memory_mib, u.cores + g.cores)
    return nodes.NodeState(
        inventory=state.inventory,
        usage=tuple(usage),
        cpu_used_milli=state.cpu_used_milli,
        memory_used_mib=state.memory_used_mib,
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

    Init containers run one at a time, so the pod holds max(largest init container, app sum).
    """
    init_mem = init_cores = app_mem = app_cores = 0
    for position, req in enumerate(pod.containers):
        if req is None or req.count <= 0:
            continue
        mem = req.count * req.memory_on(card_memory_mib)
        cores = req.count * req.cores_clamped
        if position < pod.init_count:
            init_mem, init_cores = max(init_mem, mem), max(init_cores, cores)
        else:
            app_mem, app_cores = app_mem + mem, app_cores + cores
    return max(init_mem, app_mem), max(init_cores, app_cores)
