"""The preempt verb: pass kube-scheduler's victims through, dropping hopeless nodes.

A node stays a candidate only when it has at least one victim (kube-scheduler requires it) and the
pod could fit there once capacity is freed: a node where the fit is ``UNRESOLVABLE`` (wrong card
type, too few cards, unregistered) cannot be helped by evicting anyone, so it is dropped. Victim
sets are passed through unchanged.

Gangs are evicted whole or not at all, and placed whole or not at all (docs/gangs.md): a node whose
victims include a gang member is dropped (evicting one member would break its running gang), and
a preemptor that belongs to a gang gets no node (room for one member is not room for the gang).

This answers kube-scheduler's own preemption, which only ever finds victims for in-tree resources
(CPU, memory): the GPU resources are hidden from its fit. Preemption for GPU capacity is
gpuslice's own (``extender.preemption``, docs/preemption.md); the two act on different shortages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpuslice.extender import wire
from gpuslice.framework import cycle as cycles
from gpuslice.framework import profile as profiles
from gpuslice.framework import view
from gpuslice.model import requests, status


def keep_nonempty(victims: Mapping[str, wire.MetaVictims]) -> dict[str, wire.MetaVictims]:
    """The nodes that have at least one victim."""
    return {name: v for name, v in victims.items() if v.pods}


def _no_gang(uid: str) -> bool:
    return False


def narrow(
    snap: view.Snapshot,
    pod: requests.PodRequest,
    victims: Mapping[str, wire.MetaVictims],
    profile: profiles.Profile,
    in_gang: Callable[[str], bool] = _no_gang,
) -> dict[str, wire.MetaVictims]:
    """The candidate nodes where evicting could make room for the pod (see the module docstring).

    ``in_gang``: whether the pod of a UID belongs to a gang (such a victim drops its node).
    """
    if pod.gang is not None:
        return {}
    kept = {n: v for n, v in keep_nonempty(victims).items() if not any(in_gang(p.uid) for p in v.pods)}
    if not pod.wants_gpu:
        return kept
    cyc = cycles.Cycle.of(profile, snap, pod)
    out: dict[str, wire.MetaVictims] = {}
    for name, v in kept.items():
        state = cyc.state(name)
        if state is None:
            continue
        placement = cyc.place(state, quota=False)
        if placement.status.code is not status.Code.UNRESOLVABLE:
            out[name] = v
    return out
