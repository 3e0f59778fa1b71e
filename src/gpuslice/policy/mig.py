"""MIG slices: which GPU instance a request gets, where on which card, and what that strands.

Two rules choose a container's instances on the MIG cards of one node:

* ``FIRST_FIT`` is HAMi v2.10's (``pkg/device/nvidia/device.go`` ``selectMigCandidate`` and
  ``mig_topology.go``): the smallest profile whose memory covers the request (ties: fewer compute
  slices) that has a free placement, and of its placements the first free one in a fixed order:
  ``1g`` and ``3g`` profiles from the highest start down, the others from the lowest start up.
  Cards come in the card policy's order and a card takes as many of the container's instances as
  it can before the next is tried (HAMi revisits a MIG card, ``Fit``'s ``i++``).
* ``FRAGMENTATION`` is gpuslice's: every (card, profile, placement) that serves the request is a
  candidate, and the one that strands the fewest memory slices wins. A free slice is stranded for
  a profile when no free legal placement of that profile covers it; a card's stranding is that
  count averaged over the profiles the workload asks for (``demand``). This is the fragmentation
  measure of FGD (Weng et al., USENIX ATC '23) applied to slices; Zambianco et al. (arXiv
  2511.18906) report about 10 % more accepted workloads with such a rule than with first fit. A
  candidate's cost is the growth of its card's stranding plus the slices it takes beyond the
  smallest profile that serves the request, so a larger profile wins only where it strands less
  than it wastes. Ties go to HAMi's choice.

Slices are bit masks (bit ``k`` = memory slice ``k``), so a cost is a few integer operations.
A card whose holders outnumber its known slices (a pod that holds it without a recorded
placement, e.g. written by a scheduler that did not record one) is treated as full: HAMi marks
such a card unhealthy (``getNodesUsage``), and neither hands out an instance that may be in use.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

from gpuslice.model import allocations, devices, mig, nodes, requests
from gpuslice.policy import api

FIRST_FIT = "first-fit"
FRAGMENTATION = "fragmentation"
RULES = (FRAGMENTATION, FIRST_FIT)


def _mask(p: mig.Placement | mig.Slice) -> int:
    return ((1 << p.size) - 1) << p.start


class _Table(NamedTuple):
    """A card's profiles prepared once: per profile its placements' masks in HAMi's order."""

    profiles: tuple[mig.Profile, ...]
    ordered: tuple[tuple[mig.Placement, ...], ...]
    masks: tuple[tuple[int, ...], ...]
    full: int


@functools.lru_cache(maxsize=256)
def _table(profiles: tuple[mig.Profile, ...]) -> _Table:
    ordered = tuple(hami_order(p) for p in profiles)
    masks = tuple(tuple(_mask(pl) for pl in o) for o in ordered)
    full = (1 << mig.slices_of(profiles)) - 1
    return _Table(profiles, ordered, masks, full)


def hami_order(profile: mig.Profile) -> tuple[mig.Placement, ...]:
    """The profile's placements in the order HAMi tries them (``orderedMigPlacements``)."""
    high = profile.name.startswith(("1g.", "3g."))
    return tuple(sorted(profile.placements, key=lambda p: -p.start if high else p.start))


def candidates(dev: devices.GpuDevice, memory_mib: int) -> tuple[int, ...]:
    """Positions of the profiles that serve ``memory_mib``, smallest memory first (HAMi's order)."""
    profs = dev.mig_profiles
    ok = [k for k, p in enumerate(profs) if p.memory_mib >= memory_mib and p.placements]
    return tuple(sorted(ok, key=lambda k: (profs[k].memory_mib, profs[k].slice_count)))


def occupied(dev: devices.GpuDevice, usage: nodes.CardUsage) -> int:
    """The card's taken slices as a mask (every slice when a holder's placement is unknown)."""
    t = _table(dev.mig_profiles)
    if usage.slots > len(usage.mig):
        return t.full
    taken = 0
    for s in usage.mig:
        taken |= _mask(s)
    return taken


def first_fit(dev: devices.GpuDevice, taken: int, memory_mib: int) -> mig.Slice | None:
    """HAMi's ``selectMigCandidate``: the instance it gives for ``memory_mib``, or None."""
    for k in candidates(dev, memory_mib):
        s = _first_free(_table(dev.mig_profiles), k, taken)
        if s is not None:
            return s
    return None


def placement_for(dev: devices.GpuDevice, taken: int, profile: str) -> mig.Slice | None:
    """HAMi's ``selectMigPlacement``: the first free placement of the named profile, or None."""
    t = _table(dev.mig_profiles)
    for k, p in enumerate(t.profiles):
        if p.name == profile:
            return _first_free(t, k, taken)
    return None


def _first_free(t: _Table, k: int, taken: int) -> mig.Slice | None:
    for pl, m in zip(t.ordered[k], t.masks[k], strict=True):
        if not m & taken:
            return mig.Slice(pl.start, pl.size, t.profiles[k].name)
    return None


def mask_of(slices: Sequence[mig.Slice]) -> int:
    """The slices as a mask (bit k = memory slice k)."""
    out = 0
    for s in slices:
        out |= _mask(s)
    return out


def demand(dev: devices.GpuDevice, workload: api.Workload | None) -> tuple[tuple[int, float], ...]:
    """The profiles the workload asks of this card, as (profile position, weight summing to 1).

    A shape asking ``share_milli`` of a card asks for the smallest profile with that share of the
    card's memory; a model-constrained shape the card's type does not match asks nothing here.
    Without a workload (or one that asks nothing of the card) every profile counts alike.
    """
    return _demand(dev.mig_profiles, dev.memory_mib, dev.type, workload)


@functools.lru_cache(maxsize=1024)
def _demand(
    profiles: tuple[mig.Profile, ...], memory_mib: int, card_type: str, workload: api.Workload | None
) -> tuple[tuple[int, float], ...]:
    weights: dict[int, float] = {}
    if workload is not None:
        t = card_type.lower()
        for shape, w in zip(workload.shapes, workload.weights, strict=True):
            if shape.share_milli <= 0 or w <= 0:
                continue
            if shape.types and not any(x.lower() in t for x in shape.types):
                continue
            need = -(-shape.share_milli * memory_mib // 1000) if shape.share_milli < 1000 else memory_mib
            fits = [k for k, p in enumerate(profiles) if p.placements and p.memory_mib >= need]
            k = min(fits, key=lambda j: (profiles[j].memory_mib, profiles[j].slice_count), default=None)
            if k is None:  # more than the largest profile: the whole card's largest instance
                k = max(range(len(profiles)), key=lambda j: profiles[j].memory_mib, default=None)
            if k is not None:
                weights[k] = weights.get(k, 0.0) + w * max(1, shape.count)
    if not weights:
        weights = {k: 1.0 for k, p in enumerate(profiles) if p.placements}
    total = sum(weights.values())
    return tuple(sorted((k, w / total) for k, w in weights.items()))


def stranded(dev: devices.GpuDevice, taken: int, want: tuple[tuple[int, float], ...]) -> float:
    """Free slices of the card no free placement of a wanted profile covers, weighted by demand."""
    t = _table(dev.mig_profiles)
    free = t.full & ~taken
    if not free:
        return 0.0
    out = 0.0
    for k, w in want:
        covered = 0
        for m in t.masks[k]:
            if not m & taken:
                covered |= m
        out += w * (free & ~covered).bit_count()
    return out


class Choice(NamedTuple):
    """One instance for one request: the card, the slice, and what it costs in stranded slices."""

    card: int
    slice: mig.Slice
    cost: float


def best(
    state: nodes.NodeState,
    eligible: Sequence[int],
    memory: Sequence[int],
    taken: dict[int, int],
    ctx: api.Context,
) -> Choice | None:
    """The fragmentation rule's instance among ``eligible`` cards.

    ``memory[i]``: what the request needs on card i; ``taken[i]``: card i's slices now. Ties go to
    the earlier card in ``eligible``, then to HAMi's choice on it.
    """
    devs = state.inventory.devices
    won: tuple[float, int, int, Choice] | None = None
    for rank, i in enumerate(eligible):
        dev = devs[i]
        memory_mib = memory[i]
        ks = candidates(dev, memory_mib)
        if not ks:
            continue
        t = _table(dev.mig_profiles)
        want = demand(dev, ctx.workload)
        now = taken[i]
        before = stranded(dev, now, want)
        smallest = t.profiles[ks[0]].size
        hami = first_fit(dev, now, memory_mib)
        for k in ks:
            prof = t.profiles[k]
            for pl, m in zip(t.ordered[k], t.masks[k], strict=True):
                if m & now:
                    continue
                s = mig.Slice(pl.start, pl.size, prof.name)
                cost = stranded(dev, now | m, want) - before + (prof.size - smallest)
                key = (round(cost, 9), rank, 0 if s == hami else 1)
                if won is None or key < won[:3]:
                    won = (key[0], key[1], key[2], Choice(i, s, cost))
    return None if won is None else won[3]


def assign(
    state: nodes.NodeState,
    req: requests.ContainerRequest,
    eligible: Sequence[int],
    memory: Sequence[int],
    ctx: api.Context,
    rule: str,
    order: Sequence[int] | None = None,
) -> list[Choice] | None:
    """``req.count`` instances on the MIG cards ``eligible`` (several may share a card), or None.

    ``memory[i]`` is what the request needs on card i (a percentage resolves per card). ``order``
    is the card policy's preference for ``FIRST_FIT`` (default: ``eligible`` as given).
    """
    devs = state.inventory.devices
    taken = {i: occupied(devs[i], state.usage[i]) for i in eligible}
    out: list[Choice] = []
    if rule == FIRST_FIT:
        for i in order if order is not None else eligible:
            while len(out) < req.count:
                s = first_fit(devs[i], taken[i], memory[i])
                if s is None:
                    break
                taken[i] |= _mask(s)
                out.append(Choice(i, s, 0.0))
        return out if len(out) == req.count else None
    for _ in range(req.count):
        c = best(state, eligible, memory, taken, ctx)
        if c is None:
            return None
        taken[c.card] |= _mask(c.slice)
        out.append(c)
    return out


def fits(dev: devices.GpuDevice, usage: nodes.CardUsage, memory_mib: int) -> bool:
    """True when the card has a free instance of a profile that serves ``memory_mib``."""
    return first_fit(dev, occupied(dev, usage), memory_mib) is not None


def legal(dev: devices.GpuDevice, s: mig.Slice) -> bool:
    """True when ``s`` is one of its profile's placements on this card."""
    prof = mig.find(dev.mig_profiles, s.profile)
    return prof is not None and mig.Placement(s.start, s.size) in prof.placements


def cost_of(state: nodes.NodeState, grants: Sequence[tuple[int, mig.Slice]], ctx: api.Context) -> float:
    """How many slices (expected, under ``demand``) placing these instances strands on the node."""
    devs = state.inventory.devices
    after: dict[int, int] = {}
    for i, s in grants:
        after[i] = after.get(i, occupied(devs[i], state.usage[i])) | _mask(s)
    total = 0.0
    for i, mask in after.items():
        dev = devs[i]
        want = demand(dev, ctx.workload)
        total += stranded(dev, mask, want) - stranded(dev, occupied(dev, state.usage[i]), want)
    return total


def node_score(state: nodes.NodeState, alloc: allocations.PodAllocation, base: int, ctx: api.Context) -> int:
    """A node's score for a placement with MIG instances: fewest stranded slices first.

    The slices the placement strands on the node (``cost_of``) set the tens; the node policy's
    own score ``base`` (0..100) breaks ties among nodes that strand alike. A placement without
    instances keeps ``base``.
    """
    index = {d.uuid: i for i, d in enumerate(state.inventory.devices)}
    grants = [
        (index[g.uuid], g.mig) for c in alloc.containers for g in c if g.mig is not None and g.uuid in index
    ]
    if not grants:
        return base
    cost = cost_of(state, grants, ctx)
    return max(0, min(90, 50 - round(cost * 10))) + base // 10


def node_stranded(state: nodes.NodeState, ctx: api.Context) -> float:
    """Stranded slices over the node's MIG cards (``stranded`` summed)."""
    total = 0.0
    for dev, u in zip(state.inventory.devices, state.usage, strict=True):
        if dev.is_mig and dev.mig_profiles:
            total += stranded(dev, occupied(dev, u), demand(dev, ctx.workload))
    return total


def span(s: mig.Slice) -> str:
    """The memory slices an instance covers, as people read them: ``6`` or ``2-3``."""
    return str(s.start) if s.size <= 1 else f"{s.start}-{s.end - 1}"


def _grants(state: nodes.NodeState, alloc: allocations.PodAllocation) -> list[tuple[int, mig.Slice]]:
    """The placement's instances on the node's cards, as (card position, slice)."""
    index = {d.uuid: i for i, d in enumerate(state.inventory.devices)}
    return [
        (index[g.uuid], g.mig) for c in alloc.containers for g in c if g.mig is not None and g.uuid in index
    ]


def _where(state: nodes.NodeState, grants: Sequence[tuple[int, mig.Slice]]) -> str:
    devs = state.inventory.devices
    return ", ".join(
        f"{s.profile} at slice{'s' if s.size > 1 else ''} {span(s)} of {devs[i].uuid}" for i, s in grants
    )


def compare(
    state: nodes.NodeState,
    alloc: allocations.PodAllocation,
    first: allocations.PodAllocation | None,
    ctx: api.Context,
) -> str | None:
    """What the chosen instances strand next to HAMi's first fit on the same node, or None.

    ``alloc`` is the placement made (by the fragmentation rule) on ``state``; ``first`` is the
    same pod placed on the same ``state`` under ``FIRST_FIT`` (None where that places nothing).
    None when ``alloc`` holds no instance or both chose the same instances; otherwise a sentence
    for the bind event, e.g. ``MIG: 1g.10gb at slice 4 of GPU-b strands 1 fewer slice than
    HAMi's first fit (1g.10gb at slice 6 of GPU-a)``, the counts from ``cost_of``.
    """
    ours = _grants(state, alloc)
    if not ours:
        return None
    head = f"MIG: {_where(state, ours)}"
    if first is None:
        return f"{head}; HAMi's first fit places nothing here"
    theirs = _grants(state, first)
    if sorted(ours) == sorted(theirs):
        return None
    diff = cost_of(state, theirs, ctx) - cost_of(state, ours, ctx)
    n = abs(round(diff, 2))
    unit = "slice" if n == 1 else "slices"
    if n == 0:
        verdict = "strands as many slices as"
    else:
        verdict = f"strands {n:g} {'fewer' if diff > 0 else 'more'} {unit} than"
    return f"{head} {verdict} HAMi's first fit ({_where(state, theirs)})"


class Slices(NamedTuple):
    """A MIG card's memory slices for operators: how many, held, free, and free but stranded.

    ``held + free == total``; ``stranded`` (of the free ones) is ``stranded``'s weighted count.
    """

    total: int
    held: int
    free: int
    stranded: float


def card_slices(dev: devices.GpuDevice, usage: nodes.CardUsage, workload: api.Workload | None) -> Slices:
    """The card's slices now; stranded against the profiles ``workload`` asks (``demand``)."""
    total = mig.slices_of(dev.mig_profiles)
    taken = occupied(dev, usage)
    held = min(total, taken.bit_count())
    return Slices(total, held, total - held, stranded(dev, taken, demand(dev, workload)))
