"""Why a pod does or does not fit, per node and per card, in an operator's words (docs/explain.md).

``explain`` is a pure function of a snapshot, like the filter. Each node's verdict (fits, code,
reasons) is ``fit.place``'s, called exactly as the filter's node-by-node path calls it
(``scheduling._filter_verbose``; the vectorised path is checked identical to it), and excluded,
invalid and unregistered nodes get the same reason codes as in ``scheduling.filter_nodes``. So the
nodes an explanation says fit are the filter's feasible nodes (before ``node_choice: extender``
narrows them to the one it answers).

Per card, the reason is the one ``policy.cards`` gives (HAMi's order: static reasons first, then
capacity; ``mig_reason`` on a card in MIG mode, whose ``mig`` part lists the instances held and
the free and stranded slices) for the container the node's verdict is about: the first GPU
container that does not fit, or the first GPU container when the pod fits. An app container after
others is judged on the node with the earlier app containers' cards taken, as ``fit`` places them.
A card that passes those checks but that the namespace quota rules out is marked ``QuotaExceeded``
(the costliest cards first, as many as ``fit`` counted). The cards the pod would get are those of
``fit.place``'s allocation.

A pod the cache holds (bound, or its bind in flight) is explained with its own charge released
(``Held``): its node's cards, host CPU and memory, and its namespace's quota usage, as if it were
not there. So its own cards do not count against it; the explanation names where it runs
(``bound_node``, ``bound_cards``) and on which nodes, its own included, it would fit now.

The smallest change is a sentence per failed node ("needs 8000 MiB per card, largest free is
6000 MiB on gpu-3 card 2") and one for the pod: the change of the node closest to fitting (a node
where freeing capacity could help before one where nothing can, then the smallest shortfall in
MiB or cores, then the node name).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

import msgspec

from gpuslice.codec import keys
from gpuslice.framework import cycle as cycles
from gpuslice.framework import gangs as gang_plans
from gpuslice.framework import profile as profiles
from gpuslice.framework import view
from gpuslice.model import allocations, devices, nodes, requests, status
from gpuslice.policy import api, cards, fit, linkreq
from gpuslice.policy import mig as migs
from gpuslice.policy import quota as quotas

FITS = "fits"
"""A card's reason when it can take the container."""
CODE_NAMES = {
    status.Code.SUCCESS: "Success",
    status.Code.ERROR: "Error",
    status.Code.UNSCHEDULABLE: "Unschedulable",
    status.Code.UNRESOLVABLE: "UnschedulableAndUnresolvable",
}
"""kube-scheduler's names of the codes (``framework/interface.go``)."""
_FAR = 1 << 62  # the shortfall of a change that is not counted in MiB or cores


class Ask(msgspec.Struct, frozen=True, kw_only=True):
    """What one GPU container asks of each of its cards.

    Attributes:
        container: position in the pod (init containers first).
        kind: ``init``, ``app`` or ``sidecar``.
        count: cards.
        memory_mib: MiB per card (0 when given as a percentage).
        memory_percent: percent of each card's memory, or None.
        cores: percent of each card's cores (clamped to 100, as fit uses it).
    """

    container: int
    kind: str
    count: int
    memory_mib: int
    memory_percent: int | None
    cores: int


class Instance(msgspec.Struct, frozen=True):
    """A GPU instance held on a MIG card: its profile and the memory slices it covers."""

    profile: str
    start: int
    size: int


class Mig(msgspec.Struct, frozen=True, kw_only=True):
    """A card in MIG mode as the explained container sees it (``policy.mig.card_slices``).

    Attributes:
        instances: the instances held, by start.
        slices_total: its memory slices.
        slices_free: those no instance holds (all held when a holder's placement is unknown).
        slices_stranded: of the free ones, those no free placement of a profile the workload
            asks for covers (weighted by demand, so possibly fractional; ``policy.mig.stranded``).
    """

    instances: tuple[Instance, ...]
    slices_total: int
    slices_free: int
    slices_stranded: float


class Card(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One card of a node as the explained container sees it.

    Attributes:
        index: the card's NVML index on its node.
        uuid: its UUID.
        model: its registered type.
        numa: its NUMA node.
        mode: ``hami-core``, ``mig`` or ``mps``.
        reason: ``fits`` or the reason code it cannot take the container.
        chosen: True for the cards the pod would get.
        memory_free_mib: free MiB (with the earlier containers' cards taken).
        memory_total_mib: registered MiB.
        cores_free: free cores (percent).
        cores_total: registered cores.
        slots_free: free task slots.
        slots_total: task slots.
        mig: on a card in MIG mode, its instances and slices (None otherwise; omitted in JSON).
    """

    index: int
    uuid: str
    model: str
    numa: int
    mode: str
    reason: str
    chosen: bool
    memory_free_mib: int
    memory_total_mib: int
    cores_free: int
    cores_total: int
    slots_free: int
    slots_total: int
    mig: Mig | None = None


class Node(msgspec.Struct, frozen=True, kw_only=True):
    """One node's verdict.

    Attributes:
        name: node name.
        fits: True when the filter would pass it.
        code: kube-scheduler's name of the outcome (``CODE_NAMES``).
        reasons: the reason codes (empty when it fits).
        card_reasons: how many cards failed for each reason, from ``fit.place``.
        container: the container the cards are judged for (None: no card was judged).
        cards: every card of the node.
        change: the smallest change that would make the pod fit here ('' when it fits).
    """

    name: str
    fits: bool
    code: str
    reasons: tuple[str, ...] = ()
    card_reasons: tuple[tuple[str, int], ...] = ()
    container: int | None = None
    cards: tuple[Card, ...] = ()
    change: str = ""


class Quota(msgspec.Struct, frozen=True, kw_only=True):
    """The namespace's GPU quota and what it uses (limits None: unlimited)."""

    count_limit: int | None
    memory_limit_mib: int | None
    cores_limit: int | None
    used_count: int
    used_memory_mib: int
    used_cores: int


class Held(msgspec.Struct, frozen=True, kw_only=True):
    """What the cache charges a pod it holds (bound, or its bind in flight); ``explain`` releases it.

    Attributes:
        node: the node it holds cards on.
        cards: the card UUIDs of its allocation, in allocation order, each once.
        reservation: its charge per card UUID, as the cache holds it (``allocations.card_reservation``).
        cpu_milli: host CPU it holds where the node tracks it.
        memory_mib: host memory it holds where the node tracks it.
    """

    node: str
    cards: tuple[str, ...]
    reservation: tuple[tuple[str, nodes.CardUsage], ...]
    cpu_milli: int = 0
    memory_mib: int = 0


class Gang(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The pod's gang (docs/gangs.md): its plan, who waits at the barrier, and what it says.

    Attributes:
        gang: ``namespace/name``.
        source: how the pod names it (``model.gangs.SOURCE_*``).
        minimum: members placed together (0: its group object was not seen).
        plan: the plan holding the gang's cards, None when it has none now.
        waiting: members whose bind waits at the barrier now.
        note: the gang's answer to the pod's last filter (why it is refused, or its slot).
    """

    gang: str
    source: str
    minimum: int
    plan: gang_plans.PlanView | None = None
    waiting: tuple[str, ...] = ()
    note: str = ""


class Explanation(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Why a pod fits or not, node by node (``--json`` and ``/explain`` return this document).

    Attributes:
        namespace: pod namespace.
        name: pod name.
        uid: pod UID.
        asks: what each GPU container asks.
        selectors: the card selectors.
        quota: the namespace quota, None when unlimited.
        nodes: every node explained, by name.
        feasible: the nodes it fits.
        summary: ``fits on 2 of 3 nodes`` and the like.
        change: the smallest change that would make it fit ('' when it fits somewhere).
        bound_node: the node a held pod runs on ('' for a pod the cache does not hold: left out
            of the JSON then, as ``bound_cards``).
        bound_cards: the card UUIDs it holds there, in allocation order.
        gang: the pod's gang, None when it belongs to none.
    """

    namespace: str
    name: str
    uid: str
    asks: tuple[Ask, ...]
    selectors: requests.Selectors
    quota: Quota | None
    nodes: tuple[Node, ...]
    feasible: tuple[str, ...]
    summary: str
    change: str
    bound_node: str = ""
    bound_cards: tuple[str, ...] = ()
    gang: Gang | None = None


def gang_part(
    pod: requests.PodRequest,
    plans: gang_plans.Gangs,
    now: float,
    note: str = "",
) -> Gang | None:
    """The pod's gang as explain shows it, None for a pod of no gang."""
    ref = pod.gang
    if ref is None:
        return None
    spec = plans.directory.spec(ref)
    plan = plans.view(ref.key, now)
    waiting = () if plan is None else tuple(sorted(s.member for s in plan.slots if s.state == "waiting"))
    return Gang(
        gang=ref.key,
        source=ref.source,
        minimum=0 if spec is None else spec.min_member,
        plan=plan,
        waiting=waiting,
        note=note,
    )


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Explanation)


def encode(explanation: Explanation) -> bytes:
    """The explanation as JSON."""
    return _ENCODER.encode(explanation)


def decode(data: bytes) -> Explanation:
    """An explanation from JSON (raises ``msgspec.DecodeError`` / ``ValidationError``)."""
    return _DECODER.decode(data)


def explain(
    snap: view.Snapshot,
    pod: requests.PodRequest,
    profile: profiles.Profile,
    invalid: Collection[str] | Mapping[str, str] = (),
    excluded: Mapping[str, str] | None = None,
    names: Sequence[str] | None = None,
    held: Held | None = None,
) -> Explanation:
    """Explain the pod on ``names`` (default: every registered, invalid and excluded node).

    Args:
        snap: the cache snapshot the filter would read.
        pod: the pod's request.
        profile: the extender's profile (the pod's card rule decides the cards; ``cycle.Cycle``).
        invalid: nodes whose registration does not decode (a mapping gives the reason too).
        excluded: nodes not to place on now -> reason code (stale handshake, held lock).
        names: the nodes to explain, in this order; a name the snapshot lacks is unregistered.
        held: the pod's own charge when the cache holds it; every node and the quota are judged
            with it released.
    """
    excluded = excluded or {}
    if names is None:
        names = sorted(set(snap.nodes) | set(invalid) | set(excluded))
    cyc = cycles.Cycle.of(profile, snap, pod)
    quota = cyc.quota
    own: dict[str, nodes.NodeState] = {}
    if held is not None:
        state = view.node_state(snap, held.node)
        if state is not None:
            own[held.node] = nodes.released(state, held.reservation, held.cpu_milli, held.memory_mib)
        if quota is not None:
            quota = _quota_released(quota, held)
    out: list[Node] = []
    shortfalls: dict[str, tuple[int, int]] = {}
    if pod.wants_gpu:
        for name in names:
            node, shortfall = _node(snap, own, name, pod, cyc.cards, cyc.ctx, quota, invalid, excluded)
            out.append(node)
            if not node.fits:
                shortfalls[name] = shortfall
    else:
        out = [Node(name=n, fits=True, code=CODE_NAMES[status.Code.SUCCESS]) for n in names]
    feasible = tuple(n.name for n in out if n.fits)
    change = ""
    if not feasible and shortfalls:
        best = min(shortfalls, key=lambda n: (*shortfalls[n], n))
        change = next(n.change for n in out if n.name == best)
        quota_bound = [n for n in out if any(r == status.QUOTA_EXCEEDED for r, _ in n.card_reasons)]
        if quota is not None and quota_bound and not change.startswith("namespace quota"):
            # The quota holds on every node: any other change would still leave it exceeded.
            state = view.node_state(snap, quota_bound[0].name)
            card_memory = state.inventory.devices[0].memory_mib if state and state.inventory.devices else 0
            change = _quota_sentence(pod, quota, card_memory)
    fits = f"{len(feasible)} of {len(out)} nodes" if feasible else f"none of {len(out)} nodes"
    if held is not None:
        label = "card" if len(held.cards) == 1 else "cards"
        summary = (
            f"bound to {held.node} on {label} {', '.join(held.cards)}; "
            f"with its own cards free it would fit on {fits}"
        )
    elif not pod.wants_gpu:
        summary = "asks no GPU: the extender passes every node"
    else:
        summary = f"fits on {fits}"
    return Explanation(
        namespace=pod.namespace,
        name=pod.name,
        uid=pod.uid,
        asks=_asks(pod),
        selectors=pod.selectors,
        quota=None if quota is None else _quota(quota),
        nodes=tuple(out),
        feasible=feasible,
        summary=summary,
        change=change,
        bound_node="" if held is None else held.node,
        bound_cards=() if held is None else held.cards,
    )


def _kind(pod: requests.PodRequest, position: int) -> str:
    if position in pod.sidecars:
        return "sidecar"
    return "init" if position < pod.init_count else "app"


def _asks(pod: requests.PodRequest) -> tuple[Ask, ...]:
    return tuple(
        Ask(
            container=k,
            kind=_kind(pod, k),
            count=c.count,
            memory_mib=c.memory_mib,
            memory_percent=None
            if c.memory_mib > 0 or c.memory_percentage == requests.MEMORY_PERCENTAGE_UNSET
            else c.memory_percentage,
            cores=c.cores_clamped,
        )
        for k, c in enumerate(pod.containers)
        if c is not None and c.count > 0
    )


def _quota_released(q: quotas.QuotaView, held: Held) -> quotas.QuotaView:
    """The namespace's usage without the held pod's charge (``allocations.charge_totals``)."""
    count = sum(r.slots for _, r in held.reservation)
    memory = sum(r.memory_mib for _, r in held.reservation)
    cores = sum(r.cores for _, r in held.reservation)
    return msgspec.structs.replace(
        q,
        used_count=max(0, q.used_count - count),
        used_memory=max(0, q.used_memory - memory),
        used_cores=max(0, q.used_cores - cores),
    )


def _quota(q: quotas.QuotaView) -> Quota:
    return Quota(
        count_limit=q.count_limit,
        memory_limit_mib=q.memory_limit,
        cores_limit=q.cores_limit,
        used_count=q.used_count,
        used_memory_mib=q.used_memory,
        used_cores=q.used_cores,
    )


# ----- one node


def _node(
    snap: view.Snapshot,
    own: Mapping[str, nodes.NodeState],
    name: str,
    pod: requests.PodRequest,
    card_policy: api.CardChooser,
    ctx: api.Context,
    quota: quotas.QuotaView | None,
    invalid: Collection[str] | Mapping[str, str],
    excluded: Mapping[str, str],
) -> tuple[Node, tuple[int, int]]:
    """A node's verdict and how far it is from fitting (code rank, shortfall).

    ``own``: the held pod's node with its charge released, read instead of the snapshot's.
    """
    state = own.get(name) or view.node_state(snap, name)
    if name in excluded:  # the filter fails it before evaluating (FailedNodes: Unschedulable)
        reason = excluded[name]
        shown = () if state is None else _cards(state, state, None, pod.selectors, (), {}, ctx.workload)
        node = Node(
            name=name,
            fits=False,
            code=CODE_NAMES[status.Code.UNSCHEDULABLE],
            reasons=(reason,),
            cards=shown,
            change=_node_sentence(name, reason, ""),
        )
        return node, (0, _FAR)
    if state is None:
        reason = view.node_problem(name, invalid)
        why = invalid.get(name, "") if isinstance(invalid, Mapping) else ""
        node = Node(
            name=name,
            fits=False,
            code=CODE_NAMES[status.Code.UNRESOLVABLE],
            reasons=(reason,),
            change=_node_sentence(name, reason, why),
        )
        return node, (1, _FAR)
    placement = fit.place(state, pod, card_policy, ctx, quota)
    chosen: set[str] = set()
    if placement.allocation is not None:
        chosen = {g.uuid for grants in placement.allocation.containers for g in grants}
    focus, running = _focus(state, pod, card_policy, ctx, quota, placement)
    req = None if focus is None else pod.containers[focus]
    idle_only = card_policy.idle_only
    reasons = _card_reasons(running, req, pod.selectors, idle_only, placement)
    shown = _cards(state, running, req, pod.selectors, reasons, chosen, ctx.workload)
    st = placement.status
    if st.ok:
        node = Node(
            name=name,
            fits=True,
            code=CODE_NAMES[status.Code.SUCCESS],
            container=focus,
            cards=shown,
        )
        return node, (0, 0)
    said = st.reasons
    if any(r == status.QUOTA_EXCEEDED for r, _ in placement.card_reasons):
        said = (status.QUOTA_EXCEEDED, *said)  # cards that had room were refused by the quota
    change, shortfall = _change(running, pod, req, said, shown, quota, card_policy)
    node = Node(
        name=name,
        fits=False,
        code=CODE_NAMES[st.code],
        reasons=st.reasons,
        card_reasons=placement.card_reasons,
        container=focus,
        cards=shown,
        change=change,
    )
    return node, (0 if st.code is status.Code.UNSCHEDULABLE else 1, shortfall)


def _focus(
    state: nodes.NodeState,
    pod: requests.PodRequest,
    card_policy: api.CardChooser,
    ctx: api.Context,
    quota: quotas.QuotaView | None,
    placement: fit.Placement,
) -> tuple[int | None, nodes.NodeState]:
    """The container the cards are judged for, and the node as that container sees it.

    On success the first GPU container on the node as is. On failure the first GPU container
    whose prefix of the pod (the containers before it and itself) ``fit.place`` refuses; the
    node then carries the app containers and sidecars placed before it, as ``fit`` runs them.
    """
    gpu = [k for k, c in enumerate(pod.containers) if c is not None and c.count > 0]
    if not gpu:
        return None, state
    if placement.status.ok or len(gpu) == 1:
        return gpu[0], state
    before: fit.Placement | None = None
    for k in gpu:
        blanked = (None,) * (len(pod.containers) - k - 1)
        prefix = msgspec.structs.replace(pod, containers=pod.containers[: k + 1] + blanked)
        got = fit.place(state, prefix, card_policy, ctx, quota)
        if not got.status.ok:
            return k, _with_grants(state, pod, before, k)
        before = got
    return gpu[-1], _with_grants(state, pod, before, gpu[-1])


def _with_grants(
    state: nodes.NodeState, pod: requests.PodRequest, before: fit.Placement | None, upto: int
) -> nodes.NodeState:
    """The node with the app containers' and sidecars' grants before ``upto`` taken (a slot each)."""
    if before is None or before.allocation is None:
        return state
    usage = list(state.usage)
    by_uuid = {d.uuid: i for i, d in enumerate(state.inventory.devices)}
    for k, grants in enumerate(before.allocation.containers[:upto]):
        if _kind(pod, k) == "init":
            continue
        for g in grants:
            i = by_uuid[g.uuid]
            usage[i] = usage[i].plus(allocations.grant_usage(g))
    return msgspec.structs.replace(state, usage=tuple(usage))


def _card_reasons(
    state: nodes.NodeState,
    req: requests.ContainerRequest | None,
    sel: requests.Selectors,
    idle_only: bool,
    placement: fit.Placement,
) -> tuple[str, ...]:
    """Each card's reason for ``req`` (``policy.cards``), with the quota's rejections marked."""
    inv = state.inventory
    if req is None:
        return tuple(FITS for _ in inv.devices)
    out: list[str] = []
    for i, dev in enumerate(inv.devices):
        memory = req.memory_on(dev.memory_mib)
        if dev.is_mig:  # as fit judges a MIG card: MigPlacementInfeasible when no profile fits
            capacity = cards.mig_reason(dev, state.usage[i], memory, req.cores_clamped, idle_only)
        else:
            capacity = cards.capacity_reason(
                dev, state.usage[i], memory, req.cores_clamped, req.exclusive, idle_only
            )
        reason = cards.static_reason(dev, inv.cordoned, sel) or capacity
        out.append(reason or FITS)
    if placement.status.ok:
        return tuple(out)
    eligible = [i for i, r in enumerate(out) if r == FITS]
    if status.QUOTA_EXCEEDED in placement.status.reasons:
        marked = len(eligible)
    else:
        marked = dict(placement.card_reasons).get(status.QUOTA_EXCEEDED, 0)
    if marked:
        devs = inv.devices
        costly = sorted(eligible, key=lambda i: (-req.memory_on(devs[i].memory_mib), i))[:marked]
        for i in costly:
            out[i] = status.QUOTA_EXCEEDED
    return tuple(out)


def _cards(
    state: nodes.NodeState,
    running: nodes.NodeState,
    req: requests.ContainerRequest | None,
    sel: requests.Selectors,
    reasons: Sequence[str],
    chosen: Collection[str],
    workload: api.Workload | None = None,
) -> tuple[Card, ...]:
    out = []
    for i, dev in enumerate(state.inventory.devices):
        out.append(
            Card(
                index=dev.index,
                uuid=dev.uuid,
                model=dev.type,
                numa=dev.numa,
                mode=dev.mode,
                reason=reasons[i] if reasons else FITS,
                chosen=dev.uuid in chosen,
                memory_free_mib=running.free_memory(i),
                memory_total_mib=dev.memory_mib,
                cores_free=running.free_cores(i),
                cores_total=dev.cores,
                slots_free=running.free_slots(i),
                slots_total=dev.split_count,
                mig=_mig(dev, running.usage[i], workload) if dev.is_mig else None,
            )
        )
    return tuple(out)


def _mig(dev: devices.GpuDevice, usage: nodes.CardUsage, workload: api.Workload | None) -> Mig:
    sl = migs.card_slices(dev, usage, workload)
    return Mig(
        instances=tuple(Instance(m.profile, m.start, m.size) for m in usage.mig),
        slices_total=sl.total,
        slices_free=sl.free,
        slices_stranded=round(sl.stranded, 2),
    )


# ----- sentences


def _node_sentence(name: str, reason: str, why: str) -> str:
    """The change for a node-level reason."""
    if reason == status.NODE_UNREGISTERED:
        return f"{name} has no GPU registration ({keys.NODE_REGISTER}): no device plugin registered cards"
    if reason == status.NODE_REGISTRATION_INVALID:
        detail = f": {why}" if why else ""
        return f"{name}'s GPU registration ({keys.NODE_REGISTER}) does not decode{detail}"
    if reason == status.NODE_HANDSHAKE_STALE:
        return f"{name}'s device plugin stopped reporting (stale {keys.NODE_HANDSHAKE}); restart it"
    if reason == status.NODE_LOCK_HELD:
        return f"{name}'s HAMi node lock ({keys.NODE_LOCK}) is held by a stuck allocation until it expires"
    if reason == status.NODE_ALLOCATE_STALLED:
        return f"{name}'s device plugin left an Allocate unanswered; no pods until it answers or cools off"
    return f"{name}: {reason}"


def _cardlist(node: str, idx: Sequence[int]) -> str:
    label = "card" if len(idx) == 1 else "cards"
    return f"{node} {label} {', '.join(str(i) for i in idx)}"


def _change(
    state: nodes.NodeState,
    pod: requests.PodRequest,
    req: requests.ContainerRequest | None,
    reasons: Sequence[str],
    shown: Sequence[Card],
    quota: quotas.QuotaView | None,
    card_policy: api.CardChooser,
) -> tuple[str, int]:
    """The sentence and shortfall for a node's first reason."""
    name = state.name
    reason = reasons[0] if reasons else status.INVALID_REQUEST
    if status.QUOTA_EXCEEDED in reasons:
        reason = status.QUOTA_EXCEEDED  # the namespace's limit binds on every node: say it first
    inv = state.inventory
    if reason in (status.NODE_UNREGISTERED,):
        return _node_sentence(name, reason, ""), _FAR
    if reason == status.INSUFFICIENT_CPU:
        return f"needs {pod.cpu_milli}m CPU, {name} has {state.cpu_free_milli}m free", _FAR
    if reason == status.INSUFFICIENT_HOST_MEMORY:
        return f"needs {pod.memory_mib} MiB host memory, {name} has {state.memory_free_mib} MiB free", _FAR
    if req is None:
        return f"{name}: {reason}", _FAR
    count = req.count
    if reason == status.INSUFFICIENT_GPU_COUNT:
        if count > len(inv.devices):
            return f"needs {count} cards, {name} has {len(inv.devices)}", _FAR
        usable = sum(1 for c in shown if c.reason == FITS)
        return (
            f"needs {count} cards, card policy {card_policy.name} "
            f"takes no set of the {usable} usable on {name}",
            _FAR,
        )
    same = [c for c in shown if c.reason == reason]
    idx = [c.index for c in same]
    if reason == status.INSUFFICIENT_GPU_MEMORY:
        return _memory(name, req, shown)
    if reason == status.INSUFFICIENT_GPU_CORES:
        candidates = [c for c in shown if c.reason in (FITS, status.INSUFFICIENT_GPU_CORES)]
        best = _nth_best(candidates, count, lambda c: c.cores_free)
        if best is None:
            return f"needs {req.cores_clamped} % cores on {count} cards of {name}", _FAR
        head = f"needs {req.cores_clamped} % cores per card"
        if count == 1:
            return f"{head}, most free is {best.cores_free} % on {name} card {best.index}", (
                req.cores_clamped - best.cores_free
            )
        ok = sum(1 for c in candidates if c.reason == FITS)
        return (
            f"{head} on {count} cards, {ok} have it free; "
            f"next most is {best.cores_free} % on {name} card {best.index}",
            req.cores_clamped - best.cores_free,
        )
    if reason == status.MIG_PLACEMENT_INFEASIBLE:
        return _mig_sentence(state, req, same), _FAR
    if reason == status.GPU_SLOTS_EXHAUSTED:
        return (
            f"needs a free task slot on {count} card(s), every slot is taken on {_cardlist(name, idx)}",
            _FAR,
        )
    if reason == status.EXCLUSIVE_CONFLICT:
        if req.exclusive:
            return f"needs a whole card (100 % cores) nobody uses, {_cardlist(name, idx)} in use", _FAR
        if card_policy.idle_only:
            return (
                f"card policy {card_policy.name} takes only idle cards, {_cardlist(name, idx)} in use",
                _FAR,
            )
        return f"{_cardlist(name, idx)} held whole by a 100 % cores task", _FAR
    if reason == status.DEVICE_TYPE_MISMATCH:
        return _type_sentence(pod.selectors, same), _FAR
    if reason == status.UUID_FILTERED:
        sel = pod.selectors
        if sel.use_uuids:
            return f"{_cardlist(name, idx)} excluded by {keys.USE_GPU_UUID}={','.join(sel.use_uuids)}", _FAR
        return f"{_cardlist(name, idx)} excluded by {keys.NOUSE_GPU_UUID}={','.join(sel.nouse_uuids)}", _FAR
    if reason == status.DEVICE_UNHEALTHY:
        return f"{_cardlist(name, idx)} unhealthy", _FAR
    if reason == status.DEVICE_CORDONED:
        return f"{_cardlist(name, idx)} cordoned ({keys.DEVICE_CORDON})", _FAR
    if reason == status.NUMA_UNSATISFIED:
        sel = pod.selectors
        if sel.numa_node is not None and same:
            where = ",".join(str(n) for n in sorted({c.numa for c in same}))
            return (
                f"{keys.NUMA_HINT}={sel.numa_node} asks NUMA node {sel.numa_node}, "
                f"{name} has cards on {where}",
                _FAR,
            )
        per: dict[int, int] = {}
        for c in shown:
            if c.reason == FITS:
                per[c.numa] = per.get(c.numa, 0) + 1
        most = max(per.values(), default=0)
        return (
            f"needs {count} cards on one NUMA node ({keys.NUMA_BIND}), at most {most} usable on {name}",
            _FAR,
        )
    if reason == status.QUOTA_EXCEEDED and quota is not None:
        return _quota_sentence(pod, quota, inv.devices[0].memory_mib if inv.devices else 0), _FAR // 2
    if reason in (status.NVLINK_REQUIRED, status.INSUFFICIENT_GPU_BANDWIDTH) and pod.topology is not None:
        return _link_sentence(state, pod.topology, count, shown), _FAR
    return f"{name}: {reason}", _FAR


def _link_sentence(
    state: nodes.NodeState, link: requests.TopologyRequirement, count: int, shown: Sequence[Card]
) -> str:
    """The largest group of usable cards that meets the link requirement, against what is asked."""
    position = {d.index: p for p, d in enumerate(state.inventory.devices)}
    usable = tuple(sorted(position[c.index] for c in shown if c.reason == FITS and c.index in position))
    found = linkreq.cliques(linkreq.pairs(state, link), usable, 1) if usable else []
    best = max(found, key=len, default=())
    wants = []
    if link.require_nvlink:
        wants.append("NVLink")
    if link.min_bandwidth_gbps > 0:
        wants.append(f"at least {link.min_bandwidth_gbps:g} GB/s")
    indices = [state.inventory.devices[p].index for p in best]
    group = f"{len(best)} ({_cardlist(state.name, indices)})" if len(best) > 1 else "1"
    return (
        f"needs {count} cards linked pairwise by {' and '.join(wants)} ({keys.GPU_TOPOLOGY_REQUIREMENT}), "
        f"the largest such group of usable cards on {state.name} is {group}"
    )


def _mig_sentence(state: nodes.NodeState, req: requests.ContainerRequest, same: Sequence[Card]) -> str:
    """No free placement of a profile large enough: which profiles serve, and the free slices."""
    by_uuid = {d.uuid: d for d in state.inventory.devices}
    first = by_uuid.get(same[0].uuid) if same else None
    served = ""
    if first is not None:
        memory = req.memory_on(first.memory_mib)
        names = [first.mig_profiles[k].name for k in migs.candidates(first, memory)]
        served = f" ({', '.join(names)})" if names else ""
    free = ", ".join(
        f"card {c.index} {c.mig.slices_free}/{c.mig.slices_total}" for c in same if c.mig is not None
    )
    return (
        f"needs a free placement of a MIG profile that serves the request{served}, "
        f"none is free on {_cardlist(state.name, [c.index for c in same])} (free slices: {free})"
    )


def _nth_best(candidates: Sequence[Card], count: int, key: Callable[[Card], int]) -> Card | None:
    """The card ranked ``count``-th by ``key``, largest first: the one that must grow for ``count`` to fit."""
    ranked = sorted(candidates, key=lambda c: (-key(c), c.index))
    return ranked[count - 1] if len(ranked) >= count else (ranked[-1] if ranked else None)


def _memory(name: str, req: requests.ContainerRequest, shown: Sequence[Card]) -> tuple[str, int]:
    """The memory sentence: the largest free memory against what is asked per card."""
    count = req.count
    passing = (FITS, status.INSUFFICIENT_GPU_MEMORY, status.QUOTA_EXCEEDED)
    candidates = sorted(
        (c for c in shown if c.reason in passing), key=lambda c: (-c.memory_free_mib, c.index)
    )[:count]
    if not candidates:
        return f"needs {req.memory_mib} MiB on {count} cards of {name}", _FAR
    last = candidates[-1]
    need = req.memory_on(last.memory_total_mib)
    pct = req.memory_percentage
    if req.memory_mib > 0 or pct == requests.MEMORY_PERCENTAGE_UNSET:
        head = f"needs {need} MiB per card"
    else:
        head = f"needs {pct} % of a card's memory ({need} MiB on {name} card {last.index})"
    short = need - last.memory_free_mib if len(candidates) == count else _FAR
    if count == 1 and need > last.memory_total_mib:  # even emptied, no card is that large
        return (
            f"{head}, largest free is {last.memory_free_mib} MiB on {name} card {last.index}, "
            f"a card of {last.memory_total_mib} MiB",
            short,
        )
    if count == 1:
        return f"{head}, largest free is {last.memory_free_mib} MiB on {name} card {last.index}", short
    frees = ", ".join(str(c.memory_free_mib) for c in candidates)
    where = _cardlist(name, [c.index for c in candidates])
    return f"{head} on {count} cards, the largest free are {frees} MiB on {where}", short


def _type_sentence(sel: requests.Selectors, same: Sequence[Card]) -> str:
    """Why the cards' type or mode is excluded (the check ``cards.static_reason`` makes first)."""
    by_type = [c for c in same if (sel.use_types or sel.nouse_types) and not cards.type_matches(c.model, sel)]
    if by_type:
        types = sorted({c.model for c in by_type})
        label = "card type" if len(types) == 1 else "card types"
        if sel.use_types and not any(u.lower() in t.lower() for t in types for u in sel.use_types if u):
            return f"{label} {', '.join(types)} excluded by {keys.USE_GPU_TYPE}={','.join(sel.use_types)}"
        return f"{label} {', '.join(types)} excluded by {keys.NOUSE_GPU_TYPE}={','.join(sel.nouse_types)}"
    modes = sorted({c.mode for c in same})
    label = "card mode" if len(modes) == 1 else "card modes"
    return f"{label} {', '.join(modes)} excluded by {keys.VGPU_MODE}={sel.mode}"


def _pod_count(pod: requests.PodRequest) -> int:
    """Cards the pod holds at once: the largest init container's or all app containers', plus sidecars."""
    init = app = side = 0
    for k, c in enumerate(pod.containers):
        if c is None or c.count <= 0:
            continue
        kind = _kind(pod, k)
        if kind == "init":
            init = max(init, c.count)
        elif kind == "app":
            app += c.count
        else:
            side += c.count
    return side + max(init, app)


def _quota_sentence(pod: requests.PodRequest, quota: quotas.QuotaView, card_memory: int) -> str:
    memory, cores = fit.demand(pod, card_memory)
    count = _pod_count(pod)
    checks = (
        ("cards", "cards", quota.count_limit, quota.used_count, count),
        ("MiB", "GPU memory", quota.memory_limit, quota.used_memory, memory),
        ("% cores", "GPU cores", quota.cores_limit, quota.used_cores, cores),
    )
    for unit, what, limit, used, need in checks:
        if limit is None:
            continue
        if limit <= 0:
            return f"namespace quota allows no {what} (limit 0), pod needs {need} {unit}"
        if used + need > limit:
            return f"namespace quota: {used} of {limit} {unit} used, pod needs {need}"
    return f"namespace quota: {quota.used_memory} of {quota.memory_limit} MiB used, pod needs {memory}"
