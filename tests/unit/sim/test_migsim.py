"""The MIG simulator: deterministic, HAMi's rule as ``policy.mig.first_fit``, sound end states."""

from __future__ import annotations

import dataclasses

import pytest

from gpuslice.framework import registry
from gpuslice.model import allocations, mig, nodes
from gpuslice.policy import api, fit
from gpuslice.policy import mig as migs
from gpuslice.sim import migsim

TABLE = migsim.A100_40GB


def _small(variant: str, mix: str, seed: int, load: float = 1.4) -> migsim.Spec:
    """A small run: 2 nodes, 20 arrivals of warm-up, 120 measured."""
    return migsim.Spec(variant, mix, seed, nodes=2, load=load, warmup=20, measured=120)


def _figures(r: migsim.Result) -> dict[str, object]:
    d = dataclasses.asdict(r)
    d.pop("wall_seconds")
    return d


@pytest.mark.parametrize("variant", ["hami", "gpuslice"])
def test_same_seed_same_run(variant: str) -> None:
    a = migsim.run(_small(variant, "synthetic", 3))
    b = migsim.run(_small(variant, "synthetic", 3))
    assert _figures(a) == _figures(b)
    c = migsim.run(_small(variant, "synthetic", 4))
    assert _figures(c) != _figures(a)


@pytest.mark.parametrize("mix", migsim.MIXES)
@pytest.mark.parametrize("variant", [v for v, spec in migsim.VARIANTS.items() if not spec.reference])
def test_counts_add_up_and_slices_never_overlap(mix: str, variant: str) -> None:
    spec = _small(variant, mix, 7, load=1.5)
    r, states = migsim.simulate(spec)
    assert r.accepted + r.rejected == r.arrivals == spec.measured
    assert sum(a for a, _ in r.by_kind) == r.arrivals
    assert sum(c for _, c in r.by_kind) == r.accepted
    assert all(0 <= c <= a for a, c in r.by_kind)
    assert 0 < r.accepted_slices <= r.offered_slices
    assert r.rejected > 0  # above capacity: saturation reached
    assert 0.0 <= r.stranded <= r.free and 0.0 <= r.stranded_weighted <= r.free
    held = 0
    for state in states.values():
        for dev, usage in zip(state.inventory.devices, state.usage, strict=True):
            assert mig.overlapping(usage.mig) == []
            assert all(migs.legal(dev, s) for s in usage.mig)
            assert usage.slots == len(usage.mig)
            held += sum(s.size for s in usage.mig)
    assert 0 < held <= spec.nodes * spec.cards * TABLE.slices


def test_hami_rule_places_as_first_fit() -> None:
    """On one card, HAMi's variant gives every request exactly ``mig.first_fit``'s instance."""
    inv = migsim.inventory("n0", 1, TABLE)
    states = {"n0": nodes.empty_state(inv)}
    v = migsim.VARIANTS["hami"]
    ctx = api.Context(mig_rule=v.mig_rule)
    node_policy, card_policy = registry.get(v.node_policy), registry.card_policy(v.card_policy)
    dev = inv.devices[0]
    asks = ["1g.5gb", "3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb", "3g.20gb", "1g.5gb"]
    got: list[mig.Slice] = []
    for name in asks:
        kind = migsim.Kind(TABLE.profile(name).memory_mib, 1)
        taken = migs.occupied(dev, states["n0"].usage[0])
        expect = migs.first_fit(dev, taken, kind.memory_mib)
        chosen = migsim.place(states, ["n0"], kind, migsim.pod_of(name, kind), node_policy, card_policy, ctx)
        if expect is None:
            assert chosen is None
            continue
        assert chosen is not None
        (grant,) = chosen[1].containers[0]
        assert grant.mig == expect
        got.append(expect)
        states["n0"] = allocations.apply(states["n0"], chosen[1])
    # HAMi's order: 1g from the top (6); 3g from the top, but 4..7 holds the 1g, so 0; 2g from the
    # bottom, 0 and 2 taken, so 4; then no 1g is left (slice 7 serves only the 7g) and no 3g.
    assert got == [mig.Slice(6, 1, "1g.5gb"), mig.Slice(0, 4, "3g.20gb"), mig.Slice(4, 2, "2g.10gb")]
    assert mig.overlapping(states["n0"].usage[0].mig) == []


def test_hami_rule_spreads_over_cards_in_card_order() -> None:
    """Two cards: HAMi's spread card policy puts the second 1g on the other (emptier) card."""
    inv = migsim.inventory("n0", 2, TABLE)
    states = {"n0": nodes.empty_state(inv)}
    v = migsim.VARIANTS["hami"]
    ctx = api.Context(mig_rule=v.mig_rule)
    node_policy, card_policy = registry.get(v.node_policy), registry.card_policy(v.card_policy)
    kind = migsim.Kind(TABLE.profile("1g.5gb").memory_mib, 1)
    cards = []
    for _ in range(2):
        chosen = migsim.place(states, ["n0"], kind, migsim.pod_of("p", kind), node_policy, card_policy, ctx)
        assert chosen is not None
        (grant,) = chosen[1].containers[0]
        assert grant.mig == mig.Slice(6, 1, "1g.5gb")
        cards.append(grant.uuid)
        states["n0"] = allocations.apply(states["n0"], chosen[1])
    assert len(set(cards)) == 2


def test_request_mapping() -> None:
    """A share asks ceil(share x card memory) MiB (smallest serving profile); whole GPUs the 7g."""
    assert TABLE.serving(migsim.request_memory(100, 1, TABLE).memory_mib).name == "1g.5gb"
    assert TABLE.serving(migsim.request_memory(120, 1, TABLE).memory_mib).name == "2g.10gb"  # 4916 MiB
    assert TABLE.serving(migsim.request_memory(470, 1, TABLE).memory_mib).name == "3g.20gb"
    assert TABLE.serving(migsim.request_memory(500, 1, TABLE).memory_mib).name == "7g.40gb"  # 20480 MiB
    assert migsim.request_memory(1000, 4, TABLE) == migsim.Kind(40192, 4)
    mix = migsim.synthetic_mix(TABLE)
    assert sum(mix.weights) == pytest.approx(1.0)
    # the learned workload maps every kind back to the profile that serves it
    wl = mix.workload(TABLE)
    dev = migsim.inventory("n", 1, TABLE).devices[0]
    want = dict(migs.demand(dev, wl))
    served = {migs.candidates(dev, k.memory_mib)[0] for k in mix.kinds}
    assert set(want) == served


def test_may_fit_never_drops_a_feasible_node() -> None:
    """``may_fit`` is False only where ``fit.place`` (through ``place``) finds nothing."""
    spec = _small("hami", "alibaba", 5, load=1.5)
    _, states = migsim.simulate(spec)
    v = migsim.VARIANTS["gpuslice"]
    ctx = api.Context(mig_rule=v.mig_rule)
    card_policy = registry.card_policy(v.card_policy)
    checked = 0
    for state in states.values():
        for p in TABLE.profiles:
            for count in (1, 2, 3):
                kind = migsim.Kind(p.memory_mib, count)
                if not migsim.may_fit(state, kind):
                    pod = migsim.pod_of("p", kind)
                    assert fit.place(state, pod, card_policy, ctx).allocation is None
                    checked += 1
    assert checked > 0


@pytest.mark.parametrize("mix", migsim.MIXES)
def test_ideal_reference_counts_add_up_and_bounds_slices(mix: str) -> None:
    """The alignment-free reference: consistent counts, never more slices held than exist."""
    spec = _small("ideal", mix, 7, load=1.5)
    r = migsim.run(spec)
    assert r.accepted + r.rejected == r.arrivals == spec.measured
    assert sum(c for _, c in r.by_kind) == r.accepted
    assert 0 < r.accepted_slices <= r.offered_slices
    assert 0.0 < r.utilization <= 1.0
    assert r.stranded == r.stranded_weighted == 0.0
    assert _figures(migsim.run(spec)) == _figures(r)


@pytest.mark.parametrize("mix", migsim.MIXES)
def test_lowest_first_reference_counts_add_up(mix: str) -> None:
    """Textbook first fit: consistent counts, stranding bounded by the free slices, deterministic."""
    spec = _small("lowest-first", mix, 7, load=1.5)
    r = migsim.run(spec)
    assert r.accepted + r.rejected == r.arrivals == spec.measured
    assert sum(c for _, c in r.by_kind) == r.accepted
    assert 0 < r.accepted_slices <= r.offered_slices
    assert r.rejected > 0
    assert 0.0 <= r.stranded <= r.free and 0.0 <= r.stranded_weighted <= r.free
    assert 0.0 < r.utilization <= 1.0
    assert _figures(migsim.run(spec)) == _figures(r)


def test_lowest_first_takes_the_lowest_free_start_where_hami_takes_the_top() -> None:
    dev = migsim.inventory("n", 1, TABLE).devices[0]
    one_g = min(p.memory_mib for p in TABLE.profiles)
    assert migsim.lowest_free(dev, 0, one_g) == mig.Slice(0, 1, "1g.5gb")
    assert migs.first_fit(dev, 0, one_g) == mig.Slice(6, 1, "1g.5gb")
    # Slices 0-3 taken: the 1g goes to 4, and a 3g.20gb to its placement at 4.
    assert migsim.lowest_free(dev, 0b1111, one_g) == mig.Slice(4, 1, "1g.5gb")
    three_g = next(p for p in TABLE.profiles if p.name == "3g.20gb")
    assert migsim.lowest_free(dev, 0b1111, three_g.memory_mib) == mig.Slice(4, 4, "3g.20gb")
    assert migsim.lowest_free(dev, 0b1111111, one_g) is None
