"""``gpuslice shadow report``: re-play an extender's shadow record once per policy.

The record (``gpuslice serve --shadow-record PATH`` or ``GET /shadow/decisions``; the structs of
``policy.decisions``, which the extender writes and this reads) starts from every node's state and
lists the bound GPU pods in bind order, the pods that left, and the target workload the learning
policies saw. Each policy gets its own copy of the cluster:

* the live policy's copy applies the recorded live allocations as given;
* each shadow policy's copy places the same pods in the same order itself, with the extender's
  own code path, the pod's ``cycle.Cycle``: its evaluation over the pod's candidate nodes, the
  policy's candidate step (``Cycle.stepped``) and ``Cycle.first_placed`` (``batch.best_first``:
  higher score, then lower name; ``fit.place`` with the policy as card policy: a node whose
  cards it refuses gives way to the next), the pod's policy annotations ignored, ``fallback``
  standing in for a learning policy while the recorded workload is untrusted
  (``profile.Profile``). A pod it cannot place is
  dropped (it never runs in that copy); a departing pod frees what it holds in each copy.

The states are plain ``NodeState``s with their column mirror (``columns.ColumnsBuilder``), as the
extender's cache keeps them (not the simulator's tagged states), so a shadow policy decides here
exactly as it would have live on the same state; the first decision of a shadow policy always
agrees with what the extender recorded for it online. Namespace quotas are not replayed. A
second ``start`` record (the extender restarted) resets every copy to the state it records.

At the end, per policy: pods placed and not placed, agreement with the live node and cards (pod
by pod, in the replay; the online agreement recorded by the extender beside it, where every
shadow decision was taken on the live state), and what is left: unallocated GPU % (free share of
every card over the capacity), the fragmentation % (FGD's measure, ``fragmentation.FGD``, against
the recorded workload: the shapes of every recorded pod, equally weighted, FGD keeping the most
popular ones covering 95 %) and the whole free cards.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from gpuslice.framework import cycle as cycles
from gpuslice.framework import profile as profiles
from gpuslice.framework import registry
from gpuslice.model import allocations, nodes, requests
from gpuslice.model import config as model_config
from gpuslice.policy import api, columns, decisions, fragmentation, shares

DECISIONS_PATH = "/shadow/decisions"
"""The extender's route serving the record (a URL without a path gets it appended)."""
LIVE = "live"

_DECODER = msgspec.json.Decoder(decisions.Record)


class ReportError(ValueError):
    """A record that cannot be read (missing, unreachable, not a shadow record)."""


def decode(lines: Iterable[bytes]) -> list[decisions.Record]:
    """The records of JSON lines (blank lines skipped).

    Raises:
        ReportError: a line is not a shadow record.
    """
    out: list[decisions.Record] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(_DECODER.decode(line))
        except msgspec.DecodeError as err:
            raise ReportError(f"line {n}: not a shadow record: {err}") from None
    return out


def load(source: str, timeout_s: float = 30.0) -> list[decisions.Record]:
    """The records of a file, or of an extender URL (``GET /shadow/decisions``).

    Raises:
        ReportError: the file or URL cannot be read, or holds no shadow record.
    """
    if source.startswith(("http://", "https://")):
        url = source
        if urllib.parse.urlsplit(source).path in ("", "/"):
            url = source.rstrip("/") + DECISIONS_PATH
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as answer:  # noqa: S310 - http(s) only
                data: bytes = answer.read()
        except (urllib.error.URLError, OSError) as err:
            raise ReportError(f"{url}: {err}") from None
    else:
        try:
            data = Path(source).read_bytes()
        except OSError as err:
            raise ReportError(f"{source}: {err.strerror or err}") from None
    records = decode(data.splitlines())
    if not any(isinstance(r, decisions.Start) for r in records):
        raise ReportError(f"{source}: no start record (no pod was bound with shadow mode on yet?)")
    return records


class _Copy:
    """One policy's copy of the cluster: plain node states, their columns, the pods it holds."""

    def __init__(self, states: Sequence[nodes.NodeState]) -> None:
        self.states: dict[str, nodes.NodeState] = {s.name: s for s in states}
        self.names = sorted(self.states)
        self._cols = columns.ColumnsBuilder()
        for s in states:
            self._cols.set(s)
        self._frozen: columns.NodeColumns | None = None
        self.held: dict[str, allocations.PodAllocation] = {}

    @property
    def columns(self) -> columns.NodeColumns:
        if self._frozen is None:
            self._frozen = self._cols.freeze()
        return self._frozen

    def commit(self, uid: str, alloc: allocations.PodAllocation, sign: int = 1) -> None:
        state = self.states.get(alloc.node)
        if state is None:
            return
        new = allocations.apply(state, alloc, sign)
        self.states[alloc.node] = new
        self._cols.set(new)
        self._frozen = None
        if sign > 0:
            self.held[uid] = alloc

    def depart(self, uid: str) -> None:
        alloc = self.held.pop(uid, None)
        if alloc is not None:
            self.commit(uid, alloc, -1)


@dataclasses.dataclass
class Result:
    """One policy's replay.

    Attributes:
        policy: the policy name.
        live: True for the live policy's row (the recorded choices applied as given).
        pods: GPU pods in the record.
        placed: pods it placed.
        unplaced: pods it could not place.
        node_agreement: fraction of the pods it put on the live node.
        card_agreement: fraction it put on the live node and cards.
        online_node_agreement: the extender's own count (each choice on the live state); None for
            the live row.
        online_card_agreement: likewise for cards.
        unallocated_pct: free GPU share left at the end, in % of capacity.
        fragmentation_pct: FGD's fragmentation at the end against the recorded workload, in %.
        free_gpus: cards entirely free at the end.
        placements: pod UID (key when it has none) -> (node, cards), '' and () when not placed.
    """

    policy: str
    live: bool
    pods: int = 0
    placed: int = 0
    unplaced: int = 0
    node_agreement: float | None = None
    card_agreement: float | None = None
    online_node_agreement: float | None = None
    online_card_agreement: float | None = None
    unallocated_pct: float = 0.0
    fragmentation_pct: float = 0.0
    free_gpus: int = 0
    placements: dict[str, tuple[str, decisions.Cards]] = dataclasses.field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The row for ``--json`` (placements left out; ``Report.as_json`` lists them per pod)."""
        out = dataclasses.asdict(self)
        del out["placements"]
        return out


@dataclasses.dataclass
class Report:
    """Every policy's replay of one record."""

    live_policy: str
    results: list[Result]
    decisions: int
    departures: int
    restarts: int
    pods: list[tuple[str, str]]
    """(key, uid) of every recorded pod, in bind order."""

    def as_json(self) -> dict[str, Any]:
        """``--json``: the summary rows and, per pod, each policy's node and cards."""
        pods = []
        for key, uid in self.pods:
            placements = {}
            for r in self.results:
                node, cards = r.placements.get(uid or key, ("", ()))
                placements[LIVE if r.live else r.policy] = {"node": node, "cards": [list(c) for c in cards]}
            pods.append({"key": key, "uid": uid, "placements": placements})
        return {
            "live_policy": self.live_policy,
            "decisions": self.decisions,
            "departures": self.departures,
            "restarts": self.restarts,
            "policies": [r.as_json() for r in self.results],
            "pods": pods,
        }


def _place(
    copy: _Copy,
    pod: requests.PodRequest,
    names: Sequence[str],
    profile: profiles.Profile,
    ctx: api.Context,
) -> allocations.PodAllocation | None:
    """Where ``profile`` puts ``pod`` among ``names`` on ``copy`` (the extender's filter and choice)."""
    cyc = cycles.Cycle.detached(profile, pod, ctx, copy.states, copy.columns)
    ev = cyc.evaluate(names)
    idx = np.flatnonzero(ev.feasible).tolist()
    if not idx:
        return None
    feasible = [ev.names[i] for i in idx]
    won = cyc.first_placed(feasible, cyc.stepped(ev.scores[idx]))
    return None if won is None else won[1]


def _measure(records: Sequence[decisions.Record]) -> fragmentation.Fragmentation | None:
    """FGD's measure against every recorded pod's shape, equally weighted (None without pods)."""
    card_memory = 0
    counts: dict[api.Shape, int] = {}
    for r in records:
        if isinstance(r, decisions.Start) and r.nodes and not card_memory:
            card_memory = next((shares.card_memory(s) for s in r.nodes if s.inventory.devices), 0)
        elif isinstance(r, decisions.Decision):
            shape = shares.shape_of(shares.demand(r.request, card_memory))
            counts[shape] = counts.get(shape, 0) + 1
    if not counts:
        return None
    total = sum(counts.values())
    workload = api.Workload(tuple(counts), tuple(n / total for n in counts.values()))
    return fragmentation.FGD().measure_for(workload)


def _finish(result: Result, copy: _Copy, measure: fragmentation.Fragmentation | None) -> None:
    """Fill in what the copy has left at the end."""
    capacity = free = frag = whole = 0
    for state in copy.states.values():
        free_milli = shares.free_milli(state)
        capacity += shares.FULL * len(free_milli)
        free += sum(max(0, f) for f in free_milli)
        whole += sum(1 for u in state.usage if u.slots <= 0 and u.memory_mib <= 0 and u.cores <= 0)
        if measure is not None:
            frag += measure.of(state.inventory.model, state.cpu_free_milli, free_milli)
    result.free_gpus = whole
    if capacity:
        result.unallocated_pct = 100.0 * free / capacity
        result.fragmentation_pct = 100.0 * frag / fragmentation.UNIT / capacity


def replay(records: Sequence[decisions.Record], only: Sequence[str] = ()) -> Report:
    """Re-play the record once for the live policy and once per shadow policy (or ``only`` these).

    Raises:
        ReportError: the record has no start record, or names an unknown policy.
    """
    starts = [r for r in records if isinstance(r, decisions.Start)]
    if not starts:
        raise ReportError("no start record")
    first = starts[0]
    names = list(only) or list(dict.fromkeys(n for s in starts for n in s.shadow_policies))
    try:
        fallback = None
        if first.fallback != model_config.WORKLOAD_FALLBACK_POD:
            fallback = registry.get(first.fallback)
        policies = {n: profiles.Profile.of_plugins(registry.get(n), fallback) for n in names}
    except api.UnknownPolicyError as err:
        raise ReportError(str(err)) from None
    live = Result(first.node_policy, live=True)
    results = [live] + [Result(n, live=False) for n in names]
    copies: dict[str, _Copy] = {}
    online: dict[str, list[int]] = {n: [0, 0, 0] for n in names}  # decisions, node, cards
    workload: api.Workload | None = None
    capacity: tuple[tuple[str, int], ...] = ()
    pods: list[tuple[str, str]] = []
    departures = restarts = 0
    for record in records:
        if isinstance(record, decisions.Start):
            restarts += record is not first
            copies = {r.policy if not r.live else LIVE: _Copy(record.nodes) for r in results}
            capacity = api.model_capacity(d.type for s in record.nodes for d in s.inventory.devices)
            workload = None
        elif isinstance(record, decisions.Workload):
            workload = record.workload
        elif isinstance(record, decisions.Departure):
            departures += 1
            for copy in copies.values():
                copy.depart(record.uid)
        elif copies:
            pods.append((record.key, record.uid))
            _decide(record, results, copies, policies, workload, capacity)
            for choice in record.shadows:
                tally = online.get(choice.policy)
                if tally is not None:
                    tally[0] += 1
                    tally[1] += choice.agreement in (decisions.AGREE_NODE, decisions.AGREE_CARDS)
                    tally[2] += choice.agreement == decisions.AGREE_CARDS
    measure = _measure(records)
    for r in results:
        if pods:
            node_same = cards_same = 0
            for key, uid in pods:
                got = r.placements.get(uid or key, ("", ()))
                was = live.placements.get(uid or key, ("", ()))
                if got[0] and got[0] == was[0]:
                    node_same += 1
                    cards_same += got[1] == was[1]
            r.node_agreement, r.card_agreement = node_same / len(pods), cards_same / len(pods)
        if not r.live and online[r.policy][0]:
            n, node, cards = online[r.policy]
            r.online_node_agreement, r.online_card_agreement = node / n, cards / n
        left = copies.get(LIVE if r.live else r.policy)
        if left is not None:
            _finish(r, left, measure)
    return Report(first.node_policy, results, len(pods), departures, restarts, pods)


def _decide(
    record: decisions.Decision,
    results: Sequence[Result],
    copies: Mapping[str, _Copy],
    policies: Mapping[str, profiles.Profile],
    workload: api.Workload | None,
    capacity: tuple[tuple[str, int], ...],
) -> None:
    """One recorded pod in every copy."""
    pod = record.request
    if pod.node_policy or pod.card_policy:
        pod = msgspec.structs.replace(pod, node_policy=None, card_policy=None)
    ctx = api.Context(workload=workload, capacity=capacity)
    for r in results:
        r.pods += 1
        copy = copies[LIVE if r.live else r.policy]
        alloc: allocations.PodAllocation | None
        if r.live:
            alloc = record.allocation
        else:
            names = record.candidates if record.candidates is not None else copy.names
            alloc = _place(copy, pod, names, policies[r.policy], ctx)
        if alloc is None:
            r.unplaced += 1
            r.placements[record.uid or record.key] = ("", ())
            continue
        r.placed += 1
        copy.commit(record.uid, alloc)
        r.placements[record.uid or record.key] = (alloc.node, decisions.cards_of(alloc))


# ----------------------------------------------------------------------------- the command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``gpuslice shadow report --from FILE|URL [--json]``."""
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    report = sub.add_parser("report", help="re-play a shadow record once per policy and compare them")
    report.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="FILE|URL",
        help="a --shadow-record file, or the extender's URL (GET /shadow/decisions)",
    )
    report.add_argument(
        "--policy",
        default="",
        metavar="NAME[,NAME]",
        help="re-play these policies instead of the recorded shadow policies",
    )
    report.add_argument("--json", action="store_true", help="one JSON document instead of the table")


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def table(report: Report) -> Any:
    """The report as a rich table (needs the sim extra)."""
    from rich import box
    from rich.table import Table

    t = Table(
        title=(
            f"Shadow report: {report.decisions} GPU pods, {report.departures} departures, "
            f"{report.restarts} restarts; live policy {report.live_policy}"
        ),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for name in (
        "policy",
        "placed",
        "not placed",
        "live node",
        "live cards",
        "online node / cards",
        "unallocated",
        "fragmentation",
        "free GPUs",
    ):
        t.add_column(name, justify="left" if name == "policy" else "right")
    for r in report.results:
        online = "–" if r.live else f"{_pct(r.online_node_agreement)} / {_pct(r.online_card_agreement)}"
        t.add_row(
            f"{r.policy} (live)" if r.live else r.policy,
            str(r.placed),
            str(r.unplaced),
            _pct(r.node_agreement),
            _pct(r.card_agreement),
            online,
            f"{r.unallocated_pct:.2f} %",
            f"{r.fragmentation_pct:.2f} %",
            str(r.free_gpus),
        )
    return t


def main(args: argparse.Namespace) -> int:
    """Run ``gpuslice shadow report``; 1 when the record cannot be read or re-played."""
    only = tuple(n.strip() for n in str(args.policy).split(",") if n.strip())
    try:
        report = replay(load(args.source), only)
    except ReportError as err:
        print(f"gpuslice shadow report: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
        return 0
    from gpuslice.sim import extra

    extra.require("gpuslice shadow report")
    from rich.console import Console

    Console().print(table(report))
    return 0
