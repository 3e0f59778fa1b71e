"""Gang soak: gangs arriving and departing for minutes through kube-scheduler and ``gpuslice serve``.

One control plane (etcd, kube-apiserver, kube-scheduler configured by ``gpuslice render
scheduler-config``), one ``gpuslice serve`` and the node simulator (HAMi's device plugin: it
answers Allocate by blanking ``vgpu-devices-to-allocate`` and releasing the node lock), as the e2e
tier runs them, on 25 fake nodes of 8 A100 80 GB cards (200 cards).

Workload (seeded by ``--seed``):

* Gangs arrive as a Poisson process at ``--rate`` gangs/s (default: the rate that offers
  ``--load`` of the 200 cards at the mean lifetime). A gang has 2..16 members, uniform; its
  members are created back to back (a thread pool creates several gangs at once) with the
  annotations ``gpuslice.io/gang`` and ``gpuslice.io/gang-min-members`` (= its size).
* Each member asks a quarter card (``nvidia.com/gpu: 1``, ``nvidia.com/gpumem: 20480``), half a
  card (``40960``) or a whole card (``nvidia.com/gpu: 1`` alone), uniform; all members of one gang
  ask alike (``--mixed``: each member draws its own).
* A gang seen fully bound lives an exponential lifetime (``--mean-life-s``), then all its members
  are deleted. Gangs that do not fit stay pending (kube-scheduler retries them); those still
  pending at the end are deleted then.

Measured from the API alone (a list of the bench's pods every second):

* per gang, members bound (``spec.nodeName`` set); the time the last member was created (its
  ``creationTimestamp``) and the time the last member was bound (its ``PodScheduled`` condition's
  ``lastTransitionTime``; the sample's wall time where a bound pod lacks it). Both are apiserver
  times of 1-s resolution, so the latency "last member created -> whole gang bound" is +-1 s. The
  same latency by the bench's clocks (last POST returned -> first sample showing all bound, which
  over-states it by up to the 1-s sampling period) is reported too.
* **partly bound**: a gang with some but not all members bound, longer than ``--partial-limit-s``
  (default ``gang_wait_s`` 12 + ``bind_timeout_s`` 20) after the first sample that showed a
  member bound (gangs being deleted are not counted), and at the end (a gang partly bound at the
  last sample is sampled again for up to ``--partial-limit-s``: it may be committing just then).
* **lost members**: a member a sample showed bound that a later sample shows unbound or gone,
  its gang not departing.
* **over-committed cards**: ``tests/e2e/gpuaudit.audit(nodes, pods)`` every 30 s (with a progress
  line) and at the end.
* **stuck**: gangs that fit an empty cluster (the sum of their card fractions, rounded up, at
  most 200: quarters and halves pack whole cards) yet stayed pending longer than
  ``--stuck-s`` (default 300 s), and the longest pending time.
* pods bound per second, gpuslice's ``/metrics`` (``gpuslice_bind_total`` by outcome,
  ``outcome="gang"`` a barrier that gave up, and every series naming a gang), and the error
  lines of the gpuslice log.

Prints a table and writes ``out/bench_gang_soak.json`` (with the members' API state of every gang
that went wrong, under ``evidence``). The time to fill the cluster is about one mean lifetime, so
the cards in use are also given after the first one. ``--mixed --load 1.2 --mean-life-s 60`` is a
harder mix: padded slots of the wrong shape make plans go and come again while members bind.

Run (needs the control plane binaries, ``hack/control-plane/build.sh``):
    .venv/bin/python bench/bench_gang_soak.py [--minutes 30] [--seed 1] [--load 0.9]
    .venv/bin/python bench/bench_gang_soak.py --minutes 2      # a quick check
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import math
import pathlib
import random
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

import numpy as np

from gpuslice.codec import keys
from gpuslice_dev import devcluster
from gpuslice_dev.controlplane import ControlPlane

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # the repository root: tests.e2e
from tests.e2e import gpuaudit  # noqa: E402 - after the path

OUT = pathlib.Path("out")
SCHEDULER = "gpuslice-scheduler"
A100 = "NVIDIA A100-SXM4-80GB"
NODES = 25
CARDS = 8
CARD_MIB = 81920
NS = "gang-soak"
LABEL = "bench"
LABEL_VALUE = "gang-soak"
SHAPES: dict[float, dict[str, str]] = {
    0.25: {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20480"},
    0.5: {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40960"},
    1.0: {"nvidia.com/gpu": "1"},
}
"""Card fraction -> the member's limits."""
MIN_MEMBERS, MAX_MEMBERS = 2, 16
AUDIT_PERIOD_S = 30.0
SAMPLE_PERIOD_S = 1.0


@dataclasses.dataclass
class Gang:
    """One gang's plan and what the samples showed of it."""

    index: int
    fractions: list[float]
    arrived: float
    """Monotonic time of its arrival (before the first POST)."""
    created: float | None = None
    """Monotonic time the last member's POST returned."""
    create_errors: int = 0
    created_api: float | None = None
    """Epoch seconds: the latest creationTimestamp of its members (1-s resolution)."""
    first_bound: float | None = None
    """Monotonic time of the first sample that showed a member bound."""
    full: float | None = None
    """Monotonic time of the first sample that showed every member bound."""
    full_api: float | None = None
    """Epoch seconds: the latest PodScheduled time of its members when first seen whole."""
    full_api_from_sample: bool = False
    """True when some bound member lacked a PodScheduled time and the sample's time stood in."""
    bound_now: int = 0
    max_bound: int = 0
    max_partial_s: float = 0.0
    partial_over_limit: bool = False
    depart_at: float | None = None
    deleting: bool = False
    seen_bound: dict[str, str] = dataclasses.field(default_factory=dict)
    """Member name -> node, for every member a sample showed bound."""
    vanished: list[str] = dataclasses.field(default_factory=list)
    """Members seen bound that a later sample did not show bound, the gang not being deleted."""

    @property
    def name(self) -> str:
        return f"g{self.index:05d}"

    @property
    def size(self) -> int:
        return len(self.fractions)

    def pod_names(self) -> list[str]:
        return [f"{self.name}-m{j:02d}" for j in range(self.size)]

    def cards(self) -> int:
        """Cards the gang needs on an empty cluster (quarters and halves pack whole cards)."""
        return math.ceil(sum(self.fractions) - 1e-9)

    def fits_empty(self) -> bool:
        return self.cards() <= NODES * CARDS


def parse_time(value: str | None) -> float | None:
    """An API timestamp (RFC 3339, 1-s resolution) as epoch seconds."""
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def scheduled_at(pod: dict[str, Any]) -> float | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "True":
            return parse_time(cond.get("lastTransitionTime"))
    return None


def member_state(pod: dict[str, Any]) -> dict[str, Any]:
    """What a member's API object says, for the report of a gang gone wrong."""
    ann = pod["metadata"].get("annotations") or {}
    return {
        "name": pod["metadata"]["name"],
        "uid": pod["metadata"].get("uid"),
        "node": (pod.get("spec") or {}).get("nodeName"),
        "phase": (pod.get("status") or {}).get("phase"),
        "deletion": pod["metadata"].get("deletionTimestamp"),
        "conditions": [
            {k: c.get(k) for k in ("type", "status", "reason", "lastTransitionTime", "message")}
            for c in (pod.get("status") or {}).get("conditions") or []
        ],
        "annotations": {k: v for k, v in ann.items() if k.startswith(("hami.io/", "gpuslice.io/"))},
    }


def pod_body(gang: Gang, name: str, fraction: float) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {LABEL: LABEL_VALUE, "gang": gang.name},
            "annotations": {keys.GANG: gang.name, keys.GANG_MIN_MEMBERS: str(gang.size)},
        },
        "spec": {
            "schedulerName": SCHEDULER,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "pause", "resources": {"limits": dict(SHAPES[fraction])}}],
        },
    }


def metrics(url: str) -> dict[str, float]:
    """gpuslice's bind outcomes and every series naming a gang, from ``/metrics``."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:  # noqa: S310 - loopback URL
            text = resp.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        series, _, value = line.rpartition(" ")
        if series.startswith("gpuslice_bind_total") or "gang" in series.lower():
            if series.endswith("_created") or "_created{" in series:
                continue
            out[series] = float(value)
    return out


def percentiles(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None}
    a = np.asarray(xs)
    return {
        "n": len(xs),
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
    }


class Soak:
    """Arrivals, departures, samples and audits against one running cluster."""

    def __init__(self, cp: ControlPlane, args: argparse.Namespace, rate: float) -> None:
        self.cp = cp
        self.args = args
        self.rate = rate
        self.rng = random.Random(args.seed)
        self.life_rng = random.Random(args.seed + 1)
        self.lock = threading.Lock()
        self.gangs: dict[str, Gang] = {}
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.workers)
        self.samples = 0
        self.sample_errors = 0
        self.sample_s: list[float] = []
        self.max_pods_bound = 0
        self.cards_in_use: list[float] = []
        self.cards_steady: list[float] = []
        """Cards in use at the samples after the first mean lifetime (the fill's ramp left out)."""
        self.binds_seen: set[str] = set()
        self.audits: list[dict[str, Any]] = []
        self.partial_events: list[str] = []
        self.vanished_events: list[str] = []
        self.evidence: dict[str, list[dict[str, Any]]] = {}
        """Gang name -> its members' API state when it first went wrong (partly bound, lost a member)."""
        self.last_members: dict[str, list[dict[str, Any]]] = {}
        self.started = time.monotonic()
        self.stop = threading.Event()

    # --- arrivals and departures -------------------------------------------------------------

    def new_gang(self, index: int) -> Gang:
        size = self.rng.randint(MIN_MEMBERS, MAX_MEMBERS)
        choices = sorted(SHAPES)
        if self.args.mixed:
            fractions = [self.rng.choice(choices) for _ in range(size)]
        else:
            fractions = [self.rng.choice(choices)] * size
        return Gang(index=index, fractions=fractions, arrived=time.monotonic())

    def create(self, gang: Gang) -> None:
        for name, fraction in zip(gang.pod_names(), gang.fractions, strict=True):
            status, obj = self.cp.api_request(
                "POST", f"/api/v1/namespaces/{NS}/pods", pod_body(gang, name, fraction)
            )
            if status != 201:
                with self.lock:
                    gang.create_errors += 1
                print(f"create {name}: HTTP {status}: {str(obj)[:200]}", flush=True)
        with self.lock:
            gang.created = time.monotonic()

    def delete(self, gang: Gang) -> None:
        for name in gang.pod_names():
            self.cp.api_request("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}?gracePeriodSeconds=0")

    def arrivals(self, until: float) -> int:
        """Create gangs as a Poisson process until ``until`` (monotonic); returns how many."""
        index = 0
        next_at = time.monotonic() + self.rng.expovariate(self.rate)
        while True:
            now = time.monotonic()
            if next_at >= until:
                break
            if now < next_at:
                time.sleep(min(next_at - now, 0.2))
                continue
            gang = self.new_gang(index)
            index += 1
            with self.lock:
                self.gangs[gang.name] = gang
            self.pool.submit(self.create, gang)
            next_at += self.rng.expovariate(self.rate)
            self.depart(time.monotonic())
        time.sleep(max(0.0, until - time.monotonic()))
        return index

    def depart(self, now: float) -> None:
        """Delete the gangs whose lifetime is over."""
        with self.lock:
            due = [
                g
                for g in self.gangs.values()
                if g.depart_at is not None and not g.deleting and g.depart_at <= now
            ]
            for g in due:
                g.deleting = True
        for g in due:
            self.pool.submit(self.delete, g)

    # --- samples ------------------------------------------------------------------------------

    def list_pods(self) -> list[dict[str, Any]]:
        status, body = self.cp.api_request(
            "GET", f"/api/v1/namespaces/{NS}/pods?labelSelector={LABEL}%3D{LABEL_VALUE}", timeout=20
        )
        if status != 200:
            raise RuntimeError(f"list pods: HTTP {status}")
        items: list[dict[str, Any]] = body.get("items", [])
        return items

    def sample(self) -> None:
        t0 = time.monotonic()
        try:
            pods = self.list_pods()
        except (RuntimeError, OSError) as err:
            self.sample_errors += 1
            print(f"sample: {err}", flush=True)
            return
        now = time.monotonic()
        wall = time.time()
        self.sample_s.append(now - t0)
        self.samples += 1
        by_gang: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            gang_name = (pod["metadata"].get("labels") or {}).get("gang", "")
            by_gang.setdefault(gang_name, []).append(pod)
        bound_pods = 0
        cards = 0.0
        with self.lock:
            for name, gang in self.gangs.items():
                members = by_gang.get(name, [])
                bound = [p for p in members if (p.get("spec") or {}).get("nodeName")]
                for p in bound:
                    self.binds_seen.add(p["metadata"]["uid"])
                bound_pods += len(bound)
                fractions = dict(zip(gang.pod_names(), gang.fractions, strict=True))
                cards += sum(fractions.get(p["metadata"]["name"], 0.0) for p in bound)
                gang.bound_now = len(bound)
                self.last_members[name] = members
                if gang.deleting:
                    continue
                bound_names = {p["metadata"]["name"] for p in bound}
                for member, node in list(gang.seen_bound.items()):
                    if member not in bound_names and member not in gang.vanished:
                        gang.vanished.append(member)
                        present = any(p["metadata"]["name"] == member for p in members)
                        now_is = "unbound" if present else "gone"
                        event = f"{gang.name}: {member}, seen bound on {node}, is {now_is}"
                        self.vanished_events.append(event)
                        self.evidence.setdefault(name, [member_state(p) for p in members])
                        print(f"LOST MEMBER {event}", flush=True)
                for p in bound:
                    gang.seen_bound[p["metadata"]["name"]] = p["spec"]["nodeName"]
                gang.max_bound = max(gang.max_bound, len(bound))
                if gang.created_api is None and gang.created is not None and len(members) == gang.size:
                    created = [parse_time(p["metadata"].get("creationTimestamp")) for p in members]
                    gang.created_api = max(c for c in created if c is not None)
                if bound and gang.first_bound is None:
                    gang.first_bound = now
                if len(bound) == gang.size and gang.full is None:
                    gang.full = now
                    times = [scheduled_at(p) for p in bound]
                    gang.full_api_from_sample = any(t is None for t in times)
                    gang.full_api = max(wall if t is None else t for t in times)
                    gang.depart_at = now + self.life_rng.expovariate(1.0 / self.args.mean_life_s)
                if 0 < len(bound) < gang.size and gang.first_bound is not None:
                    partial_s = now - gang.first_bound
                    gang.max_partial_s = max(gang.max_partial_s, partial_s)
                    if partial_s > self.args.partial_limit_s and not gang.partial_over_limit:
                        gang.partial_over_limit = True
                        unbound = sorted(set(gang.pod_names()) - {p["metadata"]["name"] for p in bound})
                        what = f"{len(bound)}/{gang.size} bound for {partial_s:.0f} s"
                        event = f"{gang.name}: {what}, unbound {unbound}"
                        self.partial_events.append(event)
                        self.evidence.setdefault(name, [member_state(p) for p in members])
                        print(f"PARTLY BOUND {event}", flush=True)
        self.max_pods_bound = max(self.max_pods_bound, bound_pods)
        self.cards_in_use.append(cards)
        if now - self.started >= self.args.mean_life_s:
            self.cards_steady.append(cards)

    def partly_bound(self) -> list[str]:
        """Gangs (not departing) that the last sample showed with some but not all members bound."""
        with self.lock:
            return [g.name for g in self.gangs.values() if not g.deleting and 0 < g.bound_now < g.size]

    def audit(self, label: str) -> dict[str, Any]:
        status, nodes = self.cp.api_request("GET", "/api/v1/nodes", timeout=20)
        status2, pods = self.cp.api_request("GET", "/api/v1/pods", timeout=20)
        if status != 200 or status2 != 200:
            row: dict[str, Any] = {
                "at_s": time.monotonic() - self.started,
                "error": f"HTTP {status}/{status2}",
            }
        else:
            report = gpuaudit.audit(nodes["items"], pods["items"])
            row = {
                "at_s": round(time.monotonic() - self.started, 1),
                "label": label,
                "pods": len(pods["items"]),
                "problems": report.problems,
            }
            with self.lock:
                waiting = sum(1 for g in self.gangs.values() if g.full is None and not g.deleting)
                live = sum(1 for g in self.gangs.values() if g.full is not None and not g.deleting)
            in_use = self.cards_in_use[-1] if self.cards_in_use else 0.0
            print(
                f"{row['at_s']:6.0f} s  gangs {len(self.gangs)} (bound {live}, pending {waiting})  "
                f"cards {in_use:.0f}/{NODES * CARDS}  audit problems {len(report.problems)}",
                flush=True,
            )
            if report.problems:
                print(f"AUDIT {label}: {len(report.problems)} problems: {report.problems[:5]}", flush=True)
        self.audits.append(row)
        return row

    def sampler(self) -> None:
        next_audit = time.monotonic() + AUDIT_PERIOD_S
        while not self.stop.is_set():
            t = time.monotonic()
            self.sample()
            self.depart(time.monotonic())
            if time.monotonic() >= next_audit:
                self.audit("periodic")
                next_audit += AUDIT_PERIOD_S
            self.stop.wait(max(0.0, SAMPLE_PERIOD_S - (time.monotonic() - t)))


def gpuslice_log_errors(path: pathlib.Path) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    marks = ("Traceback", "ERROR", "CRITICAL", "Exception")
    return [line for line in lines if any(m in line for m in marks)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="arrival period")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mean-life-s", type=float, default=120.0, help="mean lifetime of a bound gang")
    parser.add_argument("--load", type=float, default=0.9, help="offered cards / 200, for the default --rate")
    parser.add_argument("--rate", type=float, default=0.0, help="gangs per second (default: from --load)")
    parser.add_argument("--mixed", action="store_true", help="each member draws its own card fraction")
    parser.add_argument("--gang-wait-s", type=float, default=12.0, help="gpuslice serve --gang-wait-s")
    parser.add_argument("--bind-timeout-s", type=float, default=20.0, help="gpuslice serve --bind-timeout-s")
    parser.add_argument(
        "--partial-limit-s",
        type=float,
        default=0.0,
        help="partly bound longer is a problem (default: wait + bind)",
    )
    parser.add_argument("--stuck-s", type=float, default=300.0, help="a fitting gang pending longer is stuck")
    parser.add_argument(
        "--drain-s", type=float, default=30.0, help="after the arrivals, keep sampling this long"
    )
    parser.add_argument("--workers", type=int, default=8, help="threads creating and deleting gangs")
    parser.add_argument("-v", "--verbosity", type=int, default=2, help="gpuslice log level")
    args = parser.parse_args()
    if not args.partial_limit_s:
        args.partial_limit_s = args.gang_wait_s + args.bind_timeout_s
    mean_cards = (MIN_MEMBERS + MAX_MEMBERS) / 2 * float(np.mean(sorted(SHAPES)))
    rate = args.rate or args.load * NODES * CARDS / (mean_cards * args.mean_life_s)

    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-gang-soak-"))
    log_path = work / "gpuslice.log"
    cp = ControlPlane()
    cp.start()
    sim: devcluster.NodeSimThread | None = None
    ext: devcluster.Extender | None = None
    soak: Soak | None = None
    sampler: threading.Thread | None = None
    created = 0
    metrics_end: dict[str, float] = {}
    still_pending: list[str] = []
    partial_end: list[str] = []
    final_audit: dict[str, Any] = {}
    elapsed = 0.0
    ext_exit: int | None = None
    try:
        spec = {"model": A100, "count": CARDS, "memory_mib": CARD_MIB, "numa": [i // 4 for i in range(CARDS)]}
        sim = devcluster.NodeSimThread(cp.kubeconfig, {f"soak-{i:02d}": spec for i in range(NODES)}).start()
        ext = devcluster.Extender(
            cp.kubeconfig,
            log_path,
            extra_args=[
                "-v",
                str(args.verbosity),
                "--gang-wait-s",
                str(args.gang_wait_s),
                "--bind-timeout-s",
                str(args.bind_timeout_s),
            ],
        ).start()
        cp.start_scheduler(devcluster.render_scheduler_config(ext.url, cp.kubeconfig, SCHEDULER))
        status, body = cp.api_request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
        assert status in (201, 409), body
        print(
            f"{NODES} nodes x {CARDS} cards; rate {rate:.3f} gangs/s, mean life {args.mean_life_s:.0f} s, "
            f"{args.minutes:g} min; gpuslice log {log_path}",
            flush=True,
        )
        soak = Soak(cp, args, rate)
        sampler = threading.Thread(target=soak.sampler, name="sampler", daemon=True)
        sampler.start()
        created = soak.arrivals(soak.started + args.minutes * 60.0)
        soak.pool.shutdown(wait=True)  # the last creations are done
        soak.pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.workers)
        time.sleep(args.drain_s)  # departures continue; pending gangs get their chance
        soak.stop.set()
        sampler.join(30)
        soak.sample()
        settle_until = time.monotonic() + args.partial_limit_s
        while soak.partly_bound() and time.monotonic() < settle_until:
            time.sleep(SAMPLE_PERIOD_S)  # a gang committing at the last sample: let it finish
            soak.sample()
        elapsed = time.monotonic() - soak.started
        final_audit = soak.audit("end")
        metrics_end = metrics(ext.probe_url)
        with soak.lock:
            for g in soak.gangs.values():
                if g.deleting:
                    continue
                if g.full is None:
                    still_pending.append(g.name)
                if 0 < g.bound_now < g.size:
                    since = time.monotonic() - (g.first_bound or time.monotonic())
                    partial_end.append(
                        f"{g.name}: {g.bound_now}/{g.size} bound, {since:.0f} s after the first"
                    )
                    soak.evidence.setdefault(
                        f"{g.name} at end", [member_state(p) for p in soak.last_members[g.name]]
                    )
        ext_exit = None if ext.running() else ext.returncode
        with soak.lock:
            pending = [g for g in soak.gangs.values() if g.full is None and not g.deleting]
        for g in pending:
            soak.pool.submit(soak.delete, g)
        soak.pool.shutdown(wait=True)
    finally:
        if soak is not None:
            soak.stop.set()
            soak.pool.shutdown(wait=False, cancel_futures=True)
        if sampler is not None:
            sampler.join(30)
        if ext is not None:
            ext.stop()
        if sim is not None:
            sim.stop()
        cp.stop()
    assert soak is not None
    return report(soak, args, rate, created, elapsed, metrics_end, still_pending, partial_end, final_audit,
                  log_path, ext_exit)  # fmt: skip


def report(
    soak: Soak,
    args: argparse.Namespace,
    rate: float,
    created: int,
    elapsed: float,
    metrics_end: dict[str, float],
    still_pending: list[str],
    partial_end: list[str],
    final_audit: dict[str, Any],
    log_path: pathlib.Path,
    ext_exit: int | None,
) -> int:
    gangs = list(soak.gangs.values())
    end = soak.started + elapsed
    full = [g for g in gangs if g.full is not None]
    never = [g for g in gangs if g.max_bound == 0]
    latency_api = [
        g.full_api - g.created_api for g in full if g.full_api is not None and g.created_api is not None
    ]
    latency_sample = [g.full - g.created for g in full if g.full is not None and g.created is not None]
    pending_s = [((g.full or end) - g.arrived) for g in gangs]
    stuck = [
        f"{g.name} ({g.size} x {sorted(set(g.fractions))}, pending {(g.full or end) - g.arrived:.0f} s)"
        for g in gangs
        if g.fits_empty() and (g.full or end) - g.arrived > args.stuck_s
    ]
    problems_any = sum(len(a.get("problems", [])) for a in soak.audits)
    log_errors = gpuslice_log_errors(log_path)
    cards = np.asarray(soak.cards_in_use) if soak.cards_in_use else np.zeros(1)
    steady = np.asarray(soak.cards_steady)
    summary: dict[str, Any] = {
        "config": {
            "nodes": NODES,
            "cards_per_node": CARDS,
            "card_mib": CARD_MIB,
            "minutes": args.minutes,
            "seed": args.seed,
            "rate_gangs_per_s": rate,
            "mean_life_s": args.mean_life_s,
            "members": f"uniform {MIN_MEMBERS}..{MAX_MEMBERS}",
            "fractions": "uniform of 1/4, 1/2, 1 card; " + ("per member" if args.mixed else "one per gang"),
            "gang_wait_s": args.gang_wait_s,
            "bind_timeout_s": args.bind_timeout_s,
            "partial_limit_s": args.partial_limit_s,
            "stuck_s": args.stuck_s,
            "drain_s": args.drain_s,
        },
        "elapsed_s": elapsed,
        "gangs_created": created,
        "gangs_with_create_errors": sum(1 for g in gangs if g.create_errors),
        "gangs_fully_bound": len(full),
        "gangs_never_bound": len(never),
        "gangs_still_pending_at_end": len(still_pending),
        "gangs_not_fitting_empty_cluster": sum(1 for g in gangs if not g.fits_empty()),
        "partly_bound_over_limit": soak.partial_events,
        "partly_bound_at_end": partial_end,
        "members_lost": soak.vanished_events,
        "evidence": soak.evidence,
        "max_partly_bound_s": max((g.max_partial_s for g in gangs), default=0.0),
        "overcommit_problems_any_audit": problems_any,
        "audits": len(soak.audits),
        "final_audit": final_audit,
        "stuck_over_limit": stuck,
        "longest_pending_s": max(pending_s, default=0.0),
        "latency_last_created_to_gang_bound_s_api": percentiles(latency_api),
        "latency_last_created_to_gang_bound_s_sampled": percentiles(latency_sample),
        "gangs_bound_time_from_sample_not_condition": sum(1 for g in full if g.full_api_from_sample),
        "pods_bound": len(soak.binds_seen),
        "pods_bound_per_s": len(soak.binds_seen) / elapsed if elapsed else 0.0,
        "max_pods_bound_at_once": soak.max_pods_bound,
        "cards_in_use": {"mean": float(cards.mean()), "max": float(cards.max()), "of": NODES * CARDS},
        "cards_in_use_after_first_mean_life": {
            "mean": float(steady.mean()) if steady.size else None,
            "min": float(steady.min()) if steady.size else None,
        },
        "samples": soak.samples,
        "sample_errors": soak.sample_errors,
        "sample_list_s": percentiles(soak.sample_s),
        "metrics": metrics_end,
        "gpuslice_exit": ext_exit,
        "gpuslice_log": str(log_path),
        "gpuslice_log_error_lines": len(log_errors),
        "gpuslice_log_errors_head": log_errors[:20],
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_gang_soak.json").write_text(json.dumps(summary, indent=2))

    def pct(p: dict[str, float | None]) -> str:
        if not p["n"]:
            return "-"
        return f"{p['p50']:.1f} / {p['p90']:.1f} / {p['p99']:.1f} (max {p['max']:.1f}, n={p['n']})"

    rows = [
        ("elapsed", f"{elapsed:.0f} s, {soak.samples} samples"),
        ("rate", f"{rate:.3f} gangs/s, mean life {args.mean_life_s:.0f} s"),
        ("gangs created", str(created)),
        ("gangs fully bound", str(len(full))),
        ("gangs never bound", str(len(never))),
        ("gangs still pending at end", str(len(still_pending))),
        (f"partly bound > {args.partial_limit_s:.0f} s", str(len(soak.partial_events))),
        ("partly bound at end", str(len(partial_end))),
        ("bound members lost (not departing)", str(len(soak.vanished_events))),
        ("longest partly bound", f"{summary['max_partly_bound_s']:.1f} s"),
        ("over-committed (all audits)", f"{problems_any} in {len(soak.audits)} audits"),
        ("over-committed (end)", str(len(final_audit.get("problems", [])))),
        (f"fitting gangs pending > {args.stuck_s:.0f} s", str(len(stuck))),
        ("longest pending", f"{summary['longest_pending_s']:.0f} s"),
        ("created->bound s p50/p90/p99 (API)", pct(summary["latency_last_created_to_gang_bound_s_api"])),
        (
            "created->bound s p50/p90/p99 (sampled)",
            pct(summary["latency_last_created_to_gang_bound_s_sampled"]),
        ),
        ("pods bound", f"{len(soak.binds_seen)} ({summary['pods_bound_per_s']:.2f}/s)"),
        ("cards in use mean / max", f"{cards.mean():.0f} / {cards.max():.0f} of {NODES * CARDS}"),
        (
            "cards in use after 1st mean life",
            f"mean {steady.mean():.0f}, min {steady.min():.0f}" if steady.size else "-",
        ),
        ("gpuslice log error lines", str(len(log_errors))),
    ]
    rows += [(k, f"{v:g}") for k, v in sorted(metrics_end.items())]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
