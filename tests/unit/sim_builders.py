"""Builders for simulated (trace-style) nodes and pods: cards of 100 cores, shares in milli-GPU."""

from __future__ import annotations

from gpuslice.model import nodes
from gpuslice.policy import shares
from gpuslice.sim import trace


def sim_state(
    free: tuple[int, ...],
    *,
    cpu: int = 64000,
    cpu_free: int | None = None,
    model: str = "G2",
    tags: tuple[str, ...] = (),
    name: str = "n",
) -> shares.TaggedNodeState:
    """A node whose card i has ``free[i]`` milli free (one task), ``cpu_free`` of ``cpu`` CPU free."""
    inv = trace.node_inventory(name, cpu, 1 << 20, len(free), model)
    usage = []
    for dev, f in zip(inv.devices, free, strict=True):
        used = shares.FULL - f
        if used <= 0:
            usage.append(nodes.EMPTY_CARD)
        else:
            pct = used // 10
            usage.append(nodes.CardUsage(slots=1, memory_mib=dev.memory_mib * pct // 100, cores=pct))
    counts: tuple[tuple[str, int], ...] = ()
    for t in tags:
        counts = shares.add_tag(counts, t, 1)
    state = nodes.NodeState(
        inventory=inv,
        usage=tuple(usage),
        cpu_used_milli=0 if cpu_free is None else cpu - cpu_free,
    )
    return shares.tagged(state, counts)


def sim_pod(cpu: int = 1000, share: int = 0, count: int = 0, memory: int = 0) -> trace.TracePod:
    """A trace pod: ``count`` cards of ``share`` milli each (0/0 = CPU-only)."""
    return trace.make_pod("p", cpu, memory, count, share)
