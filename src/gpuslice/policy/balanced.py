"""``balanced``: a weighted multi-dimensional node score.

The pod is placed with ``fit.place`` (this policy's card choice: the emptiest cards by weighted
usage, as ``spread``; ties to the cooler card, then the lower index). With S the chosen cards
(all containers), usage ``u_i = 0.6 * memory_ratio + 0.4 * cores_ratio`` of every card *after*
placement, the score is ``floor(0.4 * U + 0.3 * A + 0.2 * T + 0.1 * F)`` where, each on 0..100:

* U, utilisation balance: ``100 * (1 - 2 * std(u))`` over the node's cards (population std; the
  largest std of values in [0, 1] is 0.5), clipped to 0..100. One card: 100.
* A, task affinity: like joins like. A fractional request (cores < 100 and memory below the whole
  card) scores the share of S already in use before placement (fractional tasks share cards and
  leave idle cards whole). A whole-card request scores the share of the node's other cards that
  are held exclusively (whole-card tasks gather on the same nodes); 100 when S is the whole node.
* T, thermal and power headroom of S from ``inventory.telemetry``: per card the mean of the
  readings present, temperature ``100 * clip((90 - t) / 60)`` (30 C or less = 100, 90 C or more = 0)
  and power ``100 * clip(1 - draw / limit)``; mean over cards with readings; 50 when none has any.
* F, memory fragmentation: ``100 * (1 - stranded / |S|)``, where a chosen card is stranded when
  its free memory after placement is above 0 but below 10 % of the card (a sliver nobody can use).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpuslice.model import allocations, devices, nodes, requests
from gpuslice.policy import cards, fit, registry, usage

W_BALANCE, W_AFFINITY, W_THERMAL, W_FRAGMENTATION = 0.4, 0.3, 0.2, 0.1
NEUTRAL = 50.0
HOT_C, COOL_C = 90.0, 30.0
STRANDED_FRACTION = 0.10


class Balanced:
    """See the module docstring."""

    name = "balanced"

    def __init__(self, args: Mapping[str, float]) -> None:
        """Validate the (empty) args."""
        if args:
            raise ValueError(f"balanced takes no args, got {sorted(args)}")

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: registry.Context,
    ) -> tuple[int, ...] | None:
        """The emptiest eligible cards after the request; ties to the cooler card, then index."""
        heads = _headrooms(state)
        wm, wc = usage.DEFAULT_MEMORY_WEIGHT, usage.DEFAULT_CORES_WEIGHT
        cool = [NEUTRAL if h is None else h for h in heads]
        ranked = sorted(eligible, key=lambda i: (usage.card_key(state, i, request, wm, wc), -cool[i], i))
        return tuple(ranked[: request.count])

    def score_node(
        self, state: nodes.NodeState, pod: requests.PodRequest, ctx: registry.Context
    ) -> registry.Scored:
        """The weighted score of the node after placing the pod."""
        placed = fit.place(state, pod, self, ctx)
        if placed.allocation is None:
            return registry.Scored(0)
        return registry.Scored(components(state, pod, placed.allocation)[-1])


def components(
    state: nodes.NodeState, pod: requests.PodRequest, alloc: allocations.PodAllocation
) -> tuple[float, float, float, float, int]:
    """(U, A, T, F, score) for a placement (exposed for tests and explanations)."""
    after = allocations.apply(state, alloc)
    devs = state.inventory.devices
    index = {d.uuid: i for i, d in enumerate(devs)}
    chosen = sorted({index[g.uuid] for c in alloc.containers for g in c if g.uuid in index})
    if not devs or not chosen:
        return (100.0, NEUTRAL, NEUTRAL, 100.0, registry.MAX_SCORE)
    wm, wc = usage.DEFAULT_MEMORY_WEIGHT, usage.DEFAULT_CORES_WEIGHT
    u = [_card_usage(d, after.usage[i], wm, wc) for i, d in enumerate(devs)]
    mean = sum(u) / len(u)
    std = math.sqrt(sum((x - mean) ** 2 for x in u) / len(u))
    balance = min(100.0, max(0.0, 100.0 * (1.0 - 2.0 * std)))
    affinity = _affinity(state, pod, chosen)
    heads = _headrooms(state)
    readings = [h for i in chosen if (h := heads[i]) is not None]
    thermal = sum(readings) / len(readings) if readings else NEUTRAL
    stranded = sum(1 for i in chosen if 0 < after.free_memory(i) < STRANDED_FRACTION * devs[i].memory_mib)
    frag = 100.0 * (1.0 - stranded / len(chosen))
    total = W_BALANCE * balance + W_AFFINITY * affinity + W_THERMAL * thermal + W_FRAGMENTATION * frag
    return (balance, affinity, thermal, frag, min(registry.MAX_SCORE, math.floor(total + 1e-9)))


def _card_usage(d: devices.GpuDevice, u: nodes.CardUsage, wm: float, wc: float) -> float:
    mem = 0.0 if d.memory_mib <= 0 else min(1.0, u.memory_mib / d.memory_mib)
    cores = 0.0 if d.cores <= 0 else min(1.0, u.cores / d.cores)
    return wm * mem + wc * cores


def _whole_card(pod: requests.PodRequest, card_memory: int) -> bool:
    gpu = [c for c in pod.containers if c is not None and c.count > 0]
    return bool(gpu) and all(c.exclusive or c.memory_on(card_memory) >= card_memory for c in gpu)


def _affinity(state: nodes.NodeState, pod: requests.PodRequest, chosen: list[int]) -> float:
    devs = state.inventory.devices
    if not _whole_card(pod, devs[chosen[0]].memory_mib):
        return 100.0 * sum(1 for i in chosen if state.usage[i].slots > 0) / len(chosen)
    others = [i for i in range(len(devs)) if i not in chosen]
    if not others:
        return 100.0
    held = sum(1 for i in others if cards.held_exclusively(devs[i], state.usage[i]))
    return 100.0 * held / len(others)


def _headrooms(state: nodes.NodeState) -> list[float | None]:
    """Per card, the mean of its temperature and power headrooms (None without readings)."""
    by_uuid = {t.uuid: t for t in state.inventory.telemetry}
    out: list[float | None] = []
    for d in state.inventory.devices:
        t = by_uuid.get(d.uuid)
        vals = []
        if t is not None and t.temperature_c is not None:
            vals.append(100.0 * _clip((HOT_C - t.temperature_c) / (HOT_C - COOL_C)))
        if t is not None and t.power_draw_w is not None and t.power_limit_w:
            vals.append(100.0 * _clip(1.0 - t.power_draw_w / t.power_limit_w))
        out.append(sum(vals) / len(vals) if vals else None)
    return out


def _clip(x: float) -> float:
    return min(1.0, max(0.0, x))


registry.register("balanced", Balanced)
