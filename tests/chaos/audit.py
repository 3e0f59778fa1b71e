"""The chaos tier's oracle: is any GPU card handed out twice? Answered from the API alone.

``audit`` reads ``/api/v1/nodes`` and ``/api/v1/pods`` as admin and rebuilds every card's usage
from the pods' ``hami.io/vgpu-devices-allocated`` annotations with the extender's own decoders
(``codec.pod_devices.allocation_from_annotations``, ``model.allocations.card_reservation``, the
same path ``kube.sync.Sync.on_pod`` takes, with the same init-container rule: a pod whose init
containers all succeeded, ``kube.objects.Pod.inits_done`` read from its ``status``, holds its app
containers' charge only), against the cards each node registered
(``codec.node_inventory.decode_node``). It reports

- over-committed cards: memory, cores or slots above the registration, or a pod holding the card
  exclusively (all of its cores) sharing it with any other pod;
- pods bound (``spec.nodeName``) that ask for GPUs but carry no device annotations, and pods
  whose ``hami.io/vgpu-node`` differs from ``spec.nodeName``;
- grants of cards the pod's node did not register;
- phantom reservations: unbound pods still carrying ``vgpu-node`` or device annotations;
- node locks (``hami.io/mutex.lock``) still held;
- MIG instances (``tests.e2e.migaudit``, HAMi's formats read without gpuslice's codec): two held
  instances of one card that overlap, a placement its card's registered profiles do not allow,
  a record past ``Allocate`` without its runtime identity, a grant that differs from its profile;
- optionally, every difference between the extender's per-card gauges (``/metrics``:
  ``hami_gpu_memory_allocated_bytes``, ``hami_gpu_core_allocated_ratio``,
  ``hami_gpu_shared_count``) and the usage derived from the API.

Nothing here trusts the extender: the metrics are only compared, never used to decide usage.
``settle`` first waits (bounded) until no pod is mid-bind.
"""

from __future__ import annotations

import dataclasses
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.codec import errors as codec_errors
from gpuslice.codec import keys, node_inventory, pod_devices, podspec
from gpuslice.kube import objects
from gpuslice.model import allocations, devices
from gpuslice_dev.controlplane import ControlPlane
from tests.e2e import migaudit

MiB = 1 << 20
GPU = "nvidia.com/gpu"
TERMINATED = ("Succeeded", "Failed")
BIND_ANNOTATIONS = (keys.VGPU_NODE, keys.DEVICES_ALLOCATED, keys.DEVICES_TO_ALLOCATE)
"""The pod annotations that reserve cards (HAMi counts a pod carrying them, bound or not)."""
USAGE_METRICS = {
    "hami_gpu_memory_allocated_bytes": "memory_bytes",
    "hami_gpu_core_allocated_ratio": "cores",
    "hami_gpu_shared_count": "slots",
}

Json = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class CardUse:
    """One registered card and what the API says is reserved on it."""

    node: str
    device: devices.GpuDevice
    memory_mib: int = 0
    cores: int = 0
    slots: int = 0
    pods: tuple[str, ...] = ()
    exclusive: tuple[str, ...] = ()
    """Pods whose reservation takes all of the card's cores (HAMi: an exclusive card)."""

    @property
    def usage(self) -> tuple[int, int, int]:
        """(memory bytes, cores, slots), the units of the extender's gauges."""
        return (self.memory_mib * MiB, self.cores, self.slots)

    def problems(self) -> list[str]:
        """Why this card is over-committed (empty when it is not)."""
        d = self.device
        out = []
        # A MIG card's instances are checked by placement (``migaudit``): profile cores are rounded
        # up, so seven 1g instances of an A100 hold 105 % in sum.
        if self.memory_mib > d.memory_mib and not d.is_mig:
            out.append(f"memory {self.memory_mib} > {d.memory_mib} MiB")
        if self.cores > d.cores and not d.is_mig:
            out.append(f"cores {self.cores} > {d.cores}")
        if self.slots > d.split_count:
            out.append(f"slots {self.slots} > {d.split_count}")
        if self.exclusive and len(self.pods) > 1:
            out.append(f"exclusive grant of {', '.join(self.exclusive)} shared")
        return out


@dataclasses.dataclass
class AuditReport:
    """The audit's findings; ``problems()`` is empty for a clean cluster."""

    cards: dict[str, CardUse]
    """Card UUID -> usage, for every card of every node whose registration decodes."""
    overcommitted: list[str] = dataclasses.field(default_factory=list)
    bound_without_devices: list[str] = dataclasses.field(default_factory=list)
    node_mismatch: list[str] = dataclasses.field(default_factory=list)
    foreign_grants: list[str] = dataclasses.field(default_factory=list)
    undecodable_pods: list[str] = dataclasses.field(default_factory=list)
    phantom: list[str] = dataclasses.field(default_factory=list)
    locks_held: dict[str, str] = dataclasses.field(default_factory=dict)
    mig: list[str] = dataclasses.field(default_factory=list)
    """MIG findings (``migaudit.findings``)."""
    usage_mismatch: list[str] | None = None
    """Extender vs API per card; None when the extender's metrics were not compared."""
    invalid_nodes: dict[str, str] = dataclasses.field(default_factory=dict)
    """Nodes whose registration does not decode and was not supplied (informational)."""
    supplied: frozenset[str] = frozenset()
    """Nodes whose cards came from ``registrations``, not from their annotation."""
    bound: dict[str, str] = dataclasses.field(default_factory=dict)
    """Non-terminated pods that request GPUs and are bound: key -> node."""
    pending: list[str] = dataclasses.field(default_factory=list)
    """Non-terminated pods that request GPUs and are not bound."""
    allocating: list[str] = dataclasses.field(default_factory=list)
    """Bound pods still in ``bind-phase: allocating`` (their device plugin has not answered)."""

    def problems(self) -> list[str]:
        """Every finding that breaks "a card is never handed out twice" or leaves state behind."""
        out = [f"over-committed {c}" for c in self.overcommitted]
        out += [f"bound without devices: {p}" for p in self.bound_without_devices]
        out += [f"vgpu-node differs from nodeName: {p}" for p in self.node_mismatch]
        out += [f"grant of a card its node does not have: {p}" for p in self.foreign_grants]
        out += [f"undecodable device annotation: {p}" for p in self.undecodable_pods]
        out += [f"phantom reservation: {p}" for p in self.phantom]
        out += [f"node lock held on {n}: {v}" for n, v in sorted(self.locks_held.items())]
        out += [f"MIG: {m}" for m in self.mig]
        out += [f"extender usage != API usage: {m}" for m in self.usage_mismatch or []]
        return out

    def summary(self) -> str:
        """One line of counts, for ``print``."""
        used = sum(1 for c in self.cards.values() if c.pods)
        return (
            f"{len(self.bound)} bound, {len(self.pending)} pending, {len(self.allocating)} allocating; "
            f"{used}/{len(self.cards)} cards in use; {len(self.problems())} problems"
            + ("" if self.usage_mismatch is None else ", extender usage compared")
        )

    def assert_clean(self, context: str = "") -> None:
        """Fail with every problem listed."""
        problems = self.problems()
        assert not problems, f"audit {context}: {len(problems)} problems:\n  " + "\n  ".join(problems[:50])


def read(cp: ControlPlane) -> tuple[list[Json], list[Json]]:
    """Every Node and every Pod, as the admin sees them."""
    status, nodes = cp.api_request("GET", "/api/v1/nodes", timeout=30)
    assert status == 200, nodes
    status, pods = cp.api_request("GET", "/api/v1/pods", timeout=30)
    assert status == 200, pods
    return list(nodes.get("items") or []), list(pods.get("items") or [])


def wants_gpu(pod: Mapping[str, Any]) -> bool:
    """True when any container asks for ``nvidia.com/gpu`` (limits, else requests) above 0."""
    for kind in ("initContainers", "containers"):
        for c in podspec.containers(pod, kind):
            res = c.get("resources") or {}
            value = (res.get("limits") or {}).get(GPU, (res.get("requests") or {}).get(GPU))
            try:
                if value is not None and int(str(value)) > 0:
                    return True
            except ValueError:
                return True  # not a plain count: assume it asks (kube-scheduler would reject it)
    return False


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    meta = obj.get("metadata") or {}
    return dict(meta.get("annotations") or {})


def _key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def inits_done(pod: Mapping[str, Any]) -> bool:
    """``kube.objects.Pod.inits_done`` of an API pod (False when the pod does not decode)."""
    try:
        return msgspec.convert(pod, objects.Pod).inits_done
    except msgspec.ValidationError:
        return False


def inventories(
    nodes: Iterable[Mapping[str, Any]], registrations: Mapping[str, Sequence[devices.GpuDevice]] | None = None
) -> tuple[dict[str, tuple[devices.GpuDevice, ...]], dict[str, str]]:
    """Node -> registered cards (``registrations`` override the annotation), and undecodable nodes."""
    known: dict[str, tuple[devices.GpuDevice, ...]] = {}
    invalid: dict[str, str] = {}
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name", ""))
        if registrations is not None and name in registrations:
            known[name] = tuple(registrations[name])
            continue
        try:
            known[name] = node_inventory.decode_node(name, _annotations(node)).devices
        except codec_errors.AnnotationMissing:
            continue  # not a GPU node
        except codec_errors.DecodeError as exc:
            invalid[name] = str(exc)
    return known, invalid


def api_usage(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    registrations: Mapping[str, Sequence[devices.GpuDevice]] | None = None,
) -> AuditReport:
    """The audit of one API read (pure: no I/O).

    Args:
        nodes: the items of ``GET /api/v1/nodes``.
        pods: the items of ``GET /api/v1/pods``.
        registrations: cards of nodes whose annotation was deliberately corrupted (node -> cards).
    """
    known, invalid = inventories(nodes, registrations)
    card_node = {d.uuid: (n, d) for n, devs in known.items() for d in devs}
    acc: dict[str, dict[str, Any]] = {
        u: {"memory": 0, "cores": 0, "slots": 0, "pods": [], "exclusive": []} for u in card_node
    }
    supplied = frozenset(n for n in known if registrations is not None and n in registrations)
    report = AuditReport(cards={}, invalid_nodes=invalid, supplied=supplied)
    for pod in pods:
        key = _key(pod)
        phase = str((pod.get("status") or {}).get("phase", ""))
        if phase in TERMINATED:
            continue
        ann = _annotations(pod)
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        gpu = wants_gpu(pod)
        if gpu and node:
            report.bound[key] = node
            if ann.get(keys.BIND_PHASE) == keys.BIND_PHASE_ALLOCATING:
                report.allocating.append(key)
        elif gpu:
            report.pending.append(key)
        carried = [k for k in BIND_ANNOTATIONS if k in ann]
        if not node and carried:
            report.phantom.append(f"{key} carries {', '.join(carried)}")
        if node and gpu and not (keys.VGPU_NODE in ann and keys.DEVICES_ALLOCATED in ann):
            report.bound_without_devices.append(f"{key} on {node}")
        if node and keys.VGPU_NODE in ann and ann[keys.VGPU_NODE] != node:
            report.node_mismatch.append(f"{key}: vgpu-node {ann[keys.VGPU_NODE]}, nodeName {node}")
        try:
            alloc = pod_devices.allocation_from_pod(pod)
        except codec_errors.DecodeError as exc:
            report.undecodable_pods.append(f"{key}: {exc}")
            continue
        if alloc is None:
            continue
        for uuid, use in allocations.card_reservation(alloc, inits_done(pod)).items():
            owner = card_node.get(uuid)
            if owner is None or owner[0] != alloc.node:
                where = "an unregistered card" if owner is None else f"a card of {owner[0]}"
                report.foreign_grants.append(f"{key} on {alloc.node} holds {uuid} ({where})")
                if owner is None:
                    continue
            a = acc[uuid]
            a["memory"] += use.memory_mib
            a["cores"] += use.cores
            a["slots"] += use.slots
            a["pods"].append(key)
            if owner[1].cores > 0 and use.cores >= owner[1].cores and not owner[1].is_mig:
                a["exclusive"].append(key)
    for uuid, (node_name, dev) in card_node.items():
        a = acc[uuid]
        card = CardUse(
            node=node_name,
            device=dev,
            memory_mib=a["memory"],
            cores=a["cores"],
            slots=a["slots"],
            pods=tuple(sorted(a["pods"])),
            exclusive=tuple(sorted(a["exclusive"])),
        )
        report.cards[uuid] = card
        for problem in card.problems():
            report.overcommitted.append(f"{node_name}/{uuid} ({', '.join(card.pods)}): {problem}")
    for node_obj in nodes:
        lock = _annotations(node_obj).get(keys.NODE_LOCK)
        if lock:
            report.locks_held[str((node_obj.get("metadata") or {}).get("name", ""))] = lock
    report.mig = migaudit.findings(nodes, pods)
    return report


def parse_metrics(text: str) -> dict[tuple[str, str], tuple[int, int, int]]:
    """The extender's per-card usage: (node, card UUID) -> (memory bytes, cores, slots)."""
    found: dict[tuple[str, str], dict[str, int]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            field = USAGE_METRICS.get(sample.name)
            if field is None:
                continue
            card = (sample.labels.get("node", ""), sample.labels.get("device_uuid", ""))
            found.setdefault(card, {})[field] = round(sample.value)
    return {c: (v.get("memory_bytes", 0), v.get("cores", 0), v.get("slots", 0)) for c, v in found.items()}


def scrape(url: str, timeout: float = 10.0) -> str:
    """GET ``<url>/metrics``."""
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout) as resp:  # noqa: S310 - loopback
        text: str = resp.read().decode()
    return text


def compare_usage(report: AuditReport, extender: Mapping[tuple[str, str], tuple[int, int, int]]) -> list[str]:
    """Cards where the extender's usage differs from the API's (nodes whose registration decodes).

    A card the API knows but the extender does not list counts as a difference; so does a card
    the extender lists on a node the API does not register it on. Nodes whose cards the test
    supplied (their annotation is garbage on purpose) are left out: the extender cannot know them.
    """
    out: list[str] = []
    api = {(c.node, uuid): c.usage for uuid, c in report.cards.items() if c.node not in report.supplied}
    for card, use in sorted(api.items()):
        theirs = extender.get(card)
        if theirs is None:
            out.append(f"{card[0]}/{card[1]}: missing from the extender's metrics (API {use})")
        elif theirs != use:
            out.append(f"{card[0]}/{card[1]}: extender {theirs} vs API {use} (memory bytes, cores, slots)")
    for card, theirs in sorted(extender.items()):
        skip = card[0] in report.invalid_nodes or card[0] in report.supplied
        if card not in api and not skip and any(theirs):
            out.append(f"{card[0]}/{card[1]}: extender {theirs}, unknown to the API")
    return out


def mid_bind(nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """What is still moving: node locks held and unbound pods carrying bind annotations."""
    out = [
        f"lock on {(n.get('metadata') or {}).get('name')}" for n in nodes if keys.NODE_LOCK in _annotations(n)
    ]
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName") or str(
            (pod.get("status") or {}).get("phase")
        ) in TERMINATED:
            continue
        if any(k in _annotations(pod) for k in BIND_ANNOTATIONS):
            out.append(f"unbound {_key(pod)} with bind annotations")
    return out


def settle(cp: ControlPlane, timeout: float = 30.0, quiet_s: float = 1.0) -> float:
    """Wait until no pod is mid-bind for ``quiet_s`` (bounded by ``timeout``); returns seconds waited.

    Returns at the timeout as well: the audit then reports what did not settle.
    """
    start = time.monotonic()
    quiet_since: float | None = None
    while time.monotonic() - start < timeout:
        nodes, pods = read(cp)
        if mid_bind(nodes, pods):
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            break
        time.sleep(0.25)
    return time.monotonic() - start


def audit(
    cp: ControlPlane,
    *,
    extender_url: str | None = None,
    registrations: Mapping[str, Sequence[devices.GpuDevice]] | None = None,
    settle_timeout: float = 30.0,
    agree_timeout: float = 15.0,
    log: Callable[[str], None] = print,
) -> AuditReport:
    """Settle, then audit from one API read; with ``extender_url``, compare its gauges too.

    The extender's cache follows the watch, so its gauges may lag one read of the API: the
    comparison is repeated (fresh API read and scrape) for up to ``agree_timeout`` seconds, and the
    last differences are reported.
    """
    waited = settle(cp, settle_timeout)
    start = time.monotonic()
    deadline = start + agree_timeout
    while True:
        nodes, pods = read(cp)
        report = api_usage(nodes, pods, registrations)
        if extender_url is None:
            break
        try:
            report.usage_mismatch = compare_usage(report, parse_metrics(scrape(extender_url)))
        except OSError as exc:
            report.usage_mismatch = [f"cannot scrape {extender_url}/metrics: {exc}"]
        if not report.usage_mismatch or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    agreed = "" if extender_url is None else f", compared for {time.monotonic() - start:.1f} s"
    log(f"audit after {waited:.1f} s settling{agreed}: {report.summary()}")
    return report
