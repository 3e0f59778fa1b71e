"""The cluster's half of the placement-fidelity check: pods one at a time through a real kube-scheduler.

``sim.fidelity`` draws a trace slice and replays it in the simulator; this module replays the same
pods on the same nodes through etcd + kube-apiserver + kube-scheduler (configured by ``gpuslice
render scheduler-config``) + ``gpuslice serve`` + the device-plugin stand-in (``nodesim``). The two
layers are independent, so the data crossing between them is plain: node specs (``nodesim.make_node``
keyword arguments) and pod manifests come in, ``(node, card indices)`` pairs go out.

``FidelityCluster`` starts the control plane and the fake nodes once; each ``run`` starts a fresh
``gpuslice serve`` (the policy under test) and kube-scheduler, submits the pods in order and
stops both, then deletes the run's pods so the next run starts on empty nodes. Submission is
strictly serial, so the cluster sees the simulator's arrival order with no races: pod k is created,
then the harness waits (one pod watch on the run's namespace) until it is bound and the device
plugin stand-in has finished its handshake (phase ``Running``: node lock released, so the next
bind never waits for it), or until kube-scheduler reports it ``PodScheduled=False`` with reason
``Unschedulable``; such a pod is deleted at once, as the simulator drops a pod that does not fit.
A bound pod's cards are read back from HAMi's ``hami.io/vgpu-devices-allocated`` annotation
(``codec.pod_devices``) and mapped from UUIDs to registration indices.

Other ``PodScheduled=False`` reasons (``SchedulerError``: a failed bind, say) are transient:
kube-scheduler retries the pod, and the harness keeps waiting.

The extender flags the check depends on are built in one place, ``serve_flags`` and
``render_flags``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuslice.codec import keys, pod_devices
from gpuslice.kube import client as kclient
from gpuslice.kube import errors
from gpuslice_dev import controlplane, devcluster, nodesim

SCHEDULER = "gpuslice-scheduler"
"""The scheduler name of the rendered configuration (the pod manifests must ask for it)."""

NODE_CHOICES = ("extender", "rank", "blend")
"""``gpuslice serve --node-choice`` modes (see ``serve_flags``)."""


@functools.cache
def supports(command: tuple[str, ...], flag: str) -> bool:
    """True when ``gpuslice <command> --help`` lists ``flag`` (e.g. ``("serve",)``, ``--node-choice``)."""
    out = subprocess.run(  # noqa: S603 - our own CLI
        devcluster.gpuslice_command(*command, "--help"), check=False, capture_output=True, text=True
    )
    return f"{flag} " in out.stdout or f"{flag}\n" in out.stdout


def serve_supports(flag: str) -> bool:
    """True when ``gpuslice serve`` has ``flag``."""
    return supports(("serve",), flag)


def render_supports(flag: str) -> bool:
    """True when ``gpuslice render scheduler-config`` has ``flag``."""
    return supports(("render", "scheduler-config"), flag)


def serve_flags(
    policy: str,
    node_choice: str | None = None,
    workload_period_s: float | None = None,
    verbosity: int = 1,
) -> list[str]:
    """``gpuslice serve`` flags for one run: the policy at node and card level, and the wire mode.

    Args:
        policy: registry name, used as node and card policy (the simulator uses one for both).
        node_choice: ``--node-choice`` (``NODE_CHOICES``); None leaves the extender's default.
        workload_period_s: ``--workload-period-s`` (0: the shape of each filter request enters the
            target-workload histogram before that request is scored); None leaves the default.
        verbosity: ``-v``.
    """
    out = ["-v", str(verbosity), "--node-policy", policy, "--card-policy", policy]
    if node_choice is not None:
        out += ["--node-choice", node_choice]
    if workload_period_s is not None:
        out += ["--workload-period-s", f"{workload_period_s:g}"]
    return out


def render_flags(node_choice: str | None = None) -> list[str]:
    """``gpuslice render scheduler-config`` flags matching ``serve_flags`` (the extender's weight).

    Empty while ``render scheduler-config`` has no ``--node-choice`` (its default weight then).
    """
    if node_choice is None or not render_supports("--node-choice"):
        return []
    return ["--node-choice", node_choice]


@dataclasses.dataclass(frozen=True)
class ClusterRun:
    """The cluster's placements of the pods, in submission order.

    Attributes:
        placements: per pod, ``(node, card indices)`` or None when it was not placed.
        seconds: wall time from the first create to the last outcome.
        timeouts: pods with no outcome within the per-pod timeout (deleted, counted as unplaced).
        errors: pods bound without a readable device annotation or failed by the device plugin
            (counted as unplaced; never expected).
        log: the run's ``gpuslice serve`` log file.
    """

    placements: tuple[tuple[str, tuple[int, ...]] | None, ...]
    seconds: float
    timeouts: int
    errors: int
    log: Path


def _outcome(obj: Mapping[str, Any]) -> str | None:
    """``bound``, ``failed`` (bound, Allocate failed), ``unschedulable``, or None (not decided yet)."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if spec.get("nodeName"):
        phase = status.get("phase")
        if phase == "Running":
            return "bound"
        if phase == "Failed":
            return "failed"
        return None
    for cond in status.get("conditions") or ():
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            return "unschedulable"
    return None


class _Watch:
    """One pod watch on a namespace; ``expect(name)`` returns a future for that pod's outcome."""

    def __init__(self, kube: kclient.KubeClient, namespace: str, resource_version: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.rv = resource_version
        self.waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}

    def expect(self, name: str) -> asyncio.Future[dict[str, Any]]:
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiters[name] = fut
        return fut

    async def run(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        while True:
            params: dict[str, str | int | bool] = {
                "watch": "true",
                "resourceVersion": self.rv,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": 600,
            }
            async with self.kube.stream(path, params=params, read_timeout=None) as resp:
                async for line in resp.aiter_lines():
                    if line:
                        self._event(json.loads(line))

    def _event(self, event: Mapping[str, Any]) -> None:
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        self.rv = meta.get("resourceVersion") or self.rv
        if event.get("type") not in ("ADDED", "MODIFIED"):
            return
        fut = self.waiters.get(meta.get("name", ""))
        if fut is not None and not fut.done() and _outcome(obj) is not None:
            fut.set_result(obj)


def _cards(
    obj: Mapping[str, Any], uuid_index: Mapping[str, Mapping[str, int]]
) -> tuple[str, tuple[int, ...]]:
    """The bound pod's node and card indices from ``hami.io/vgpu-devices-allocated``.

    Raises:
        KeyError: no annotation, or a card the node did not register.
        codec.errors.DecodeError: a malformed annotation.
    """
    node = str(obj["spec"]["nodeName"])
    value = obj["metadata"]["annotations"][keys.DEVICES_ALLOCATED]
    index = uuid_index[node]
    cards = {index[g.uuid] for grants in pod_devices.decode(value) for g in grants}
    return node, tuple(sorted(cards))


async def _submit(
    kubeconfig: Path,
    namespace: str,
    pods: Sequence[Mapping[str, Any]],
    uuid_index: Mapping[str, Mapping[str, int]],
    timeout_s: float,
) -> tuple[list[tuple[str, tuple[int, ...]] | None], int, int, float]:
    kube = kclient.KubeClient.from_kubeconfig(kubeconfig, qps=0, burst=1000)
    watch_task: asyncio.Task[None] | None = None
    try:
        listed = await kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")
        watch = _Watch(kube, namespace, json.loads(listed.content)["metadata"]["resourceVersion"])
        watch_task = asyncio.create_task(watch.run())
        out: list[tuple[str, tuple[int, ...]] | None] = []
        timeouts = failures = 0
        start = time.perf_counter()
        for manifest in pods:
            name = str(manifest["metadata"]["name"])
            body = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
            fut = watch.expect(name)
            await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=body)
            try:
                obj = await asyncio.wait_for(fut, timeout_s)
            except TimeoutError:
                if watch_task.done():
                    watch_task.result()  # the watch died: raise its error rather than time out every pod
                timeouts += 1
                obj = None
            watch.waiters.pop(name, None)
            outcome = None if obj is None else _outcome(obj)
            placed: tuple[str, tuple[int, ...]] | None = None
            if outcome == "bound":
                assert obj is not None
                try:
                    placed = _cards(obj, uuid_index)
                except (KeyError, ValueError):
                    failures += 1
            elif outcome == "failed":
                failures += 1
            if placed is None:
                with contextlib.suppress(errors.NotFound):
                    await kube.request(
                        "DELETE",
                        f"/api/v1/namespaces/{namespace}/pods/{name}",
                        params={"gracePeriodSeconds": 0},
                    )
            out.append(placed)
        return out, timeouts, failures, time.perf_counter() - start
    finally:
        if watch_task is not None:
            watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, errors.ApiError):
                await watch_task
        await kube.aclose()


class FidelityCluster:
    """Control plane and fake nodes, started once; one ``run`` per policy (see the module docstring).

    Args:
        nodes: node name -> ``nodesim.make_node`` keyword arguments.
        workdir: logs and kubeconfigs (a temporary directory when None, removed at ``stop``).
        scheduler_name: the profile name (the manifests' ``schedulerName``).
    """

    def __init__(
        self,
        nodes: Mapping[str, Mapping[str, Any]],
        workdir: Path | None = None,
        scheduler_name: str = SCHEDULER,
    ) -> None:
        self.nodes = {name: dict(spec) for name, spec in nodes.items()}
        self.scheduler_name = scheduler_name
        self.cp = controlplane.ControlPlane(workdir=workdir)
        self.sim: devcluster.NodeSimThread | None = None
        self.runs = 0
        self.uuid_index = {
            name: {u: i for i, u in enumerate(nodesim.card_uuids(name, int(spec.get("count", 8))))}
            for name, spec in self.nodes.items()
        }

    def start(self) -> FidelityCluster:
        """Start etcd + kube-apiserver and create the nodes with their device-plugin stand-in."""
        self.cp.start()
        try:
            self.sim = devcluster.NodeSimThread(self.cp.kubeconfig, self.nodes).start()
        except BaseException:
            self.cp.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop everything this object started."""
        if self.sim is not None:
            self.sim.stop()
            self.sim = None
        self.cp.stop()

    def __enter__(self) -> FidelityCluster:
        """Start."""
        return self.start()

    def __exit__(self, *exc: object) -> None:
        """Stop."""
        self.stop()

    def run(
        self,
        pods: Sequence[Mapping[str, Any]],
        serve_args: Sequence[str],
        render_args: Sequence[str] = (),
        timeout_s: float = 30.0,
    ) -> ClusterRun:
        """Schedule ``pods`` (manifests without namespace) one at a time with a fresh extender.

        Args:
            pods: the manifests, in arrival order.
            serve_args: ``gpuslice serve`` flags (``serve_flags``).
            render_args: ``gpuslice render scheduler-config`` flags (``render_flags``).
            timeout_s: per-pod wait for an outcome.
        """
        self.runs += 1
        namespace = f"fid-{self.runs}"
        status, body = self.cp.api_request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        if status != 201:
            raise devcluster.DevClusterError(f"create namespace {namespace}: HTTP {status}: {body}")
        log = self.cp.workdir / f"gpuslice-{self.runs}.log"
        ext = devcluster.Extender(self.cp.kubeconfig, log, extra_args=serve_args)
        ext.start()
        try:
            config = devcluster.render_scheduler_config(
                ext.url, self.cp.kubeconfig, self.scheduler_name, extra_args=render_args
            )
            self.cp.start_scheduler(config)
            try:
                placed, timeouts, failures, seconds = asyncio.run(
                    _submit(self.cp.kubeconfig, namespace, pods, self.uuid_index, timeout_s)
                )
            finally:
                self.cp.stop_scheduler()
        finally:
            ext.stop()
        self._clear(namespace)
        return ClusterRun(tuple(placed), seconds, timeouts, failures, log)

    def _clear(self, namespace: str, timeout_s: float = 60.0) -> None:
        """Delete the run's pods and wait until they are gone (no kubelet: they go at once)."""
        self.cp.api_request("DELETE", f"/api/v1/namespaces/{namespace}/pods?gracePeriodSeconds=0")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status, body = self.cp.api_request("GET", f"/api/v1/namespaces/{namespace}/pods?limit=1")
            if status == 200 and not body.get("items"):
                return
            time.sleep(0.2)
        raise devcluster.DevClusterError(f"pods of {namespace} still there after {timeout_s:.0f} s")
