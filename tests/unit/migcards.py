"""MIG cards for tests: an A100-80GB's GPU-instance profiles as NVML reports them.

``card(node, i, held)`` is a card in MIG mode; ``usage(held)`` what the given instances take on it
(one slot and the profile's memory and cores each, as the cache charges them).
"""

from __future__ import annotations

from gpuslice.model import devices, mig, nodes

A100_80 = "NVIDIA A100-SXM4-80GB"


def _profile(name: str, memory: int, cores: int, g: int, size: int, starts: tuple[int, ...]) -> mig.Profile:
    placements = tuple(mig.Placement(s, size) for s in starts)
    return mig.Profile(name=name, memory_mib=memory, cores=cores, slice_count=g, placements=placements)


PROFILES = (
    _profile("1g.10gb", 9728, 15, 1, 1, tuple(range(7))),
    _profile("1g.20gb", 19968, 15, 1, 2, (0, 2, 4, 6)),
    _profile("2g.20gb", 19968, 29, 2, 2, (0, 2, 4)),
    _profile("3g.40gb", 40192, 43, 3, 4, (0, 4)),
    _profile("4g.40gb", 40192, 58, 4, 4, (0,)),
    _profile("7g.80gb", 80896, 100, 7, 8, (0,)),
)


def card(uuid: str, index: int = 0) -> devices.GpuDevice:
    """An A100-80GB in MIG mode."""
    return devices.GpuDevice(
        uuid=uuid,
        index=index,
        type=A100_80,
        memory_mib=81920,
        cores=100,
        split_count=7,
        mode="mig",
        mig_profiles=PROFILES,
    )


def instance(profile: str, start: int) -> mig.Slice:
    """One instance of ``profile`` starting at slice ``start``."""
    prof = mig.find(PROFILES, profile)
    assert prof is not None
    return mig.Slice(start, prof.size, profile)


def usage(*held: mig.Slice) -> nodes.CardUsage:
    """What the instances take on a card."""
    out = nodes.EMPTY_CARD
    for s in held:
        prof = mig.find(PROFILES, s.profile)
        assert prof is not None
        out = out.plus(nodes.CardUsage(1, prof.memory_mib, prof.cores, (s,)))
    return out


def state(name: str, *cards: tuple[mig.Slice, ...]) -> nodes.NodeState:
    """A node whose card i is an A100-80GB in MIG mode holding ``cards[i]``."""
    devs = tuple(card(f"GPU-{name}-{i}", i) for i in range(len(cards)))
    inv = nodes.NodeInventory(name=name, devices=devs)
    return nodes.NodeState(inventory=inv, usage=tuple(usage(*held) for held in cards))
