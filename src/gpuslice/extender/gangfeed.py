"""Watches -> gang directory: members from the pod watch, minimums from the group objects.

The pod watch (``feed.Feed.on_pod``) tells every pod event; a pod that names a gang
(``codec.gangs``) is kept in the ``framework.gangs.Directory`` with its GPU request and the node
it is bound to. The minimum a gang needs comes from the pod (gpuslice's annotations) or from its
group object, watched here where the apiserver serves its API:

* scheduler-plugins' ``PodGroup`` (``scheduling.x-k8s.io/v1alpha1``, a CRD);
* Kubernetes' native ``PodGroup`` (``scheduling.k8s.io/v1alpha2``) and ``Workload``
  (``scheduling.k8s.io/v1alpha1``), behind the ``GenericWorkload`` feature gate (KEP-4671).

An API the apiserver does not serve is looked up again every ``DISCOVERY_PERIOD_S`` (a CRD
installed later is picked up); none of these watches counts toward readiness, since most clusters
serve none of them. Every second the plans past their deadline are released (``Gangs.expire``)
and their waiting binds woken.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec

from gpuslice.codec import errors as codec_errors
from gpuslice.codec import gangs as codec_gangs
from gpuslice.extender import metrics, parsing, tasks
from gpuslice.extender.binding import barrier as barriers
from gpuslice.framework import gangs, logs
from gpuslice.kube import client as kclient
from gpuslice.kube import errors as kerrors
from gpuslice.kube import informer, kinds, objects
from gpuslice.model import config as model_config
from gpuslice.model import gangs as model_gangs
from gpuslice.model import requests

DISCOVERY_PERIOD_S = 10.0
"""How often an API group the apiserver did not serve is looked up again."""

GROUP_APIS: tuple[tuple[str, str, str], ...] = (
    (model_gangs.SOURCE_POD_GROUP, "/apis/scheduling.x-k8s.io/v1alpha1", "podgroups"),
    (model_gangs.SOURCE_SCHEDULING_GROUP, "/apis/scheduling.k8s.io/v1alpha2", "podgroups"),
    (model_gangs.SOURCE_WORKLOAD, "/apis/scheduling.k8s.io/v1alpha1", "workloads"),
)
"""(source, group-version path, resource) of every gang group object gpuslice reads."""


class GangFeed:
    """Keeps the gang directory current and expires plans (module docstring).

    Args:
        kube: the API client.
        directory: the members and minimums to keep.
        plans: the gangs' plans (told when a member goes, expired every second).
        barrier: woken for plans that expire.
        request_config: how a member's GPU request is parsed.
        log: where problems go.
        metrics_: where plan counts go.
        clock: wall-clock seconds.
    """

    def __init__(
        self,
        kube: kclient.KubeClient,
        directory: gangs.Directory,
        plans: gangs.Gangs,
        barrier: barriers.Barrier,
        request_config: model_config.RequestConfig,
        log: logs.Log,
        metrics_: metrics.Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.directory = directory
        self.plans = plans
        self.barrier = barrier
        self.request_config = request_config
        self.log = log
        self.metrics = metrics_
        self.clock = clock

    # ----- pods

    def on_pod(self, key: str, pod: objects.Pod, deleted: bool) -> None:
        """A pod event (``feed.Feed.on_pod``): keep or drop the pod as a gang member."""
        if deleted or pod.terminated:
            self.directory.gone(key)
            self.plans.member_gone(key)
            return
        meta, spec = pod.metadata, pod.spec
        ref = parsing.gang_of(
            meta.namespace, meta.labels, meta.annotations, spec.scheduling_group, spec.workload_ref
        )
        if not isinstance(ref, model_gangs.GangRef):
            self.directory.pod(None, gangs.Member(key, meta.uid, None))
            return
        parsed = parsing.request_of(pod, self.request_config)
        request = parsed if isinstance(parsed, requests.PodRequest) else None
        self.directory.pod(ref, gangs.Member(key, meta.uid, request, spec.node_name))

    # ----- group objects

    def _on_group(self, source: str) -> Callable[[informer.Event[objects.GroupObject]], None]:
        def handle(event: informer.Event[objects.GroupObject]) -> None:
            obj = event.obj
            if obj is None:
                return
            ns, name = obj.metadata.namespace or "default", obj.metadata.name
            deleted = event.type is informer.EventType.DELETED
            try:
                self._apply_group(source, ns, name, obj.spec, deleted)
            except codec_errors.DecodeError as err:
                self.log.warning("gang group object not understood", object=f"{ns}/{name}", err=str(err))
                self._apply_group(source, ns, name, {}, True)

        return handle

    def _apply_group(self, source: str, ns: str, name: str, spec: dict[str, Any], deleted: bool) -> None:
        obj = {"spec": spec}
        if source == model_gangs.SOURCE_WORKLOAD:
            groups = spec.get("podGroups") if isinstance(spec.get("podGroups"), list) else []
            for g in groups or []:
                pod_group = g.get("name") if isinstance(g, dict) else None
                if isinstance(pod_group, str):
                    found = None if deleted else codec_gangs.workload_group(obj, pod_group)
                    self.directory.group(source, ns, name, found, pod_group)
            return
        if deleted:
            self.directory.group(source, ns, name, None)
            return
        decode = (
            codec_gangs.pod_group if source == model_gangs.SOURCE_POD_GROUP else codec_gangs.native_pod_group
        )
        self.directory.group(source, ns, name, decode(obj))

    async def _served(self, path: str, resource: str) -> bool:
        try:
            resp = await self.kube.request("GET", path)
        except kerrors.NotFound:
            return False
        body = msgspec.json.decode(resp.content)
        found = body.get("resources") if isinstance(body, dict) else None
        return any(isinstance(r, dict) and r.get("name") == resource for r in found or [])

    async def _watch_group(self, source: str, path: str, resource: str) -> None:
        """Look the API up until it is served, then watch its objects."""
        while True:
            try:
                if await self._served(path, resource):
                    break
            except kerrors.ApiError as err:
                self.log.v(2, "gang API lookup failed", api=path, err=str(err))
            await asyncio.sleep(DISCOVERY_PERIOD_S)
        self.log.info("watching gang group objects", api=f"{path}/{resource}")
        inf = informer.Informer(
            self.kube, kinds.group_kind(f"{source}s", f"{path}/{resource}"), self._on_group(source)
        )
        await inf.run()

    async def _expire(self) -> None:
        counted = {"planned": 0, "refused": 0, "released": 0}
        while True:
            await asyncio.sleep(1.0)
            for gang in self.plans.expire(self.clock()):
                self.log.info("gang plan expired", gang=gang)
                self.barrier.wake(gang)
            self.export(counted)

    def export(self, counted: dict[str, int]) -> None:
        """Bring the plan metrics up to the plans' counts (``counted``: what was exported before)."""
        plans = self.plans
        for outcome, now in (
            ("planned", plans.planned),
            ("refused", plans.refused),
            ("released", plans.released),
        ):
            if now > counted[outcome]:
                self.metrics.gang_plans.labels(outcome).inc(now - counted[outcome])
                counted[outcome] = now
        self.metrics.gangs_held.set(plans.held())

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[GangFeed]:
        """Watch the group objects and expire plans until the context exits."""
        async with contextlib.AsyncExitStack() as stack:
            for source, path, resource in GROUP_APIS:
                await stack.enter_async_context(
                    tasks.background(self._watch_group(source, path, resource), f"gang-{source}")
                )
            await stack.enter_async_context(tasks.background(self._expire(), "gang-expiry"))
            yield self
