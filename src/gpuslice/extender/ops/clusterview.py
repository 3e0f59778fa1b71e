"""The cluster view: ``GET /ui`` (one HTML page) and ``GET /ui/state`` (the JSON it polls).

Read-only, from what the extender holds already: the cache's snapshot (nodes, cards, usage,
cordoned and unhealthy cards), the pods charged on each card (``ClusterCache.holders``), the nodes
the extender will not place on now and why (``Deps.excluded``, e.g. ``NodeLockHeld``), the nodes
whose registration does not decode, the capacity held for preemptors (``Deps.nominator``),
the pending GPU pods (``Deps.pending``) with ``explain``'s per-card explanation, the GPU instances
and memory slices of each card in MIG mode (``policy.mig.card_slices``) and, with
``--shadow-policy``, the shadow-mode comparison (``Shadow.summary``). Nothing here makes an API call.

Fragmentation is FGD's measure (Weng et al., "Beware of Fragmentation", USENIX ATC 2023): the
GPU share on a node that the expected pods could not use, ``F_n(M) = sum_m p_m F_n(m)``, against
the workload histogram the extender learns from the requests it sees (docs/workload.md), with
FGD's own cut to the most popular shapes (``fragmentation.top_shapes``). Until that histogram is
trusted the snapshot carries no workload and the view says ``learning`` instead of a number. A
node whose allocatable CPU is not known counts as CPU-unbounded (no shape fails on CPU there).

The page (``ui.html``, package data) is self-contained: inline CSS and script, nothing fetched but
``/ui/state``; its Content-Security-Policy forbids anything else. The state is assembled at most
once per ``min_interval_s`` however many browsers poll (one pass over the held pods each time),
in a worker thread so the event loop keeps answering kube-scheduler meanwhile.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

import msgspec
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gpuslice.cache import cache as caches
from gpuslice.extender import holdings
from gpuslice.extender.ops import shadow as shadows
from gpuslice.framework import explain as explains
from gpuslice.framework import gangs as gang_plans
from gpuslice.framework import nominations, view
from gpuslice.framework import pending as pendings
from gpuslice.framework import profile as profiles
from gpuslice.model import allocations, devices, nodes, status
from gpuslice.policy import api, fragmentation, shares
from gpuslice.policy import mig as migs

LEARNING = "learning"
TRUSTED = "trusted"
UNAVAILABLE = "unavailable"
"""A section whose part is not built into this extender (or failed): the page says so."""
OFF = "off"
ON = "on"
CORDONED = "cordoned"
UNHEALTHY = "unhealthy"
MAX_PENDING = 20
"""Pending pods explained per state, oldest first; the rest are counted (``pending_more``)."""
MAX_EXPLAINED_NODES = 12
"""Nodes shown per pending pod, closest to fitting first; the rest are counted (``nodes_more``)."""
CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The page may run its own inline script and style and fetch ``/ui/state``; nothing else."""


class PodOnCard(msgspec.Struct, frozen=True):
    """A pod charged on a card, and its charge there."""

    pod: str
    memory_mib: int
    cores: int
    slots: int
    assumed: bool
    """Reserved by a bind in flight, not yet confirmed by the watch."""


class Instance(msgspec.Struct, frozen=True):
    """A GPU instance held on a MIG card: profile, memory slices ``[start, start + size)``, holder."""

    profile: str
    start: int
    size: int
    pod: str
    assumed: bool


class Mig(msgspec.Struct, frozen=True, kw_only=True):
    """A card in MIG mode: its instances and memory slices (``policy.mig.card_slices``).

    ``slices_held + slices_free == slices_total``; ``slices_stranded`` counts the free slices no
    free placement of a profile the learned workload asks for covers (every profile alike while
    the workload is learning), so possibly a fraction.
    """

    instances: tuple[Instance, ...]
    slices_total: int
    slices_held: int
    slices_free: int
    slices_stranded: float


class Card(msgspec.Struct, frozen=True, kw_only=True):
    """One registered card, what is allocated on it and by whom."""

    uuid: str
    index: int
    model: str
    mode: str
    memory_mib: int
    cores: int
    slots: int
    used_memory_mib: int
    used_cores: int
    used_slots: int
    free_milli: int
    """The share a new pod could still take (``shares.card_free_milli``; 0 when cordoned or unhealthy)."""
    marks: tuple[str, ...] = ()
    pods: tuple[PodOnCard, ...] = ()
    held: tuple[PodOnCard, ...] = ()
    """Capacity held for a preemptor while its victims leave (counted in ``used_*``)."""
    temperature_c: float | None = None
    utilization_pct: float | None = None
    mig: Mig | None = None
    """On a card in MIG mode, its instances and slices; None otherwise."""


class Fragmentation(msgspec.Struct, frozen=True):
    """FGD's measure: of the free GPU share, how much the expected pods could not use (milli-GPU)."""

    fragmented_milli: int
    free_milli: int


class Node(msgspec.Struct, frozen=True, kw_only=True):
    """A registered node and its cards."""

    name: str
    model: str
    cards: tuple[Card, ...]
    excluded: str = ""
    """The reason code the extender does not place on it now (e.g. ``NodeLockHeld``), or empty."""
    fragmentation: Fragmentation | None = None


class Orphan(msgspec.Struct, frozen=True):
    """A grant on a card the cache cannot account (unknown node or UUID)."""

    node: str
    uuid: str
    pod: str


class Pending(msgspec.Struct, frozen=True, kw_only=True):
    """A pending GPU pod and why it fits nowhere.

    Attributes:
        pod: ``namespace/name``.
        first_seen: when the filter first found no node for it (seconds since the epoch).
        filter_summary: the filter's last summary (``0/3 nodes feasible, ...``).
        explanation: ``explain.Explanation`` as JSON, its nodes cut to the closest to fitting.
        nodes_more: nodes explained but left out of ``explanation``.
    """

    pod: str
    first_seen: float = 0.0
    filter_summary: str = ""
    explanation: msgspec.Raw | None = None
    nodes_more: int = 0


class State(msgspec.Struct, frozen=True, kw_only=True):
    """Everything ``/ui/state`` answers."""

    generation: int
    synced: bool
    workload: str
    """``trusted`` (fragmentation measured) or ``learning`` (the histogram is not trusted yet)."""
    fragmentation: Fragmentation | None
    nodes: tuple[Node, ...]
    invalid_nodes: tuple[str, ...] = ()
    orphans: tuple[Orphan, ...] = ()
    holders_status: str = ON
    """``unavailable`` when the cache cannot list the pods per card."""
    pending_status: str = UNAVAILABLE
    pending: tuple[Pending, ...] = ()
    pending_more: int = 0
    shadow_status: str = UNAVAILABLE
    shadow: msgspec.Raw | None = None
    gangs_status: str = UNAVAILABLE
    """``on`` when gangs are placed whole (``gangs`` then lists the plans holding cards)."""
    gangs: tuple[gang_plans.PlanView, ...] = ()


def held_cards(noms: Sequence[nominations.Nomination]) -> dict[str, list[PodOnCard]]:
    """Card UUID -> the capacity held there for preemptors (unclaimed nominations only).

    A claimed nomination's pod is being bound: the cache charges it as an assumed pod instead.
    """
    out: dict[str, list[PodOnCard]] = {}
    for nom in noms:
        if nom.claimed:
            continue
        for uuid, use in allocations.card_reservation(nom.alloc).items():
            out.setdefault(uuid, []).append(PodOnCard(nom.key, use.memory_mib, use.cores, use.slots, False))
    return out


class Source(Protocol):
    """What the view reads (``app.Deps`` has these attributes)."""

    @property
    def cache(self) -> caches.ClusterCache:
        """The extender's cache (the view reads its pods per card too)."""
        ...

    @property
    def nominator(self) -> nominations.Nominator | None:
        """The preemptors' nominations the cache applies (None: not shown)."""
        ...

    @property
    def invalid_nodes(self) -> Collection[str]:
        """Nodes whose registration does not decode."""
        ...

    @property
    def excluded(self) -> Mapping[str, str]:
        """Nodes not placed on now -> reason code."""
        ...

    @property
    def synced(self) -> Callable[[], bool]:
        """True once every watched kind is listed."""
        ...

    @property
    def shadow(self) -> shadows.Shadow | None:
        """Shadow mode, None when off."""
        ...

    @property
    def pending(self) -> pendings.PendingPods:
        """The GPU pods the filter found no node for."""
        ...

    @property
    def profile(self) -> profiles.Profile:
        """The extender's profile (``explain`` judges cards with it)."""
        ...

    @property
    def gangs(self) -> gang_plans.Gangs | None:
        """The gangs' plans, None when gangs are off."""
        ...


PendingFn = Callable[[view.Snapshot], tuple[str, Sequence[Pending], int]]
"""(status, explained pending pods, pods left out) from a snapshot."""
ShadowFn = Callable[[], tuple[str, msgspec.Raw | None]]
"""(status, summary JSON)."""


def _no_pending(snap: view.Snapshot) -> tuple[str, Sequence[Pending], int]:
    return UNAVAILABLE, (), 0


def _no_shadow() -> tuple[str, msgspec.Raw | None]:
    return UNAVAILABLE, None


def _closest(node: explains.Node, excluded: Collection[str]) -> tuple[bool, bool, bool, int, str]:
    """Closest to fitting first: fits, short of capacity (most fitting cards first), excluded, hopeless."""
    fitting = sum(1 for c in node.cards if c.reason == explains.FITS)
    unresolvable = node.code == explains.CODE_NAMES[status.Code.UNRESOLVABLE]
    return (not node.fits, unresolvable, node.name in excluded, -fitting, node.name)


def explained(snap: view.Snapshot, source: Source, entry: pendings.Pending) -> Pending:
    """``explain.explain`` of one pending pod, as the filter would judge it on ``snap``."""
    excluded = dict(source.excluded)
    held = holdings.held(source.cache, entry.key, entry.request.uid)  # a pod bound since it was noted
    doc = explains.explain(snap, entry.request, source.profile, source.invalid_nodes, excluded, held=held)
    kept = sorted(doc.nodes, key=lambda n: _closest(n, excluded))[:MAX_EXPLAINED_NODES]
    return Pending(
        pod=entry.key,
        first_seen=entry.first_seen,
        filter_summary=entry.summary,
        explanation=msgspec.Raw(explains.encode(msgspec.structs.replace(doc, nodes=tuple(kept)))),
        nodes_more=len(doc.nodes) - len(kept),
    )


def pending_section(source: Source) -> PendingFn:
    """The pending GPU pods (oldest first), each with ``explain``'s per-card explanation."""

    def section(snap: view.Snapshot) -> tuple[str, Sequence[Pending], int]:
        entries = source.pending.pods()
        shown = [explained(snap, source, e) for e in entries[:MAX_PENDING]]
        return ON, shown, max(0, len(entries) - MAX_PENDING)

    return section


def shadow_section(source: Source) -> ShadowFn:
    """The shadow-mode comparison (``Shadow.summary()``), ``off`` while shadow mode is off."""

    def section() -> tuple[str, msgspec.Raw | None]:
        shadow = source.shadow
        if shadow is None:
            return OFF, None
        return ON, as_raw(shadow.summary())

    return section


def mig_view(
    dev: devices.GpuDevice, use: nodes.CardUsage, held: Sequence[caches.Holder], workload: api.Workload | None
) -> Mig:
    """A MIG card's instances (by start, each with the pod holding it) and slices."""
    sl = migs.card_slices(dev, use, workload)
    owners = [(s, h.pod, h.assumed) for h in held for s in h.usage.mig]
    instances = tuple(
        Instance(s.profile, s.start, s.size, pod, assumed) for s, pod, assumed in sorted(owners)
    )
    return Mig(
        instances=instances,
        slices_total=sl.total,
        slices_held=sl.held,
        slices_free=sl.free,
        slices_stranded=round(sl.stranded, 2),
    )


def card_view(
    state: nodes.NodeState,
    i: int,
    held: Sequence[caches.Holder],
    reserved: Sequence[PodOnCard] = (),
    workload: api.Workload | None = None,
) -> Card:
    """Card ``i`` of a node with the pods the cache charges on it and what it holds for preemptors.

    ``workload``: the learned workload a MIG card's stranded slices are counted against.
    """
    inv = state.inventory
    dev = inv.devices[i]
    use = state.usage[i]
    here = [h for h in held if h.node == inv.name]
    marks = []
    if dev.uuid in inv.cordoned:
        marks.append(CORDONED)
    if not dev.health:
        marks.append(UNHEALTHY)
    tel = next((t for t in inv.telemetry if t.uuid == dev.uuid), None)
    return Card(
        uuid=dev.uuid,
        index=dev.index,
        model=dev.type,
        mode=dev.mode,
        memory_mib=dev.memory_mib,
        cores=dev.cores,
        slots=dev.split_count,
        used_memory_mib=use.memory_mib,
        used_cores=use.cores,
        used_slots=use.slots,
        free_milli=shares.card_free_milli(state, i),
        marks=tuple(marks),
        pods=tuple(
            PodOnCard(h.pod, h.usage.memory_mib, h.usage.cores, h.usage.slots, h.assumed) for h in here
        ),
        held=tuple(reserved),
        temperature_c=None if tel is None else tel.temperature_c,
        utilization_pct=None if tel is None else tel.utilization_pct,
        mig=mig_view(dev, use, here, workload) if dev.is_mig else None,
    )


def node_fragmentation(measure: fragmentation.Fragmentation, state: nodes.NodeState) -> Fragmentation:
    """FGD's ``F_n(M)`` of a node in milli-GPU, beside its free share."""
    free = shares.free_milli(state)
    cpu = state.cpu_free_milli if state.inventory.cpu_milli > 0 else 1 << 62
    units = measure.of(state.inventory.model, cpu, free)
    return Fragmentation(units // fragmentation.UNIT, sum(free))


class ClusterView:
    """Assembles ``State`` from a ``Source``; memoizes the FGD measure per learned workload.

    Args:
        source: the extender's dependencies (``app.Deps``).
        pending: the pending-pods part (``pending_section``), absent when not built in.
        shadow: the shadow-mode part (``shadow_section``), absent when not built in.
        min_interval_s: an answer is reused for this long (many browsers cost one assembly).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        source: Source,
        pending: PendingFn = _no_pending,
        shadow: ShadowFn = _no_shadow,
        min_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._pending = pending
        self._shadow = shadow
        self._min = min_interval_s
        self._clock = clock
        self._workload: object = None
        self._measure: fragmentation.Fragmentation | None = None
        self._last: tuple[float, bytes] | None = None

    def state(self) -> State:
        """The view of the cluster now."""
        src = self._source
        snap = src.cache.snapshot()
        cache = src.cache
        held, holders_status = cache.holders(), ON
        noms, plans = src.nominator, src.gangs
        reserved = {} if noms is None else held_cards(noms.nominations())
        if plans is not None:  # gang plans hold cards the same way (shown as held, by slot)
            for uuid, held_here in held_cards(plans.holder.nominations()).items():
                reserved.setdefault(uuid, []).extend(held_here)
        measure = self._measure_for(snap)
        workload = view.workload(snap)
        excluded = dict(src.excluded)
        out = []
        total_frag = total_free = 0
        for name in sorted(snap.nodes):
            state = snap.nodes[name]
            cards = tuple(
                card_view(state, i, held.get(d.uuid, ()), reserved.get(d.uuid, ()), workload)
                for i, d in enumerate(state.inventory.devices)
            )
            frag = None if measure is None else node_fragmentation(measure, state)
            if frag is not None:
                total_frag += frag.fragmented_milli
                total_free += frag.free_milli
            out.append(
                Node(
                    name=name,
                    model=state.inventory.model,
                    cards=cards,
                    excluded=excluded.get(name, ""),
                    fragmentation=frag,
                )
            )
        pending_status, pending, more = self._pending(snap)
        shadow_status, shadow = self._shadow()
        orphans = snap.orphans
        return State(
            generation=snap.generation,
            synced=src.synced(),
            workload=LEARNING if measure is None else TRUSTED,
            fragmentation=None if measure is None else Fragmentation(total_frag, total_free),
            nodes=tuple(out),
            invalid_nodes=tuple(sorted(src.invalid_nodes)),
            orphans=tuple(Orphan(o.node, o.uuid, o.pod) for o in orphans),
            holders_status=holders_status,
            pending_status=pending_status,
            pending=tuple(pending),
            pending_more=more,
            shadow_status=shadow_status,
            shadow=shadow,
            gangs_status=UNAVAILABLE if plans is None else ON,
            gangs=() if plans is None else plans.views(time.time()),
        )

    def state_json(self) -> bytes:
        """``state()`` encoded, reused for ``min_interval_s``."""
        now = self._clock()
        last = self._last
        if last is not None and now - last[0] < self._min:
            return last[1]
        body = msgspec.json.encode(self.state())
        self._last = (now, body)
        return body

    def _measure_for(self, snap: view.Snapshot) -> fragmentation.Fragmentation | None:
        workload = view.workload(snap)
        if workload is None:
            return None
        if self._measure is None or self._workload is not workload:
            self._workload = workload
            self._measure = fragmentation.Fragmentation(fragmentation.top_shapes(workload))
        return self._measure


@functools.cache
def page() -> bytes:
    """The page's HTML (``ui.html`` beside this module)."""
    return importlib.resources.files("gpuslice.extender.ops").joinpath("ui.html").read_bytes()


@dataclasses.dataclass
class Endpoints:
    """The two GET handlers over one ``ClusterView``."""

    view: ClusterView

    async def ui(self, request: Request) -> Response:
        """``/ui``: the page."""
        headers = {
            "Content-Security-Policy": CSP,
            "Cache-Control": "no-cache",
            "X-Content-Type-Options": "nosniff",
        }
        return Response(page(), media_type="text/html; charset=utf-8", headers=headers)

    async def state(self, request: Request) -> Response:
        """``/ui/state``: the JSON the page polls."""
        body = await run_in_threadpool(self.view.state_json)
        return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})


def routes(source: Source) -> list[Route]:
    """``GET /ui`` and ``GET /ui/state`` over ``source`` (``app.Deps``)."""
    ends = Endpoints(ClusterView(source, pending_section(source), shadow_section(source)))
    return [Route("/ui", ends.ui, methods=["GET"]), Route("/ui/state", ends.state, methods=["GET"])]


def as_raw(value: Any) -> msgspec.Raw:
    """Any msgspec-encodable value as raw JSON (for the sections built by other parts)."""
    return msgspec.Raw(msgspec.json.encode(value))
