"""Shadow mode: what other policies would have chosen for every pod the live policy bound.

``gpuslice serve --shadow-policy fgd-lookahead[,fgd]`` keeps the live policy in charge and, for each
GPU pod it binds, asks every shadow policy the same question on the same state: among the nodes
kube-scheduler offered the filter, which node (the extender's total order: the higher policy score
after the policy's candidate step, then the lower name; a node whose cards the policy refuses gives
way to the next) and which cards (``fit.place`` with the shadow policy as card policy). Nothing the
shadow decides is acted on.

Cost. A filter that found a node only keeps a reference to the snapshot it judged and the
candidate names (``Shadow.seen``, a memo insert); the shadow evaluation runs once per *bound*
pod, after the bind has answered (``Shadow.bound`` schedules it on the event loop), on that kept
snapshot, so the shadow sees exactly what the live policy saw and filter and prioritize carry no
extra work. Shadow off costs one ``is None`` test per filter. A pod bound without a kept
snapshot (a restart between its filter and its bind, or more than ``PENDING`` pods in between) is
recorded without shadow choices.

A shadow policy applies to every pod: the pod's own ``hami.io/node-scheduler-policy`` and
``hami.io/gpu-scheduler-policy`` are ignored for it. A learning policy (fgd, fgd-lookahead) gives way
to ``workload_fallback`` while the learned workload is untrusted, as a live one does
(``profile.Profile``).

Each decision compares the shadow's choice with the live one: ``cards`` (same node, same cards per
container), ``node`` (same node, other cards) or ``none`` (another node, or no node at all). The
score delta is the shadow policy's own score (after its candidate step, 0..100) of the node it
chose minus its score of the live node: 0 when they agree on the node, positive when the shadow
prefers another node by that much; absent when the live node is not feasible for the shadow policy
or the shadow found no node.

The record (``--shadow-record PATH``, JSON lines, appended; and ``GET /shadow/decisions``) holds
what ``gpuslice shadow report`` needs to re-play the run (``docs/shadow.md``): a ``start`` record
(every node's inventory and usage just before the first decision of this process, and the
policies), ``workload`` records (the target workload the learning policies saw, whenever it
changed), one ``decision`` per bound GPU pod (its request, the candidate nodes when not every
known node, the live node and allocation, and each shadow choice) and a ``departure`` when a pod
of a decision leaves (``capacity_freed``, from the pod watch).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import msgspec
import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gpuslice.cache import cache as caches
from gpuslice.extender import config
from gpuslice.extender import metrics as extender_metrics
from gpuslice.framework import cycle as cycles
from gpuslice.framework import memo, view
from gpuslice.framework import profile as profiles
from gpuslice.model import allocations, nodes, requests
from gpuslice.policy import api, decisions

RECENT = 20
"""Disagreements kept per policy for ``summary()``."""
KEEP = 50_000
"""Records kept in memory for ``GET /shadow/decisions`` (the file keeps every one)."""
PENDING = 256
"""Filtered pods (with a feasible node) whose snapshot is kept for their bind. A snapshot pins its
node map and columns, so few are kept: a pod binds right after its filter; one whose entry was
pushed out is recorded without shadow choices (``unevaluated``)."""
PENDING_BYTES = 64 << 20
"""The bytes those entries may pin: their candidate names, and each snapshot once (module
``_Seen.weigh``)."""

ENCODER = msgspec.json.Encoder()


def agreement(live_node: str, live_cards: decisions.Cards, node: str, cards: decisions.Cards) -> str:
    """``cards``, ``node`` or ``none`` (see the module docstring)."""
    if not node or node != live_node:
        return decisions.AGREE_NONE
    return decisions.AGREE_CARDS if cards == live_cards else decisions.AGREE_NODE


def choose(
    snap: view.Snapshot,
    pod: requests.PodRequest,
    names: Sequence[str],
    profile: profiles.Profile,
    live_node: str,
    live_cards: decisions.Cards,
) -> decisions.Choice:
    """What ``profile`` (a shadow's defaults, pod overrides stripped) chooses among ``names``.

    The pod's cycle: its evaluation, the candidate step and ``Cycle.first_placed``
    (``batch.best_first``, ``fit.place``), as the live filter with ``node_choice: extender`` does.
    """
    cyc = cycles.Cycle.of(profile, snap, pod)
    ev = cyc.evaluate(names)
    idx = np.flatnonzero(ev.feasible).tolist()
    feasible = [ev.names[i] for i in idx]
    name = profile.node_default
    if not feasible:
        return decisions.Choice(policy=name, node="")
    stepped = cyc.stepped(ev.scores[idx])
    live_score = None
    if live_node in feasible:
        live_score = int(stepped[feasible.index(live_node)])
    won = cyc.first_placed(feasible, stepped)
    if won is None:
        return decisions.Choice(policy=name, node="", live_score=live_score)
    i, alloc = won
    node, cards, score = feasible[i], decisions.cards_of(alloc), int(stepped[i])
    return decisions.Choice(
        policy=name,
        node=node,
        cards=cards,
        score=score,
        live_score=live_score,
        delta=None if live_score is None else score - live_score,
        agreement=agreement(live_node, live_cards, node, cards),
    )


@dataclasses.dataclass
class _Tally:
    """Running counts of one shadow policy."""

    decisions: int = 0
    node: int = 0
    cards: int = 0
    unplaced: int = 0
    deltas: int = 0
    delta_sum: int = 0
    recent: collections.deque[dict[str, Any]] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=RECENT)
    )


@dataclasses.dataclass(frozen=True)
class _Seen:
    """What the filter judged a pod on: the snapshot and the candidates it was offered."""

    snap: view.Snapshot
    names: tuple[str, ...]
    pinned: int
    """Bytes of ``snap`` this entry is charged with: its columns and node map when the entry put
    before it held another snapshot, else 0 (filters in a row share one snapshot)."""

    def weigh(self) -> int:
        """Bytes for the memo's budget: the candidate names and the snapshot bytes charged here."""
        return self.pinned + sum(58 + len(n) for n in self.names)


def _snapshot_bytes(snap: view.Snapshot) -> int:
    """What a snapshot pins: its packed columns and its node map."""
    cols = snap.columns
    return cols.cards.nbytes + cols.hot.nbytes + cols.nodes.nbytes + 16 * len(snap.nodes)


class Shadow:
    """Shadow policies beside the live one: the filter and bind hooks, the record, the summary.

    Args:
        profile: the live profile (the shadows share its built policies and settings).
        names: the shadow policies (registered names).
        m: the extender's metrics.
        record: a JSON-lines file the records are appended to ('' for none).
        held: whether the cache still holds a pod (``ns/name``); a pod it no longer holds departed.
        clock: wall clock.
        snapshot: the cache's current snapshot, for a ``start`` record when the first bound pod's
            filter snapshot was not kept (its own allocation is taken off again).
    """

    def __init__(
        self,
        profile: profiles.Profile,
        names: Sequence[str],
        m: extender_metrics.Metrics,
        record: str = "",
        held: Callable[[str], bool] = lambda key: True,
        clock: Callable[[], float] = time.time,
        snapshot: Callable[[], view.Snapshot] | None = None,
    ) -> None:
        self.live = profile
        self._snapshot = snapshot
        self.names = tuple(names)
        self.shadows = {
            name: dataclasses.replace(profile, node_default=name, card_default=name) for name in self.names
        }
        self.metrics = m
        self.path = record
        self._held = held
        self._clock = clock
        self._file: IO[bytes] | None = Path(record).open("ab") if record else None  # noqa: SIM115 - kept open
        self._seen = memo.Memo(PENDING, PENDING_BYTES, _Seen.weigh)
        self._last_snap: view.Snapshot | None = None
        self._start: decisions.Start | None = None
        self._known: frozenset[str] = frozenset()
        self._workload: api.Workload | None = None
        self._records: collections.deque[decisions.Record] = collections.deque(maxlen=KEEP)
        self.dropped = 0
        """Records no longer kept in memory (the file has them)."""
        self._tallies = {name: _Tally() for name in self.names}
        self._by_node: dict[str, dict[str, str]] = {}  # node -> pod key -> uid, of recorded decisions
        self.decisions = 0
        self.departures = 0
        self.unevaluated = 0
        """Decisions recorded without shadow choices (the filter's snapshot was no longer kept)."""
        self._decided = {
            (name, a): m.shadow_decisions.labels(name, a) for name in self.names for a in decisions.AGREEMENTS
        }
        self._deltas = {name: m.shadow_score_delta.labels(name) for name in self.names}

    # ----- hooks

    def seen(
        self, snap: view.Snapshot, pod: requests.PodRequest, names: Sequence[str], excluded: Mapping[str, str]
    ) -> None:
        """The filter judged ``pod`` on ``snap`` among ``names`` (excluded nodes are no candidates)."""
        if not pod.uid:
            return
        kept = tuple(n for n in names if n not in excluded) if excluded else tuple(names)
        pinned = 0 if snap is self._last_snap else _snapshot_bytes(snap)
        self._last_snap = snap
        self._seen.put(pod.uid, _Seen(snap, kept, pinned))

    def bound(self, pod: requests.PodRequest, node: str, alloc: allocations.PodAllocation) -> None:
        """The live bind of ``pod`` to ``node`` completed: decide the shadows once the answer is out.

        A listener of ``BindFlow.on_bound`` (registered by ``serve.build``).
        """
        seen = self._seen.pop(pod.uid, None) if pod.uid else None
        now = self._clock()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.decide(pod, node, alloc, seen, now)
            return
        loop.call_soon(self.decide, pod, node, alloc, seen, now)

    def capacity_freed(self, node: str) -> None:
        """A pod holding GPUs on ``node`` went away: record the departures of recorded pods there.

        A listener of ``Feed.on_capacity_freed`` (registered by ``serve.build``).
        """
        pods = self._by_node.get(node)
        if not pods:
            return
        for key, uid in list(pods.items()):
            if not self._held(key):
                del pods[key]
                self.departures += 1
                self._write(decisions.Departure(time=self._clock(), key=key, uid=uid))

    # ----- the decision

    def decide(
        self,
        pod: requests.PodRequest,
        node: str,
        alloc: allocations.PodAllocation,
        seen: _Seen | None,
        now: float,
    ) -> decisions.Decision:
        """Evaluate every shadow policy for one bound pod, record and count the decision."""
        if self._start is None:
            states = self._initial(seen, alloc)
            self._start = decisions.Start(
                time=now,
                node_policy=self.live.node_default,
                card_policy=self.live.card_default,
                shadow_policies=self.names,
                fallback=self.live.fallback,
                nodes=states,
            )
            self._known = frozenset(s.name for s in states)
            self._write(self._start)
        live_cards = decisions.cards_of(alloc)
        choices: list[decisions.Choice] = []
        candidates: tuple[str, ...] | None = None
        if seen is None:
            self.unevaluated += 1
        else:
            workload = view.workload(seen.snap)
            if workload is not self._workload and workload != self._workload:
                self._write(decisions.Workload(time=now, workload=workload))
            self._workload = workload
            stripped = pod
            if pod.node_policy or pod.card_policy:
                stripped = msgspec.structs.replace(pod, node_policy=None, card_policy=None)
            for name in self.names:
                choice = choose(seen.snap, stripped, seen.names, self.shadows[name], node, live_cards)
                choices.append(choice)
                self._count(name, pod, node, live_cards, choice, now)
            registered = seen.snap.nodes  # nodes without GPUs (never feasible) are left out
            offered = tuple(n for n in seen.names if n in registered)
            if len(offered) != len(self._known) or not self._known.issuperset(offered):
                candidates = offered
        decision = decisions.Decision(
            time=now,
            key=f"{pod.namespace}/{pod.name}",
            uid=pod.uid,
            request=pod,
            candidates=candidates,
            node=node,
            allocation=alloc,
            shadows=tuple(choices),
        )
        self.decisions += 1
        self._by_node.setdefault(node, {})[decision.key] = pod.uid
        self._write(decision)
        return decision

    def _initial(self, seen: _Seen | None, alloc: allocations.PodAllocation) -> tuple[nodes.NodeState, ...]:
        """Every node's state before the first recorded pod: its filter's, or now less its own cards."""
        if seen is not None:
            return tuple(sorted(view.states(seen.snap), key=lambda s: s.name))
        if self._snapshot is None:
            return ()
        out = []
        for state in view.states(self._snapshot()):
            out.append(allocations.apply(state, alloc, -1) if state.name == alloc.node else state)
        return tuple(sorted(out, key=lambda s: s.name))

    def _count(
        self,
        name: str,
        pod: requests.PodRequest,
        node: str,
        live_cards: decisions.Cards,
        choice: decisions.Choice,
        now: float,
    ) -> None:
        tally = self._tallies[name]
        tally.decisions += 1
        self._decided[name, choice.agreement].inc()
        if choice.agreement != decisions.AGREE_NONE:
            tally.node += 1
        if choice.agreement == decisions.AGREE_CARDS:
            tally.cards += 1
        if not choice.node:
            tally.unplaced += 1
        if choice.delta is not None:
            tally.deltas += 1
            tally.delta_sum += choice.delta
            self._deltas[name].observe(choice.delta)
        if choice.agreement != decisions.AGREE_CARDS:
            tally.recent.append(
                {
                    "time": now,
                    "pod": f"{pod.namespace}/{pod.name}",
                    "live_node": node,
                    "live_cards": [list(c) for c in live_cards],
                    "node": choice.node,
                    "cards": [list(c) for c in choice.cards],
                    "agreement": choice.agreement,
                    "score_delta": choice.delta,
                }
            )

    def _write(self, record: decisions.Record) -> None:
        if len(self._records) == KEEP:
            self.dropped += 1
        self._records.append(record)
        if self._file is not None:
            self._file.write(ENCODER.encode(record) + b"\n")
            self._file.flush()

    # ----- what others read

    def records(self) -> Iterable[decisions.Record]:
        """The records kept in memory, oldest first (the ``start`` record always first)."""
        if self._start is not None and (not self._records or self._records[0] is not self._start):
            yield self._start
        yield from self._records

    def jsonl(self) -> bytes:
        """``records()`` as JSON lines (what ``GET /shadow/decisions`` answers)."""
        return b"".join(ENCODER.encode(r) + b"\n" for r in self.records())

    def summary(self) -> dict[str, Any]:
        """Per shadow policy: decisions, agreement rates, mean score delta, recent disagreements.

        ``{"enabled": True, "live": {"node_policy", "card_policy"}, "decisions", "departures",
        "unevaluated", "record", "dropped", "policies": {name: {"decisions", "node_agreement",
        "card_agreement", "unplaced", "mean_score_delta", "recent_disagreements": [...]}}}``;
        rates are fractions of the policy's decisions (None before the first), newest
        disagreement last (each: time, pod, live_node, live_cards, node, cards, agreement,
        score_delta).
        """
        out: dict[str, Any] = {}
        for name, t in self._tallies.items():
            n = t.decisions
            out[name] = {
                "decisions": n,
                "node_agreement": t.node / n if n else None,
                "card_agreement": t.cards / n if n else None,
                "unplaced": t.unplaced,
                "mean_score_delta": t.delta_sum / t.deltas if t.deltas else None,
                "recent_disagreements": list(t.recent),
            }
        return {
            "enabled": True,
            "live": {"node_policy": self.live.node_default, "card_policy": self.live.card_default},
            "decisions": self.decisions,
            "departures": self.departures,
            "unevaluated": self.unevaluated,
            "record": self.path,
            "dropped": self.dropped,
            "policies": out,
        }

    def close(self) -> None:
        """Close the record file."""
        if self._file is not None:
            self._file.close()
            self._file = None


def build(
    settings: config.Settings,
    profile: profiles.Profile,
    m: extender_metrics.Metrics,
    cache: caches.ClusterCache,
) -> Shadow | None:
    """Shadow mode as the settings ask (``shadow_policies``, ``shadow_record``); None when off.

    Raises:
        OSError: the record file cannot be opened for appending.
    """
    if not settings.shadow_names:
        return None
    return Shadow(
        profile,
        settings.shadow_names,
        m,
        settings.shadow_record,
        held=lambda key: cache.pod_state(key) is not None,
        snapshot=cache.snapshot,
    )


OFF = "shadow mode is off (gpuslice serve --shadow-policy NAME[,NAME])"


def routes(shadow: Shadow | None) -> list[Route]:
    """``GET /shadow`` (``Shadow.summary()``, or ``{"enabled": false}``) and ``GET /shadow/decisions``.

    The decisions are JSON lines (``application/x-ndjson``), what ``gpuslice shadow report --from
    URL`` reads; 404 while shadow mode is off.
    """

    async def summary(request: Request) -> Response:
        return JSONResponse(shadow.summary() if shadow is not None else {"enabled": False})

    async def decisions(request: Request) -> Response:
        if shadow is None:
            return PlainTextResponse(OFF, status_code=404)
        return Response(shadow.jsonl(), media_type="application/x-ndjson")

    return [
        Route("/shadow", summary, methods=["GET"]),
        Route("/shadow/decisions", decisions, methods=["GET"]),
    ]
