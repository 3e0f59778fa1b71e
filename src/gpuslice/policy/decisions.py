"""The shadow-mode record: what the extender decided for every bound GPU pod, and what it started from.

``gpuslice serve --shadow-policy NAME[,NAME]`` writes it (``extender.shadow``: the
``--shadow-record`` JSON lines and ``GET /shadow/decisions``) and ``gpuslice shadow report``
reads it back to re-play the run through the policies (``sim.shadowreport``); both use these
structs, so the writer and the reader cannot drift apart. A record is a tagged union (the
``type`` field of each JSON line): a ``start`` (every node's inventory and usage just before the
first decision of an extender process, and the policies), ``workload`` (the target workload the
learning policies see from then on), one ``decision`` per bound GPU pod (its request, the
candidate nodes, the live node and cards, and each shadow policy's ``Choice``) and a
``departure`` when a recorded pod leaves. The format is described for operators in
``docs/shadow.md``.
"""

from __future__ import annotations

import msgspec

from gpuslice.model import allocations, nodes, requests
from gpuslice.policy import api

AGREE_CARDS = "cards"
"""Same node and the same cards per container."""
AGREE_NODE = "node"
"""Same node, other cards."""
AGREE_NONE = "none"
"""Another node, or no node at all."""
AGREEMENTS = (AGREE_CARDS, AGREE_NODE, AGREE_NONE)

Cards = tuple[tuple[str, ...], ...]
"""Per container (init containers first), the UUIDs of its cards, sorted."""


class Choice(msgspec.Struct, frozen=True, kw_only=True):
    """One shadow policy's choice for one pod.

    Attributes:
        policy: the shadow policy.
        node: the node it would choose ('' when no candidate fits).
        cards: its cards there (``Cards``).
        score: its score (0..100, after its candidate step) of that node.
        live_score: its score of the live node; None when the live node is not feasible for it.
        delta: ``score - live_score`` (None when either is absent).
        agreement: ``cards``, ``node`` or ``none``.
    """

    policy: str
    node: str
    cards: Cards = ()
    score: int | None = None
    live_score: int | None = None
    delta: int | None = None
    agreement: str = AGREE_NONE


class Start(msgspec.Struct, frozen=True, kw_only=True, tag="start"):
    """The state a run of the extender starts its record from.

    Attributes:
        time: wall clock (seconds).
        node_policy: the live node policy.
        card_policy: the live card policy.
        shadow_policies: the shadow policies.
        fallback: ``workload_fallback``: stands in for a learning policy while the workload is untrusted.
        nodes: every registered node, inventory and usage, just before the first decision.
    """

    time: float
    node_policy: str
    card_policy: str
    shadow_policies: tuple[str, ...]
    fallback: str
    nodes: tuple[nodes.NodeState, ...]


class Workload(msgspec.Struct, frozen=True, kw_only=True, tag="workload"):
    """The target workload the learning policies see from here on (None: untrusted)."""

    time: float
    workload: api.Workload | None


class Decision(msgspec.Struct, frozen=True, kw_only=True, tag="decision"):
    """One bound GPU pod.

    Attributes:
        time: wall clock when the bind completed.
        key: ``namespace/name``.
        uid: pod UID.
        request: the pod's GPU request (shape, selectors, host CPU and memory).
        candidates: the GPU nodes the filter was offered, or None when they were every node
            known at ``Start`` and no other.
        node: the live node.
        allocation: the live cards (per container, with memory and cores).
        shadows: one choice per shadow policy (empty when the filter's snapshot was not kept).
    """

    time: float
    key: str
    uid: str
    request: requests.PodRequest
    candidates: tuple[str, ...] | None
    node: str
    allocation: allocations.PodAllocation
    shadows: tuple[Choice, ...] = ()


class Departure(msgspec.Struct, frozen=True, kw_only=True, tag="departure"):
    """A pod of an earlier decision left (deleted or finished)."""

    time: float
    key: str
    uid: str


Record = Start | Workload | Decision | Departure


def cards_of(alloc: allocations.PodAllocation | None) -> Cards:
    """The card UUIDs per container of an allocation, sorted in each (``()`` for None)."""
    if alloc is None:
        return ()
    return tuple(tuple(sorted(g.uuid for g in grants)) for grants in alloc.containers)
