"""MIG placement at saturation: HAMi's rule against gpuslice's fragmentation rule (docs/mig-simulation.md).

A cluster of nodes whose cards are all in MIG mode (``Table``: the profiles of one card model)
receives GPU-instance requests as a loss system: Poisson arrivals, exponential lifetimes (mean 1),
offered load above capacity. A request either gets its instances at once or is rejected; a
departure frees its slices, which is what fragments the cards. Every placement goes through the
extender's own code: ``batch.evaluate`` judges and scores the nodes, ``batch.choose`` takes the
best and ``fit.place`` its instances (``policy.mig``), and ``allocations.apply`` charges them.

``Variant``: a node policy, a card policy and ``api.Context.mig_rule``. HAMi v2.10's defaults are
``binpack`` nodes, ``spread`` cards and its first fit; gpuslice's are the same policies with the
fragmentation rule and the target workload taken from the request mix.

Only nodes that may hold the request reach ``batch.evaluate`` (``may_fit``: an upper bound on the
instances each card can still give), which saves the simulator ``fit.place``'s explanation of
nodes that cannot; it never drops a node ``fit.place`` would accept.

Requests: a fractional request of g milli-GPU asks ``ceil(g / 1000 * card memory)`` MiB, so it
gets the smallest profile with at least that memory; k whole GPUs are k instances of the largest
profile (``request_of``). Same seed, same arrivals for every variant (common random numbers).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from gpuslice.framework import registry
from gpuslice.model import allocations, devices, mig, migcatalog, nodes, requests
from gpuslice.policy import api, batch
from gpuslice.policy import mig as migs
from gpuslice.sim import experiment, trace


@dataclasses.dataclass(frozen=True)
class Table:
    """One card model in MIG mode: its memory and the profiles NVML gives it."""

    name: str
    card_type: str
    memory_mib: int
    profiles: tuple[mig.Profile, ...]

    @property
    def slices(self) -> int:
        """Memory slices of one card."""
        return mig.slices_of(self.profiles)

    def profile(self, name: str) -> mig.Profile:
        """The profile called ``name`` (KeyError when the table has none)."""
        p = mig.find(self.profiles, name)
        if p is None:
            raise KeyError(f"{self.name} has no profile {name!r}")
        return p

    def serving(self, memory_mib: int) -> mig.Profile:
        """The smallest profile with at least ``memory_mib`` (the largest when none has as much)."""
        ok = [p for p in self.profiles if p.memory_mib >= memory_mib]
        if not ok:
            return max(self.profiles, key=lambda p: (p.memory_mib, p.slice_count))
        return min(ok, key=lambda p: (p.memory_mib, p.slice_count))


A100_40GB = Table(
    "a100-40gb",
    migcatalog.NVML_NAMES["A100-SXM4-40GB"],
    migcatalog.MEMORY_MIB["A100-SXM4-40GB"],
    migcatalog.profiles("A100-SXM4-40GB", plain=True),
)
"""A100-SXM4-40GB with the profiles HAMi's device plugin creates (``model.migcatalog``)."""

H100_80GB = Table(
    "h100-80gb",
    migcatalog.NVML_NAMES["H100-SXM5-80GB"],
    migcatalog.MEMORY_MIB["H100-SXM5-80GB"],
    migcatalog.profiles("H100-SXM5-80GB"),
)
"""H100-SXM5-80GB with every profile, ``1g.20gb`` (one compute slice, two memory slices) too."""

TABLES: Mapping[str, Table] = {t.name: t for t in (A100_40GB, H100_80GB)}


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of request: ``count`` instances, each asking ``memory_mib``."""

    memory_mib: int
    count: int


@dataclasses.dataclass(frozen=True)
class Mix:
    """A request mix: kinds with their probabilities (by count of requests)."""

    name: str
    kinds: tuple[Kind, ...]
    weights: tuple[float, ...]

    def workload(self, table: Table) -> api.Workload:
        """The target workload the fragmentation rule learns: ``share_milli`` = memory / card memory.

        The share is rounded down, so ``policy.mig.demand`` maps it back to the same profile.
        """
        shapes = tuple(
            api.Shape(
                cpu_milli=0, share_milli=min(1000, k.memory_mib * 1000 // table.memory_mib), count=k.count
            )
            for k in self.kinds
        )
        return api.Workload(shapes, self.weights)

    def mean_slices(self, table: Table) -> float:
        """Memory slices one request takes on average."""
        return sum(
            w * k.count * table.serving(k.memory_mib).size
            for k, w in zip(self.kinds, self.weights, strict=True)
        )


def request_memory(share_milli: int, count: int, table: Table) -> Kind:
    """A trace request (per-GPU share in milli-GPU, GPUs) as MIG instances on ``table``'s cards.

    A fractional share asks ``ceil(share / 1000 * card memory)`` MiB, served by the smallest
    profile with that much; a whole GPU asks the largest profile's memory, ``count`` times.
    """
    if share_milli >= trace.FULL:
        return Kind(table.serving(table.memory_mib).memory_mib, count)
    need = math.ceil(share_milli * table.memory_mib / trace.FULL)
    return Kind(table.serving(need).memory_mib, count)


def trace_mix(pods: Sequence[trace.TracePod], table: Table) -> Mix:
    """The mix of the trace's GPU requests mapped to ``table``'s profiles (``request_memory``)."""
    counts = Counter(request_memory(p.share, p.count, table) for p in pods if p.count > 0)
    total = sum(counts.values())
    kinds = sorted(counts, key=lambda k: (-counts[k], k.memory_mib, k.count))
    return Mix("alibaba", tuple(kinds), tuple(counts[k] / total for k in kinds))


SYNTHETIC = {"1g": 0.40, "2g": 0.25, "3g": 0.20, "4g": 0.05, "7g": 0.10}
"""The synthetic mix, by count: compute slices of the profile -> share of requests."""


def synthetic_mix(table: Table) -> Mix:
    """``SYNTHETIC`` on ``table``: each entry asks the memory of the first profile of that compute size."""
    kinds: list[Kind] = []
    weights: list[float] = []
    for prefix, w in SYNTHETIC.items():
        prof = next(p for p in table.profiles if p.name.startswith(prefix + "."))
        kinds.append(Kind(prof.memory_mib, 1))
        weights.append(w)
    return Mix("synthetic", tuple(kinds), tuple(weights))


def mix_of(name: str, table: Table) -> Mix:
    """``alibaba`` (the bundled openb trace) or ``synthetic``."""
    if name == "alibaba":
        return trace_mix(trace.load_pods(trace.data_path(trace.DEFAULT_PODS)), table)
    if name == "synthetic":
        return synthetic_mix(table)
    raise ValueError(f"unknown MIG mix {name!r}; known: alibaba, synthetic")


MIXES = ("alibaba", "synthetic")


@dataclasses.dataclass(frozen=True)
class Variant:
    """How requests are placed: node policy, card policy, MIG rule, and whether the workload is known."""

    name: str
    node_policy: str
    card_policy: str
    mig_rule: str
    learns: bool
    ideal: bool = False
    lowest: bool = False

    @property
    def reference(self) -> bool:
        """A reference the simulator computes itself, not the extender's placement code."""
        return self.ideal or self.lowest


VARIANTS: Mapping[str, Variant] = {
    v.name: v
    for v in (
        Variant("hami", "binpack", "spread", migs.FIRST_FIT, False),
        Variant("hami-binpack", "binpack", "binpack", migs.FIRST_FIT, False),
        Variant("gpuslice", "binpack", "spread", migs.FRAGMENTATION, True),
        Variant("ideal", "", "", "", False, ideal=True),
        Variant("lowest-first", "", "", "", False, lowest=True),
    )
}
"""``hami``: HAMi v2.10's defaults; ``gpuslice``: the extender's defaults with the fragmentation rule.

Two references no scheduler ships: ``ideal`` ignores alignment (``simulate_ideal``) and
``lowest-first`` is textbook first fit (``simulate_lowest``), the kind of baseline fragmentation
studies compare against, to tell what HAMi's own placement order already gains.
"""


@dataclasses.dataclass(frozen=True)
class Spec:
    """One run: a variant on a mix, a seed, a cluster of ``nodes`` x ``cards`` and an offered load.

    ``load``: offered memory slices (arrival rate x mean lifetime x mean slices per request) over
    the cluster's slices. ``warmup`` and ``measured``: arrivals ignored, then counted.
    """

    variant: str
    mix: str
    seed: int
    nodes: int = 8
    cards: int = 8
    load: float = 1.4
    warmup: int = 500
    measured: int = 2000
    table: str = A100_40GB.name


@dataclasses.dataclass(frozen=True)
class Result:
    """One run's figures over the measured arrivals.

    Attributes:
        arrivals, accepted, rejected: requests (accepted + rejected = arrivals).
        offered_slices, accepted_slices: memory slices of the smallest profiles serving the
            requests that arrived and that were accepted.
        stranded: mean, at each rejection, of the cluster's free slices that no free placement of
            any profile of the mix covers.
        stranded_weighted: the same with the profiles weighted by their demand
            (``policy.mig.stranded``, the fragmentation rule's own measure).
        free: mean free slices at each rejection.
        utilization: mean share of the cluster's slices held, sampled at every arrival.
        wall_seconds: time of the run.
        by_kind: per kind of the mix (its order), (measured arrivals, accepted).
    """

    spec: Spec
    arrivals: int
    accepted: int
    rejected: int
    offered_slices: int
    accepted_slices: int
    stranded: float
    stranded_weighted: float
    free: float
    utilization: float
    wall_seconds: float
    by_kind: tuple[tuple[int, int], ...] = ()

    @property
    def acceptance(self) -> float:
        """Accepted share of the measured arrivals."""
        return self.accepted / self.arrivals if self.arrivals else 0.0

    def as_json(self) -> dict[str, object]:
        """The CLI's JSON record."""
        return {
            **dataclasses.asdict(self.spec),
            "arrivals": self.arrivals,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "offered_slices": self.offered_slices,
            "accepted_slices": self.accepted_slices,
            "stranded_slices": round(self.stranded, 4),
            "stranded_slices_weighted": round(self.stranded_weighted, 4),
            "free_slices": round(self.free, 4),
            "utilization": round(self.utilization, 4),
            "by_kind": [list(k) for k in self.by_kind],
            "wall_seconds": round(self.wall_seconds, 3),
        }


def inventory(name: str, cards: int, table: Table) -> nodes.NodeInventory:
    """A node of ``cards`` cards in MIG mode."""
    devs = tuple(
        devices.GpuDevice(
            uuid=f"{name}-gpu{i}",
            index=i,
            type=table.card_type,
            memory_mib=table.memory_mib,
            cores=devices.FULL_CORES,
            split_count=max(len(p.placements) for p in table.profiles),
            mode=devices.MODE_MIG,
            mig_profiles=table.profiles,
        )
        for i in range(cards)
    )
    return nodes.NodeInventory(name=name, devices=devs)


def pod_of(name: str, kind: Kind) -> requests.PodRequest:
    """The pod of one request: one container asking ``kind.count`` instances of ``kind.memory_mib``."""
    return requests.PodRequest(
        name=name, containers=(requests.ContainerRequest(count=kind.count, memory_mib=kind.memory_mib),)
    )


@dataclasses.dataclass(frozen=True)
class Arrivals:
    """A seed's arrival sequence: times, lifetimes and kind indices (same for every variant)."""

    times: np.ndarray
    lifetimes: np.ndarray
    kinds: np.ndarray


def arrivals(mix: Mix, table: Table, slices: int, load: float, n: int, seed: int) -> Arrivals:
    """``n`` Poisson arrivals at the rate that offers ``load`` x ``slices``; lifetimes exponential, mean 1."""
    rng = np.random.default_rng([seed, 7])
    rate = load * slices / mix.mean_slices(table)
    times = np.cumsum(rng.exponential(1.0 / rate, n))
    lifetimes = rng.exponential(1.0, n)
    p = np.asarray(mix.weights, dtype=np.float64)
    kinds = rng.choice(len(mix.kinds), size=n, p=p / p.sum())
    return Arrivals(times, lifetimes, kinds)


def _taken(state: nodes.NodeState) -> list[int]:
    return [migs.occupied(d, u) for d, u in zip(state.inventory.devices, state.usage, strict=True)]


def _mask(p: mig.Placement) -> int:
    return ((1 << p.size) - 1) << p.start


def may_fit(state: nodes.NodeState, kind: Kind) -> bool:
    """False only when no placement can hold the request (a bound that never drops a feasible node).

    A card gives at most its free slices over the smallest serving profile's size, and at least
    one card must have a first-fit slot.
    """
    devs = state.inventory.devices
    bound = 0
    any_slot = False
    for dev, taken in zip(devs, _taken(state), strict=True):
        ks = migs.candidates(dev, kind.memory_mib)
        if not ks:
            continue
        size = dev.mig_profiles[ks[0]].size
        free = ((1 << mig.slices_of(dev.mig_profiles)) - 1) & ~taken
        bound += free.bit_count() // max(1, size)
        any_slot = any_slot or migs.first_fit(dev, taken, kind.memory_mib) is not None
    return any_slot and bound >= kind.count


def stranded(state: nodes.NodeState, wanted: tuple[tuple[int, float], ...]) -> tuple[int, float, int]:
    """(free slices no wanted profile can cover, the same weighted by demand, free slices) on a node."""
    return _stranded_cards(state.inventory.devices, _taken(state), wanted)


def _stranded_cards(
    devs: Sequence[devices.GpuDevice], takens: Sequence[int], wanted: tuple[tuple[int, float], ...]
) -> tuple[int, float, int]:
    strict = 0
    weighted = 0.0
    free_total = 0
    for dev, taken in zip(devs, takens, strict=True):
        free = ((1 << mig.slices_of(dev.mig_profiles)) - 1) & ~taken
        covered = 0
        for k, _ in wanted:
            for pl in dev.mig_profiles[k].placements:
                m = _mask(pl)
                if not m & taken:
                    covered |= m
        strict += (free & ~covered).bit_count()
        weighted += migs.stranded(dev, taken, wanted)
        free_total += free.bit_count()
    return strict, weighted, free_total


def place(
    states: Mapping[str, nodes.NodeState],
    names: Sequence[str],
    kind: Kind,
    pod: requests.PodRequest,
    node_policy: api.Plugin,
    card_policy: api.CardChooser,
    ctx: api.Context,
) -> tuple[str, allocations.PodAllocation] | None:
    """The extender's choice for the pod, or None when no node takes it.

    ``batch.evaluate`` over the nodes that ``may_fit``, then the best one whose cards place
    (``batch.first_placed``, which ``batch.choose`` wraps).
    """
    candidates = [n for n in names if may_fit(states[n], kind)]
    if not candidates:
        return None
    ev = batch.evaluate(states, None, candidates, pod, node_policy, card_policy, ctx)
    idx = np.flatnonzero(ev.feasible)
    ranked = [ev.names[i] for i in idx.tolist()]
    won = batch.first_placed(states, ranked, ev.scores[idx], pod, card_policy, ctx)
    return None if won is None else (ranked[won[0]], won[1])


def run(spec: Spec) -> Result:
    """Simulate one spec (deterministic per seed)."""
    if VARIANTS[spec.variant].ideal:
        return simulate_ideal(spec)
    if VARIANTS[spec.variant].lowest:
        return simulate_lowest(spec)
    return simulate(spec)[0]


def lowest_free(dev: devices.GpuDevice, taken: int, memory_mib: int) -> mig.Slice | None:
    """Textbook first fit on one card: the smallest serving profile's free placement of lowest start."""
    for k in migs.candidates(dev, memory_mib):
        prof = dev.mig_profiles[k]
        for pl in sorted(prof.placements, key=lambda p: p.start):
            if not _mask(pl) & taken:
                return mig.Slice(pl.start, pl.size, prof.name)
    return None


def simulate_lowest(spec: Spec) -> Result:
    """Textbook first fit, a reference (not a scheduler gpuslice ships).

    Cards go in node then index order; each instance takes the first card with a free placement
    of the smallest serving profile, at the lowest free start.
    HAMi's order differs in two ways: it tries ``1g`` and ``3g`` placements from the top, and
    its nodes and cards come from its policies (``hami``: binpack nodes, spread cards).
    """
    table = TABLES[spec.table]
    mix = mix_of(spec.mix, table)
    devs = [d for j in range(spec.nodes) for d in inventory(f"node-{j:03d}", spec.cards, table).devices]
    capacity = len(devs) * table.slices
    total = spec.warmup + spec.measured
    arr = arrivals(mix, table, capacity, spec.load, total, spec.seed)
    sizes = [kind.count * table.serving(kind.memory_mib).size for kind in mix.kinds]
    wanted = migs.demand(devs[0], mix.workload(table))
    taken = [0] * len(devs)
    departures: list[tuple[float, int, tuple[tuple[int, int], ...]]] = []
    used = accepted = rejected = offered = got = 0
    stranded_sum = weighted_sum = free_sum = util_sum = 0.0
    kind_arrived = [0] * len(mix.kinds)
    kind_accepted = [0] * len(mix.kinds)
    start = time.perf_counter()
    for a in range(total):
        now = float(arr.times[a])
        while departures and departures[0][0] <= now:
            _, _, held = heapq.heappop(departures)
            for c, m in held:
                taken[c] &= ~m
                used -= m.bit_count()
        k = int(arr.kinds[a])
        kind = mix.kinds[k]
        held_now: list[tuple[int, int]] = []
        for _ in range(kind.count):
            for c, dev in enumerate(devs):
                got_slice = lowest_free(dev, taken[c], kind.memory_mib)
                if got_slice is not None:
                    m = _mask(mig.Placement(got_slice.start, got_slice.size))
                    taken[c] |= m
                    held_now.append((c, m))
                    break
            else:
                break
        placed = len(held_now) == kind.count
        if not placed:
            for c, m in held_now:
                taken[c] &= ~m
        measured = a >= spec.warmup
        if measured:
            util_sum += used / capacity
            offered += sizes[k]
            kind_arrived[k] += 1
        if placed:
            used += sum(m.bit_count() for _, m in held_now)
            heapq.heappush(departures, (now + float(arr.lifetimes[a]), a, tuple(held_now)))
            if measured:
                accepted += 1
                got += sizes[k]
                kind_accepted[k] += 1
        elif measured:
            rejected += 1
            si, wi, fi = _stranded_cards(devs, taken, wanted)
            stranded_sum, weighted_sum, free_sum = stranded_sum + si, weighted_sum + wi, free_sum + fi
    per = max(1, rejected)
    return Result(
        spec,
        spec.measured,
        accepted,
        rejected,
        offered,
        got,
        stranded_sum / per,
        weighted_sum / per,
        free_sum / per,
        util_sum / max(1, spec.measured),
        time.perf_counter() - start,
        tuple(zip(kind_arrived, kind_accepted, strict=True)),
    )


def simulate_ideal(spec: Spec) -> Result:
    """A reference without MIG's alignment, to bound what a placement rule can gain.

    A card takes an instance whenever it has that many free slices (best fit: the card with the
    fewest free slices that still holds it). Not a scheduler: no placement table realises it.
    Stranded slices are 0 by construction.
    """
    table = TABLES[spec.table]
    mix = mix_of(spec.mix, table)
    cards = spec.nodes * spec.cards
    capacity = cards * table.slices
    total = spec.warmup + spec.measured
    arr = arrivals(mix, table, capacity, spec.load, total, spec.seed)
    sizes = [table.serving(kind.memory_mib).size for kind in mix.kinds]
    free = [table.slices] * cards
    departures: list[tuple[float, int, tuple[int, ...], int]] = []
    used = accepted = rejected = offered = got = 0
    free_sum = util_sum = 0.0
    kind_arrived = [0] * len(mix.kinds)
    kind_accepted = [0] * len(mix.kinds)
    start = time.perf_counter()
    for a in range(total):
        now = float(arr.times[a])
        while departures and departures[0][0] <= now:
            _, _, held, size = heapq.heappop(departures)
            for c in held:
                free[c] += size
            used -= size * len(held)
        k = int(arr.kinds[a])
        size, count = sizes[k], mix.kinds[k].count
        held_now: list[int] = []
        for _ in range(count):
            fits = [c for c in range(cards) if free[c] >= size]
            if not fits:
                break
            c = min(fits, key=lambda x: (free[x], x))
            free[c] -= size
            held_now.append(c)
        placed = len(held_now) == count
        if not placed:
            for c in held_now:
                free[c] += size
        measured = a >= spec.warmup
        if measured:
            util_sum += used / capacity
            offered += size * count
            kind_arrived[k] += 1
        if placed:
            used += size * count
            heapq.heappush(departures, (now + float(arr.lifetimes[a]), a, tuple(held_now), size))
            if measured:
                accepted += 1
                got += size * count
                kind_accepted[k] += 1
        elif measured:
            rejected += 1
            free_sum += sum(free)
    return Result(
        spec,
        spec.measured,
        accepted,
        rejected,
        offered,
        got,
        0.0,
        0.0,
        free_sum / max(1, rejected),
        util_sum / max(1, spec.measured),
        time.perf_counter() - start,
        tuple(zip(kind_arrived, kind_accepted, strict=True)),
    )


def simulate(spec: Spec) -> tuple[Result, dict[str, nodes.NodeState]]:
    """Simulate one spec: its figures and the nodes' states after the last arrival."""
    table = TABLES[spec.table]
    variant = VARIANTS[spec.variant]
    mix = mix_of(spec.mix, table)
    names = [f"node-{j:03d}" for j in range(spec.nodes)]
    states: dict[str, nodes.NodeState] = {
        n: nodes.empty_state(inventory(n, spec.cards, table)) for n in names
    }
    capacity = spec.nodes * spec.cards * table.slices
    total = spec.warmup + spec.measured
    arr = arrivals(mix, table, capacity, spec.load, total, spec.seed)
    pods = [pod_of(f"kind-{k}", kind) for k, kind in enumerate(mix.kinds)]
    sizes = [kind.count * table.serving(kind.memory_mib).size for kind in mix.kinds]
    node_policy = registry.get(variant.node_policy)
    card_policy = registry.card_policy(variant.card_policy)
    target = mix.workload(table)
    ctx = api.Context(workload=target if variant.learns else None, mig_rule=variant.mig_rule)
    wanted = migs.demand(states[names[0]].inventory.devices[0], target)
    departures: list[tuple[float, int, str, allocations.PodAllocation]] = []
    used = 0
    accepted = rejected = offered = got = 0
    stranded_sum = weighted_sum = free_sum = 0.0
    util_sum = 0.0
    kind_arrived = [0] * len(mix.kinds)
    kind_accepted = [0] * len(mix.kinds)
    start = time.perf_counter()
    for a in range(total):
        now = float(arr.times[a])
        while departures and departures[0][0] <= now:
            _, _, name, alloc = heapq.heappop(departures)
            states[name] = allocations.apply(states[name], alloc, -1)
            used -= _slices(alloc)
        k = int(arr.kinds[a])
        kind = mix.kinds[k]
        pod = pods[k]
        chosen = place(states, names, kind, pod, node_policy, card_policy, ctx)
        measured = a >= spec.warmup
        if measured:
            util_sum += used / capacity
            offered += sizes[k]
            kind_arrived[k] += 1
        if chosen is not None:
            winner, placed = chosen
            states[winner] = allocations.apply(states[winner], placed)
            used += _slices(placed)
            heapq.heappush(departures, (now + float(arr.lifetimes[a]), a, winner, placed))
            if measured:
                accepted += 1
                got += sizes[k]
                kind_accepted[k] += 1
        elif measured:
            rejected += 1
            s = w = f = 0.0
            for n in names:
                si, wi, fi = stranded(states[n], wanted)
                s, w, f = s + si, w + wi, f + fi
            stranded_sum, weighted_sum, free_sum = stranded_sum + s, weighted_sum + w, free_sum + f
    wall = time.perf_counter() - start
    per = max(1, rejected)
    result = Result(
        spec,
        spec.measured,
        accepted,
        rejected,
        offered,
        got,
        stranded_sum / per,
        weighted_sum / per,
        free_sum / per,
        util_sum / max(1, spec.measured),
        wall,
        tuple(zip(kind_arrived, kind_accepted, strict=True)),
    )
    return result, states


def run_all(specs: Sequence[Spec], workers: int) -> list[Result]:
    """Every spec (a process pool when ``workers`` > 1), results in spec order."""
    return experiment.run_many(run, specs, workers)


def _slices(alloc: allocations.PodAllocation) -> int:
    return sum(g.mig.size for c in alloc.containers for g in c if g.mig is not None)


@dataclasses.dataclass(frozen=True)
class Row:
    """One (mix, variant) over its seeds: mean and sample sd of each figure."""

    mix: str
    variant: str
    seeds: int
    acceptance: tuple[float, float]
    accepted: tuple[float, float]
    accepted_slices: tuple[float, float]
    stranded: tuple[float, float]
    stranded_weighted: tuple[float, float]
    free: tuple[float, float]
    utilization: tuple[float, float]
    gain: tuple[float, float] | None
    """Accepted requests over the baseline's on the same seeds, minus 1 (None for the baseline)."""
    slice_gain: tuple[float, float] | None
    """The same for accepted slices."""


def _ms(xs: Sequence[float]) -> tuple[float, float]:
    return (statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0)


def summarize(results: Sequence[Result], baseline: str = "hami") -> list[Row]:
    """Rows per (mix, variant) in first-seen order; ``gain`` is paired by seed against ``baseline``."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        groups.setdefault((r.spec.mix, r.spec.variant), []).append(r)
    rows: list[Row] = []
    for (mix, variant), rs in groups.items():
        base = {r.spec.seed: r for r in groups.get((mix, baseline), [])}
        paired = [(r, base[r.spec.seed]) for r in rs if r.spec.seed in base]
        ratios = [r.accepted / b.accepted - 1 for r, b in paired if b.accepted]
        slice_ratios = [r.accepted_slices / b.accepted_slices - 1 for r, b in paired if b.accepted_slices]
        rows.append(
            Row(
                mix,
                variant,
                len(rs),
                _ms([r.acceptance for r in rs]),
                _ms([r.accepted for r in rs]),
                _ms([r.accepted_slices for r in rs]),
                _ms([r.stranded for r in rs]),
                _ms([r.stranded_weighted for r in rs]),
                _ms([r.free for r in rs]),
                _ms([r.utilization for r in rs]),
                None if variant == baseline or not ratios else _ms(ratios),
                None if variant == baseline or not slice_ratios else _ms(slice_ratios),
            )
        )
    return rows


def markdown(rows: Sequence[Row], baseline: str = "hami") -> str:
    """The rows as a markdown table (mean ± sd over seeds; ``gain`` against ``baseline``)."""

    def pm(v: tuple[float, float], digits: int = 1, scale: float = 1.0) -> str:
        return f"{v[0] * scale:.{digits}f} ± {v[1] * scale:.{digits}f}"

    def pct(v: tuple[float, float] | None) -> str:
        return "—" if v is None else f"{v[0] * 100:+.1f} ± {v[1] * 100:.1f} %"

    lines = [
        f"| mix | variant | accepted | accepted % | vs {baseline} | accepted slices | vs {baseline} "
        "| slices held % | stranded at rejection | stranded (weighted) | free at rejection |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        gain = pct(r.gain)
        lines.append(
            f"| {r.mix} | {r.variant} | {pm(r.accepted)} | {pm(r.acceptance, 2, 100)} | {gain} | "
            f"{pm(r.accepted_slices, 0)} | {pct(r.slice_gain)} | {pm(r.utilization, 1, 100)} | "
            f"{pm(r.stranded, 2)} | {pm(r.stranded_weighted, 2)} | {pm(r.free, 1)} |"
        )
    return "\n".join(lines)
