"""Audit GPU sharing from the API alone: node registrations against the pods' device annotations.

Built on ``hamiwire``'s decoders (HAMi's formats read from HAMi's source, not through gpuslice's
codec). A pod counts when it carries ``hami.io/vgpu-devices-allocated`` and has not finished
(phase Succeeded or Failed), whoever placed it. Every container's grants are summed, init
containers included. That is an upper bound of HAMi's charge, which takes the larger of the init
peak and the app sum, so a pod with GPU init containers could be flagged although HAMi would fit
it. The migration test's pods have none.

Problems reported, one line each:

- a pod whose ``hami.io/vgpu-node`` differs from ``spec.nodeName``, or that claims cards while
  unbound (a bind writes the claim just before the Binding, so at rest there is none);
- a grant on a card that the pod's node does not register;
- a card whose granted memory, cores or slots (one per container grant) exceed its registration
  (on a MIG card only slots: its instances are checked by placement, and the profiles' cores are
  rounded up, so seven ``1g`` instances of an A100 hold 105 % in sum);
- a card held whole by one pod (all its memory, or all of a 100-core card's cores: HAMi's exclusive
  card) and shared with another pod;
- an annotation that does not decode;
- every MIG finding of ``migaudit`` (illegal or overlapping instances, missing runtime identity,
  grants that differ from their profile, a card of the wrong mode).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from tests.e2e import hamiwire, migaudit

FULL_CORES = 100


@dataclasses.dataclass
class Use:
    """What the counted pods hold on one card."""

    memory_mib: int = 0
    cores: int = 0
    grants: int = 0
    pods: set[str] = dataclasses.field(default_factory=set)
    whole: set[str] = dataclasses.field(default_factory=set)
    """Pods holding the card whole."""


@dataclasses.dataclass
class Audit:
    """The cards, their use and the problems found."""

    cards: dict[str, hamiwire.Card]
    use: dict[str, Use]
    problems: list[str]

    def free_memory(self, uuid: str) -> int:
        return self.cards[uuid].memory_mib - self.use[uuid].memory_mib

    def free_cores(self, uuid: str) -> int:
        return self.cards[uuid].cores - self.use[uuid].cores


def _key(pod: Mapping[str, Any]) -> str:
    return f"{pod['metadata'].get('namespace', '')}/{pod['metadata']['name']}"


def counted(pod: Mapping[str, Any]) -> bool:
    """True when the pod holds cards: it carries a device claim and has not finished."""
    ann = pod["metadata"].get("annotations") or {}
    phase = (pod.get("status") or {}).get("phase")
    return hamiwire.ALLOCATED in ann and phase not in ("Succeeded", "Failed")


def registered(nodes: Iterable[Mapping[str, Any]]) -> tuple[dict[str, hamiwire.Card], list[str]]:
    """Every registered card by UUID, and the registrations that did not decode."""
    cards: dict[str, hamiwire.Card] = {}
    problems = []
    for node in nodes:
        name = node["metadata"]["name"]
        value = (node["metadata"].get("annotations") or {}).get(hamiwire.NODE_REGISTER)
        if value is None:
            continue
        try:
            for card in hamiwire.decode_register(name, value):
                cards[card.uuid] = card
        except (ValueError, KeyError) as err:
            problems.append(f"node {name}: registration does not decode: {err}")
    return cards, problems


def audit(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> Audit:
    """Check the pods' grants against the nodes' registrations (see the module docstring)."""
    nodes, pods = list(nodes), list(pods)
    cards, problems = registered(nodes)
    problems.extend(migaudit.findings(nodes, pods))
    mig_cards = {u for u, c in migaudit.cards_of(nodes).items() if c.mode == migaudit.MODE_MIG}
    use = {uuid: Use() for uuid in cards}
    for pod in pods:
        if not counted(pod):
            continue
        key = _key(pod)
        ann = pod["metadata"]["annotations"]
        bound = (pod.get("spec") or {}).get("nodeName") or ""
        claimed = ann.get(hamiwire.VGPU_NODE, "")
        if not bound:
            problems.append(f"pod {key}: claims cards on {claimed!r} but is not bound")
            continue
        if claimed != bound:
            problems.append(f"pod {key}: vgpu-node {claimed!r} but bound to {bound!r}")
        try:
            containers = hamiwire.decode_pod_devices(ann[hamiwire.ALLOCATED])
        except ValueError as err:
            problems.append(f"pod {key}: devices do not decode: {err}")
            continue
        for grants in containers:
            for g in grants:
                card = cards.get(g.uuid)
                if card is None or card.node != bound:
                    where = "no node" if card is None else f"node {card.node}"
                    problems.append(f"pod {key}: card {g.uuid} is registered by {where}, not by {bound}")
                    continue
                u = use[g.uuid]
                u.memory_mib += g.memory_mib
                u.cores += g.cores
                u.grants += 1
                u.pods.add(key)
                if g.memory_mib >= card.memory_mib or (card.cores == FULL_CORES and g.cores >= card.cores):
                    u.whole.add(key)
    for uuid, u in use.items():
        card = cards[uuid]
        where = f"card {card.node}/{card.index} ({uuid})"
        if u.memory_mib > card.memory_mib and uuid not in mig_cards:
            problems.append(f"{where}: {u.memory_mib} MiB granted, {card.memory_mib} registered")
        if u.cores > card.cores and uuid not in mig_cards:
            problems.append(f"{where}: {u.cores} % cores granted, {card.cores} registered")
        if u.grants > card.slots:
            problems.append(f"{where}: {u.grants} grants, {card.slots} slots")
        if u.whole and len(u.pods) > 1:
            problems.append(f"{where}: held whole by {sorted(u.whole)} yet shared by {sorted(u.pods)}")
    return Audit(cards=cards, use=use, problems=problems)
