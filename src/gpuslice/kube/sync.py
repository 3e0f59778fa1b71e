"""Watches -> cache: three informers (Nodes, Pods, ResourceQuotas) feeding a ``ClusterCache``.

- **Nodes**: the HAMi registration (and gpuslice's topology/telemetry/cordon annotations) is
  decoded into a ``NodeInventory`` -> ``upsert_node``. A node without registration is not a GPU
  node -> ``remove_node``. A node whose registration is malformed is excluded the same way,
  remembered in ``invalid_nodes`` (node -> reason, so the extender can answer
  ``NodeRegistrationInvalid`` instead of "unregistered"), reported once per distinct problem as a
  Warning Event on the Node and through the ``on_invalid`` hook; every other node keeps working.
  Nodes whose GPU annotations did not change are not decoded again.
- **Nodes** also give their ``status.allocatable`` CPU and memory to the inventory, and **pods**
  bound to a node charge their host requests there (``host_request``, kube-scheduler's rules),
  GPU-less pods included: kube-scheduler fits pods into what is left, and the FGD-style policies
  weigh it, so the extender must see the same free CPU as the simulator does.
- **Pods**: a pod carrying ``hami.io/vgpu-node`` and ``hami.io/vgpu-devices-allocated`` that is
  not terminated (Succeeded/Failed) -> ``add_pod`` (confirms an assumed pod or charges one placed
  before a restart); a bound pod without cards -> ``add_pod`` of its host request alone;
  otherwise, or when deleted -> ``remove_pod``. A pod the cache holds as
  *assumed* (a bind in flight) is left to the bind path until it has a ``spec.nodeName``: an
  event from before the bind's annotation patch must not drop the reservation, and one from
  before the Binding must not confirm it early. Every ``add_pod`` passes ``Pod.inits_done`` (all
  init containers terminated with exit code 0, from ``status.initContainerStatuses``): the cache
  then charges the app containers only, and the init peak again should kubelet report them as
  not done (``docs/init-containers.md``). Every ``add_pod`` also passes the pod's job
  (``pod_job``: the value of the configured ``job_label``, else its controller owner's UID), so
  the cache can say which nodes hold a job's pods (``NodeState.jobs``, ``balanced``'s task
  affinity).
- **Pods** with another scheduler's filter claim and no binding (``kube.claims``; only with
  ``claim_expiry_s``): charged while the claim is held, removed from the cache once it is stale.
  Time and the claimed node's lock change that verdict without a pod event, so
  ``recheck_claims`` judges them again (the extender's feed calls it every second and when a
  node's lock changes) and applies a pod whose verdict changed; ``on_claim`` hears of each change.
- **Nodes**' telemetry annotation also gives the inventory its read time
  (``NodeInventory.telemetry_at``, the annotation's ``ts``): readers treat older readings as absent.
- **ResourceQuotas**: ``spec.hard`` -> GPU limits; several quotas in one namespace combine to the
  tightest limit of each resource -> ``set_quota``.

``readiness()`` is True only once every informer has listed, while all of them are healthy and
while none is relisting after a 410 (see ``informer.Informer.ready``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import msgspec

from gpuslice.cache import cache as cluster_cache
from gpuslice.codec import errors as codec_errors
from gpuslice.codec import keys, node_inventory, pod_devices, resources, telemetry
from gpuslice.kube import claims, events, informer, kinds, objects
from gpuslice.kube import client as kclient
from gpuslice.model import allocations, nodes, requests, status
from gpuslice.model import config as model_config
from gpuslice.policy import api
from gpuslice.policy import quota as quotas

log = logging.getLogger(__name__)

NODE_ANNOTATIONS = (
    keys.NODE_REGISTER,
    keys.NODE_PAIR_SCORE,
    keys.GPU_TOPOLOGY,
    keys.GPU_TELEMETRY,
    keys.DEVICE_CORDON,
)
"""The node annotations an inventory is decoded from."""
INVALID_ACTION = "Registering"
OBSERVED_LIMIT = 100_000
"""Pending GPU-less pods remembered as already observed (the oldest is forgotten first)."""


@functools.lru_cache(maxsize=4096)
def _container_host(
    limits: tuple[str | None, str | None], reqs: tuple[str | None, str | None]
) -> tuple[int, int]:
    """``resources.container_host`` on (cpu, memory) strings; cached, as pods repeat a few values."""
    names = ("cpu", "memory")
    return resources.container_host(
        {n: v for n, v in zip(names, limits, strict=True) if v is not None},
        {n: v for n, v in zip(names, reqs, strict=True) if v is not None},
    )


def _host(c: objects.Container) -> tuple[int, int]:
    lim, req = c.resources.limits, c.resources.requests
    return _container_host((lim.get("cpu"), lim.get("memory")), (req.get("cpu"), req.get("memory")))


def host_request(pod: objects.Pod) -> tuple[int, int] | None:
    """The pod's host CPU (milli) and memory (MiB) as kube-scheduler counts them (``resources.host_request``).

    None for a malformed quantity (the API server never stores one) or one beyond
    ``resources.HOST_BOUNDS`` (no node could run such a pod, so it holds no host resources).
    """
    try:
        apps = [_host(c) for c in pod.spec.containers]
        inits = [_host(c) for c in pod.spec.init_containers]
        return resources.checked_host_request(apps, inits, pod.sidecars)
    except codec_errors.DecodeError:
        return None


def pod_job(pod: objects.Pod, job_label: str = "") -> str:
    """A stored pod's job, as ``requests.PodRequest.job`` reads a pod under scheduling."""
    meta = pod.metadata
    owner = next((o.uid for o in meta.owner_references if o.controller and o.uid), "")
    return requests.job_key(owner, meta.labels.get(job_label) if job_label else None)


def telemetry_at(annotations: Mapping[str, str]) -> float | None:
    """When the node's telemetry was read (Unix seconds); None without a valid annotation."""
    value = annotations.get(keys.GPU_TELEMETRY)
    if not value:
        return None
    try:
        return telemetry.decode(value).timestamp.timestamp()
    except codec_errors.DecodeError:
        return None


class Sink(Protocol):
    """The cache operations the watches drive (``gpuslice.cache.cache.ClusterCache``)."""

    def upsert_node(self, inventory: nodes.NodeInventory) -> None:
        """Add or replace a node's inventory."""
        ...

    def remove_node(self, name: str) -> None:
        """Forget a node."""
        ...

    def add_pod(
        self, key: str, uid: str, alloc: allocations.PodAllocation, inits_done: bool = False, job: str = ""
    ) -> None:
        """Charge (or confirm) a placed pod; ``inits_done``: its app containers only; ``job``: its job."""
        ...

    def remove_pod(self, key: str) -> None:
        """Uncharge a pod."""
        ...

    def set_quota(self, namespace: str, limits: quotas.QuotaView | None) -> None:
        """Set or clear a namespace's GPU limits."""
        ...

    def pod_state(self, key: str) -> cluster_cache.PodState | None:
        """Whether the cache holds the pod as assumed or added (None: not at all)."""
        ...

    def observe_request(self, shape: api.Shape) -> None:
        """Record a requested pod shape for the target-workload histogram."""
        ...


def _tightest(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def combine(limits: list[resources.QuotaLimits]) -> quotas.QuotaView | None:
    """One namespace's quotas as one view: the smallest limit of each resource (None: none)."""
    count = memory = cores = None
    for q in limits:
        count, memory, cores = (
            _tightest(count, q.count),
            _tightest(memory, q.memory_mib),
            _tightest(cores, q.cores),
        )
    view = quotas.QuotaView(count_limit=count, memory_limit=memory, cores_limit=cores)
    return None if view.unlimited else view


@dataclasses.dataclass
class _Claim:
    """An unbound pod's filter claim that no bind took up, as last judged (``kube.claims``)."""

    pod: objects.Pod
    seen_at: float
    """When this process first saw this claim (its node, time and devices)."""
    verdict: claims.Claim


def _claim_print(pod: objects.Pod) -> tuple[str | None, ...]:
    ann = pod.metadata.annotations
    return (ann.get(keys.VGPU_NODE), ann.get(keys.VGPU_TIME), ann.get(keys.DEVICES_ALLOCATED))


class Sync:
    """Runs the informers and applies their events to the cache.

    Args:
        kube: the API client.
        cache: the cache to feed.
        recorder: where Warning events about invalid nodes go (None: no events).
        request_config: resource names and memory factor for quota parsing.
        on_invalid: metric hook, called ``(node, reason)`` when a node becomes invalid.
        transform: applied to every decoded inventory before the cache sees it (e.g. overcommit
            scaling of registered memory and cores).
        node_selector: label selector restricting the watched nodes.
        pod_selector: label selector restricting the watched pods (e.g. ``hami.io/vgpu-node``).
        resync_s: relist period of every informer.
        job_label: the pod label naming a pod's job (``pod_job``).
        claim_expiry_s: the node lock's expiry, after which another scheduler's filter claim on an
            unbound pod is stale and no longer charged (``kube.claims``); None: every claim is
            charged.
        clock: wall-clock unix seconds, for the claims' ages.
    """

    def __init__(
        self,
        kube: kclient.KubeClient,
        cache: Sink,
        *,
        recorder: events.Recorder | None = None,
        request_config: model_config.RequestConfig = model_config.DEFAULT_REQUEST_CONFIG,
        on_invalid: Callable[[str, str], None] | None = None,
        transform: Callable[[nodes.NodeInventory], nodes.NodeInventory] | None = None,
        node_selector: str | None = None,
        pod_selector: str | None = None,
        resync_s: float = informer.DEFAULT_RESYNC_S,
        job_label: str = "",
        claim_expiry_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.cache = cache
        self.claim_expiry_s = claim_expiry_s
        self.clock = clock
        self.on_claim: Callable[[str, claims.Claim], None] | None = None
        """Told of a claim first seen stale, and of each change between held and stale."""
        self._claims: dict[str, _Claim] = {}
        """Pod key -> its filter claim no bind took up (only with ``claim_expiry_s``)."""
        self.recorder = recorder
        self.request_config = request_config
        self.job_label = job_label
        """The pod label naming a pod's job ('' = its controller owner; ``pod_job``)."""
        self.on_invalid = on_invalid
        self.transform = transform
        self.invalid_nodes: dict[str, str] = {}
        """Node -> why its registration was rejected."""
        self.bad_pods: dict[str, str] = {}
        """Pod key -> why its device annotation could not be decoded (the pod is not charged)."""
        self._seen: dict[str, tuple[str | None, ...]] = {}
        self._observed: dict[str, None] = {}  # uids of pending GPU-less pods already observed (FIFO)
        self._quotas: dict[str, dict[str, resources.QuotaLimits]] = {}
        self.nodes = informer.Informer(
            kube, kinds.NODES, self.on_node, label_selector=node_selector, resync_s=resync_s
        )
        self.pods = informer.Informer(
            kube, kinds.PODS, self.on_pod, label_selector=pod_selector, resync_s=resync_s
        )
        self.quotas = informer.Informer(kube, kinds.QUOTAS, self.on_quota, resync_s=resync_s)
        self.informers: tuple[
            informer.Informer[objects.Node]
            | informer.Informer[objects.Pod]
            | informer.Informer[objects.ResourceQuota],
            ...,
        ] = (self.nodes, self.pods, self.quotas)
        self._tasks: list[asyncio.Task[None]] = []

    # ----- nodes

    def _invalid(self, node: objects.Node, reason: str) -> None:
        name = node.metadata.name
        self.cache.remove_node(name)
        if self.invalid_nodes.get(name) == reason:
            return
        self.invalid_nodes[name] = reason
        log.warning("node %s: %s: %s", name, status.NODE_REGISTRATION_INVALID, reason)
        if self.recorder is not None:
            self.recorder.record_node(
                name,
                node.metadata.uid,
                events.WARNING,
                status.NODE_REGISTRATION_INVALID,
                INVALID_ACTION,
                reason,
            )
        if self.on_invalid is not None:
            self.on_invalid(name, reason)

    def on_node(self, event: informer.Event[objects.Node]) -> None:
        """Apply one node event."""
        node = event.obj
        if node is None:
            return
        name = node.metadata.name
        if event.type is informer.EventType.DELETED:
            self._seen.pop(name, None)
            self.invalid_nodes.pop(name, None)
            self.cache.remove_node(name)
            return
        ann = node.metadata.annotations
        allocatable = node.status.allocatable
        fingerprint = (
            *(ann.get(k) for k in NODE_ANNOTATIONS),
            allocatable.get("cpu"),
            allocatable.get("memory"),
        )
        if self._seen.get(name) == fingerprint:
            return
        self._seen[name] = fingerprint
        try:
            inventory = node_inventory.decode_node(name, ann)
            cpu, memory = resources.allocatable_host(allocatable)
            inventory = msgspec.structs.replace(
                inventory, cpu_milli=cpu, memory_mib=memory, telemetry_at=telemetry_at(ann)
            )
        except codec_errors.AnnotationMissing:
            self.invalid_nodes.pop(name, None)
            self.cache.remove_node(name)
            return
        except codec_errors.DecodeError as exc:
            self._invalid(node, str(exc))
            return
        self.invalid_nodes.pop(name, None)
        self.cache.upsert_node(inventory if self.transform is None else self.transform(inventory))

    # ----- pods

    def on_pod(self, event: informer.Event[objects.Pod]) -> None:
        """Apply one pod event."""
        pod = event.obj
        if pod is not None:
            self.apply_pod(pod.key, pod, event.type is informer.EventType.DELETED)

    def apply_pod(self, key: str, pod: objects.Pod, deleted: bool) -> None:
        """Apply one pod event (``on_pod`` with the pod's key already made)."""
        if deleted or pod.terminated:
            self.bad_pods.pop(key, None)
            if self._claims:
                self._claims.pop(key, None)
            self.cache.remove_pod(key)
            return
        claim = self._judge_claim(key, pod)
        if not pod.spec.node_name and self.cache.pod_state(key) is cluster_cache.PodState.ASSUMED:
            return  # a bind in flight: the bind path confirms (or forgets) it
        if not pod.spec.node_name:
            self._observe_gpuless(pod)
        if claim is not None and not claim.held:
            self.cache.remove_pod(key)  # stale: the pod is scheduled as if it held nothing
            return
        init = len(pod.spec.init_containers)
        try:
            alloc = pod_devices.allocation_from_annotations(
                pod.metadata.annotations,
                init_count=init,
                container_count=init + len(pod.spec.containers),
                sidecars=pod.sidecars if init else (),
            )
        except codec_errors.DecodeError as exc:
            if self.bad_pods.get(key) != str(exc):
                log.warning("pod %s: device annotation not charged: %s", key, exc)
            self.bad_pods[key] = str(exc)
            alloc = None
        else:
            if self.bad_pods:
                self.bad_pods.pop(key, None)
        cpu, memory = host_request(pod) or (0, 0)
        if alloc is None:
            if not pod.spec.node_name or not (cpu or memory):
                self.cache.remove_pod(key)
                return
            # A pod without cards still takes host CPU and memory on its node, as kube-scheduler
            # counts them; the FGD-style policies weigh what is left (nodes.NodeState.cpu_free_milli).
            alloc = allocations.PodAllocation(node=pod.spec.node_name, containers=())
        alloc = msgspec.structs.replace(alloc, cpu_milli=cpu, memory_mib=memory)
        self.cache.add_pod(key, pod.metadata.uid, alloc, pod.inits_done, job=pod_job(pod, self.job_label))

    # ----- other schedulers' claims

    def _lock_value(self, node: str) -> str | None:
        obj = self.nodes.store.get(node)
        return None if obj is None else obj.metadata.annotations.get(keys.NODE_LOCK)

    def _judge_claim(self, key: str, pod: objects.Pod) -> claims.Claim | None:
        """Judge the pod's filter claim now and remember it; None when it has none (or no expiry)."""
        if self.claim_expiry_s is None or not claims.unclaimed_by_a_bind(pod):
            if self._claims:
                self._claims.pop(key, None)
            return None
        now = self.clock()
        before = self._claims.get(key)
        same = before is not None and _claim_print(before.pod) == _claim_print(pod)
        seen_at = before.seen_at if before is not None and same else now
        node = pod.metadata.annotations[keys.VGPU_NODE]
        verdict = claims.judge(pod, self._lock_value(node), now, self.claim_expiry_s, seen_at)
        if verdict is None:  # cannot happen: unclaimed_by_a_bind held
            return None
        self._claims[key] = _Claim(pod, seen_at, verdict)
        was_held = before.verdict.held if before is not None and same else True
        if verdict.held != was_held and self.on_claim is not None:
            self.on_claim(key, verdict)
        return verdict

    def recheck_claims(self, node: str | None = None, key: str | None = None) -> list[str]:
        """Judge the remembered claims again (on ``node``, of pod ``key``, or all) at ``clock()``.

        A pod whose claim turned stale (its age passed the expiry, or the lock that named it went)
        or held again (a lock came) is applied again, so the cache follows; so is a pod whose held
        claim the cache does not hold (a bind of it forgot its reservation meanwhile). Their keys
        are returned. ``key``, when given, must be a remembered claim's.
        """
        if not self._claims or self.claim_expiry_s is None:
            return []
        now = self.clock()
        changed = []
        entries = list(self._claims.items()) if key is None else [(key, self._claims[key])]
        for k, entry in entries:
            if node is not None and entry.verdict.node != node:
                continue
            verdict = claims.judge(
                entry.pod, self._lock_value(entry.verdict.node), now, self.claim_expiry_s, entry.seen_at
            )
            if verdict is None:  # cannot happen: the pod was remembered as unclaimed by a bind
                continue
            flipped = verdict.held != entry.verdict.held
            uncharged = verdict.held and self.cache.pod_state(k) is None
            if flipped or uncharged:
                self.apply_pod(k, entry.pod, deleted=False)  # judges and remembers it again
                changed.append(k)
            else:
                entry.verdict = verdict
        return changed

    def foreign_claim(self, key: str) -> claims.Claim | None:
        """Pod ``key``'s filter claim that no bind took up, judged now (the cache follows at once)."""
        if key not in self._claims:
            return None
        self.recheck_claims(key=key)  # the key is there: judged now
        entry = self._claims.get(key)
        return None if entry is None else entry.verdict

    # ----- GPU-less pods

    def _observe_gpuless(self, pod: objects.Pod) -> None:
        """Count a pending pod without GPU requests in the target workload, once per uid.

        FGD's target workload includes pods that ask no GPU (Weng et al., USENIX ATC 2023: a free
        card is a fragment to them); the extender's filter never sees such pods, so the pod feed
        observes them when it first sees them pending. GPU pods are observed by the filter. A pod
        whose host request does not decode within the bounds is never observed.
        """
        uid = pod.metadata.uid
        if not uid or uid in self._observed or self._asks_gpu(pod):
            return
        self._observed[uid] = None
        if len(self._observed) > OBSERVED_LIMIT:
            del self._observed[next(iter(self._observed))]
        host = host_request(pod)
        if host is not None:
            self.cache.observe_request(api.Shape(cpu_milli=host[0], share_milli=0, count=0))

    def _asks_gpu(self, pod: objects.Pod) -> bool:
        names = self.request_config.names
        wanted = (names.count, names.memory, names.memory_percentage, names.cores)
        for c in (*pod.spec.containers, *pod.spec.init_containers):
            r = c.resources
            if any(k in r.limits or k in r.requests for k in wanted):
                return True
        return False

    # ----- quotas

    def on_quota(self, event: informer.Event[objects.ResourceQuota]) -> None:
        """Apply one ResourceQuota event."""
        quota = event.obj
        if quota is None:
            return
        ns, name = quota.metadata.namespace, quota.metadata.name
        in_ns = self._quotas.setdefault(ns, {})
        if event.type is informer.EventType.DELETED:
            in_ns.pop(name, None)
        else:
            try:
                in_ns[name] = resources.parse_quota(quota.spec.hard, self.request_config)
            except codec_errors.DecodeError as exc:
                log.warning("resourcequota %s/%s ignored: %s", ns, name, exc)
                in_ns.pop(name, None)
        if not in_ns:
            self._quotas.pop(ns, None)
        self.cache.set_quota(ns, combine(list(in_ns.values())))

    # ----- lifecycle

    def readiness(self) -> bool:
        """True once every kind has listed, while every watch is healthy and no forced relist runs."""
        return all(i.ready for i in self.informers)

    async def run(self) -> None:
        """Run every informer until cancelled."""
        await asyncio.gather(*(i.run() for i in self.informers))

    async def __aenter__(self) -> Sync:
        self._tasks = [asyncio.create_task(i.run(), name=f"informer-{i.kind.name}") for i in self.informers]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
