"""``gpuslice explain NAMESPACE/POD``: why a GPU pod fits or not, per node and per card (docs/explain.md).

Two sources, one document (``extender.explain.Explanation``):

* ``--extender URL``: ``GET URL/explain?pod=NAMESPACE/POD`` on a running extender, which explains
  the pod against its own cache.
* otherwise the live cluster through the kubeconfig (``--kubeconfig``, ``$KUBECONFIG``,
  ``~/.kube/config`` or in-cluster): the pod is read, nodes, pods and ResourceQuotas are listed
  once into a cache by the extender's own decoding (``kube.liveview``), and the same ``explain``
  runs. The extender's settings (``--config``, ``GPUSLICE_*``: policies, overcommit, resource
  names, handshake timeout) apply as in ``gpuslice serve``. A node lock held too long is judged
  only by a running extender (it needs to watch the lock's age).

Output: rich tables (the nodes, then the cards of the nodes that matter, then the smallest
change), or the JSON document with ``--json``. rich comes with the ``sim`` extra; on a server
install without it the same rows print as plain text. This module sits beside ``cli`` above the
extender layer, so the server packages never import rich (the import contracts in
pyproject.toml). Exit status 0 when printed, 2 for a bad argument, 1 when the cluster or extender
cannot be reached or the pod is unknown.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

import msgspec

from gpuslice.cache import cache as caches
from gpuslice.extender import config, feed, holdings, parsing
from gpuslice.extender.binding import liveness
from gpuslice.framework import explain, nominations
from gpuslice.framework import profile as profiles
from gpuslice.kube import client as kclient
from gpuslice.kube import errors as kerrors
from gpuslice.kube import liveview
from gpuslice.model import requests, status

CARD_TABLES = 3
"""Card tables shown by default for fitting nodes, and as many for failing ones."""
NUMERIC = ("card", "NUMA", "MiB free/total", "cores free/total", "slots free/total")
"""Columns aligned right."""
NO_WRAP = ("node", "code", "reasons", "reason", "MiB free/total")
"""Columns never wrapped or cut (the long ones, model and change, wrap instead)."""


class Failure(Exception):
    """The explanation could not be made; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``gpuslice explain`` flags."""
    parser.add_argument("pod", metavar="NAMESPACE/POD", help="the pod to explain")
    parser.add_argument("--kubeconfig", help="kubeconfig of the cluster (default: $KUBECONFIG, in-cluster)")
    parser.add_argument("--extender", metavar="URL", help="ask a running extender (its /explain route)")
    parser.add_argument(
        "--config", help="the extender's settings YAML (policies, overcommit, resource names)"
    )
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    parser.add_argument("--all", action="store_true", help="show the cards of every node")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds for the API or extender")


def split(arg: str) -> tuple[str, str]:
    """``NAMESPACE/POD`` as its two parts (Failure with status 2 when malformed)."""
    namespace, _, name = arg.partition("/")
    if not namespace or not name or "/" in name:
        raise Failure(f"expected NAMESPACE/POD, got {arg!r}", 2)
    return namespace, name


def from_extender(url: str, namespace: str, name: str, timeout: float) -> explain.Explanation:
    """The extender's ``/explain`` document for the pod."""
    query = urllib.parse.urlencode({"pod": f"{namespace}/{name}"})
    target = f"{url.rstrip('/')}/explain?{query}"
    try:
        with urllib.request.urlopen(target, timeout=timeout) as resp:  # noqa: S310 - operator-given URL
            body: bytes = resp.read()
    except urllib.error.HTTPError as err:
        text = err.read().decode(errors="replace").strip()
        raise Failure(f"{url}: {err.code}: {text}", 2 if err.code == 400 else 1) from None
    except (urllib.error.URLError, OSError) as err:
        raise Failure(f"cannot reach the extender at {url}: {getattr(err, 'reason', err)}") from None
    try:
        return explain.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise Failure(f"{url}: not an explanation: {err}") from None


async def from_cluster(
    kubeconfig: str | None, settings: config.Settings, namespace: str, name: str, timeout: float
) -> explain.Explanation:
    """Explain the pod against the live cluster, read once (see the module docstring)."""
    try:
        kube = kclient.KubeClient.auto(kubeconfig, timeout=timeout)
    except Exception as err:  # noqa: BLE001 - a missing or broken kubeconfig ends the command
        raise Failure(f"cannot load the kubeconfig: {err}") from None
    try:
        async with kube:
            pod = await liveview.read_pod(kube, namespace, name)
            if pod is None:
                raise Failure(f"pod {namespace}/{name} not found")
            s = settings
            live = await liveview.load(
                kube,
                caches.ClusterCache(nominator=nominations.Nominator()),  # nothing is nominated here
                s.request_config,
                transform=lambda inv: feed.scale(inv, s.memory_scaling, s.core_scaling),
                claim_expiry_s=s.node_lock_expiry_s or config.DEFAULT_LOCK_EXPIRY_S,
            )
    except kerrors.ApiError as err:
        raise Failure(f"cannot read the cluster: {err}") from None
    request = parsing.request_of(pod, settings.request_config)
    if isinstance(request, status.Status):
        raise Failure(f"pod {namespace}/{name}: invalid GPU request: {request.message}")
    health = liveness.NodeHealth(
        settings.handshake_timeout_s, settings.stuck_lock_s, gpu_resource=settings.request_config.names.count
    )
    for node in live.nodes:
        health.observe(node, False, time.time(), time.monotonic())
    profile = profiles.Profile.from_settings(settings, clock=time.time)  # as the extender judges
    held = holdings.held(live.cache, f"{namespace}/{name}", request.uid)  # a bound pod: its own cards free
    snap = live.cache.snapshot()
    return explain.explain(snap, request, profile, live.invalid_nodes, health.excluded, held=held)


def main(args: argparse.Namespace) -> int:
    """Explain one pod; 0 printed, 2 bad argument, 1 unreachable or unknown pod."""
    try:
        namespace, name = split(args.pod)
        if args.extender:
            doc = from_extender(args.extender, namespace, name, args.timeout)
        else:
            try:
                settings = config.load(argparse.Namespace(config=args.config))
            except config.ConfigError as err:
                raise Failure(str(err), 2) from None
            doc = asyncio.run(from_cluster(args.kubeconfig, settings, namespace, name, args.timeout))
    except Failure as err:
        print(f"gpuslice explain: {err}", file=sys.stderr)
        return err.code
    if args.json:
        sys.stdout.buffer.write(explain.encode(doc) + b"\n")
        sys.stdout.flush()
    else:
        render(doc, show_all=args.all)
    return 0


# ----- tables


def _ask(a: explain.Ask) -> str:
    memory = f"{a.memory_percent} % memory" if a.memory_percent is not None else f"{a.memory_mib} MiB"
    cards = "card" if a.count == 1 else "cards"
    return f"container {a.container} ({a.kind}): {a.count} {cards} x {memory}, {a.cores} % cores"


def _selectors(w: requests.Selectors) -> list[str]:
    out = []
    for label, values in (
        ("use types", w.use_types),
        ("nouse types", w.nouse_types),
        ("use uuids", w.use_uuids),
        ("nouse uuids", w.nouse_uuids),
    ):
        if values:
            out.append(f"{label} {','.join(values)}")
    if w.numa_bind:
        out.append("numa-bind")
    if w.numa_node is not None:
        out.append(f"NUMA node {w.numa_node}")
    if w.mode:
        out.append(f"mode {w.mode}")
    return out


def shown_nodes(doc: explain.Explanation, show_all: bool = False) -> list[explain.Node]:
    """The nodes whose cards are shown: fitting ones, then failing ones closest to fitting."""
    with_cards = [n for n in doc.nodes if n.cards]
    if show_all:
        return with_cards
    # A bound pod's own node first (sorted is stable: the rest keep their order).
    fits = sorted((n for n in with_cards if n.fits), key=lambda n: n.name != doc.bound_node)[:CARD_TABLES]
    failed = sorted(
        (n for n in with_cards if not n.fits),
        key=lambda n: (
            n.name != doc.bound_node,
            n.change != doc.change,
            n.code != explain.CODE_NAMES[status.Code.UNSCHEDULABLE],
        ),
    )
    return fits + failed[:CARD_TABLES]


def rows(doc: explain.Explanation, show_all: bool = False) -> list[tuple[str, list[str], list[list[str]]]]:
    """The tables to print: (title, header, rows) for the nodes, then one per shown node's cards."""
    out: list[tuple[str, list[str], list[list[str]]]] = []
    node_rows = []
    held = set(doc.bound_cards)
    for n in doc.nodes:
        if n.fits:
            got = ", ".join(str(c.index) for c in n.cards if c.chosen)
            detail = f"cards {got}" if got else ""
        else:
            detail = n.change
        if n.name == doc.bound_node:  # judged with its own cards free: say which they are
            on = ", ".join(str(c.index) for c in n.cards if c.uuid in held)
            detail = f"bound here (cards {on})" + (f"; {detail}" if detail else "")
        node_rows.append([n.name, "yes" if n.fits else "no", n.code, ", ".join(n.reasons), detail])
    out.append(
        ("Nodes", ["node", "fits", "code", "reasons", "cards it would get / smallest change"], node_rows)
    )
    header = [
        "card",
        "model",
        "NUMA",
        "MiB free/total",
        "cores free/total",
        "slots free/total",
        "reason",
    ]
    for n in shown_nodes(doc, show_all):
        title = f"{n.name}: cards" + (f" for container {n.container}" if n.container is not None else "")
        with_mig = any(c.mig is not None for c in n.cards)
        cards = [
            [
                str(c.index),
                c.model,
                str(c.numa),
                f"{c.memory_free_mib}/{c.memory_total_mib}",
                f"{c.cores_free}/{c.cores_total}",
                f"{c.slots_free}/{c.slots_total}",
                *([mig_text(c.mig)] if with_mig else []),
                c.reason + (" (chosen)" if c.chosen else "") + (" (held)" if c.uuid in held else ""),
            ]
            for c in n.cards
        ]
        out.append((title, [*header[:-1], "MIG", header[-1]] if with_mig else header, cards))
    return out


def mig_text(m: explain.Mig | None) -> str:
    """A MIG card's cell: ``held 1g.10gb@0, 3g.40gb@4-7; free 3/8, stranded 1.83`` ('' off MIG)."""
    if m is None:
        return ""
    held = ", ".join(
        f"{i.profile}@{i.start}" + (f"-{i.start + i.size - 1}" if i.size > 1 else "") for i in m.instances
    )
    return f"held {held or 'none'}; free {m.slices_free}/{m.slices_total}, stranded {m.slices_stranded:g}"


def head_lines(doc: explain.Explanation) -> list[str]:
    """The lines above the tables: the pod, what it asks, its selectors and quota."""
    lines = [f"Pod {doc.namespace}/{doc.name}: {doc.summary}"]
    lines += [f"  asks {_ask(a)}" for a in doc.asks]
    sel = _selectors(doc.selectors)
    if sel:
        lines.append(f"  selectors: {'; '.join(sel)}")
    if doc.quota is not None:
        q = doc.quota
        parts = [
            f"{what} {used} of {limit if limit is not None else 'unlimited'}"
            for what, used, limit in (
                ("cards", q.used_count, q.count_limit),
                ("MiB", q.used_memory_mib, q.memory_limit_mib),
                ("% cores", q.used_cores, q.cores_limit),
            )
        ]
        lines.append(f"  namespace quota: {', '.join(parts)}")
    lines += gang_lines(doc.gang)
    return lines


def gang_lines(gang: explain.Gang | None) -> list[str]:
    """The pod's gang (docs/gangs.md): its plan's slots and who waits at the barrier."""
    if gang is None:
        return []
    minimum = str(gang.minimum) if gang.minimum else "unknown (its group object was not seen)"
    lines = [f"  gang {gang.gang} ({gang.source}), minimum {minimum}"]
    if gang.note:
        lines.append(f"    {gang.note}")
    plan = gang.plan
    if plan is None:
        lines.append("    no plan holds cards for it now")
        return lines
    state = "open: members commit" if plan.open else f"{plan.arrived}/{plan.quorum} at the barrier"
    lines.append(f"    plan: {state}, released in {plan.expires_in_s:g} s unless the gang binds")
    for slot in plan.slots:
        lines.append(f"    {slot.member}: {slot.state} on {slot.node} ({', '.join(slot.cards)})")
    return lines


def render(doc: explain.Explanation, show_all: bool = False, width: int | None = None) -> None:
    """Print the explanation on stdout: rich tables, or plain text where rich is not installed."""
    tables = rows(doc, show_all)
    change = f"Smallest change: {doc.change}" if doc.change else ""
    try:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table
    except ImportError:
        for line in head_lines(doc):
            print(line)
        for title, header, body in tables:
            print(f"\n{title}")
            for row in [header, *body]:
                print("  " + " | ".join(row))
        if change:
            print(f"\n{change}")
        return
    console = Console(width=width)
    for line in head_lines(doc):
        console.print(escape(line))
    for title, header, body in tables:
        table = Table(title=escape(title), title_justify="left")
        for col in header:
            table.add_column(col, justify="right" if col in NUMERIC else "left", no_wrap=col in NO_WRAP)
        for row in body:
            table.add_row(*(escape(cell) for cell in row))
        console.print(table)
    if change:
        console.print(escape(change))


def run(argv: Sequence[str]) -> int:
    """Parse ``argv`` (without the subcommand) and run; for tests and embedding."""
    parser = argparse.ArgumentParser(prog="gpuslice explain")
    add_arguments(parser)
    return main(parser.parse_args(list(argv)))
