"""``Allocate``: serve the pod the node lock names, consume its annotation, finish the bind handshake.

One call at a time per plugin (HAMi holds ``applyMutex`` across the whole call). For each container
request of kubelet's ``AllocateRequest``:

1. the pod is found (``pending.find``); without one kubelet's pod is rejected and nothing is written;
2. the first ``vgpu-devices-to-allocate`` entry that lists cards is taken (``entries.pop_next``),
   its container looked up (init containers first), and its card count must equal the number of
   device IDs kubelet passed, else ``device number not matched``; with ``align_to_kubelet`` (HAMi's
   ``enableGetPreferredAllocation``) the cards are those kubelet picked, otherwise the annotation's;
3. the container's answer is built (``responses``) after its shared-cache dir is made; a container
   holding MIG instances (``hami.io/vgpu-mig-allocations``) gets them instead: its instances are
   created, which gives each record its ``migUUID``, ``gpuInstanceID`` and ``computeInstanceID``
   (``gpuslice_dev.migsim``), and it sees those MIG devices without HAMi-core (HAMi's MIG mode,
   ``annotateMigRuntimeInfo`` and ``getAllocateResponse``).

Then the remaining value is written back in one merge patch, compare-and-swap on the pod's
``resourceVersion`` and UID (a conflict re-reads the pod and starts over); when no ``NVIDIA`` entry
is left the same patch sets ``hami.io/bind-phase: success`` (HAMi patches it separately, after
re-reading the pod); the records realised by this call go into the same patch (HAMi: a patch of
their own, also compare-and-swap on the ``resourceVersion``), and the node lock is released,
owner-checked and compare-and-swap (``kube.locks.release``). Any failure after the pod was found
sets ``bind-phase: failed`` and releases the lock (HAMi's ``PodAllocationFailed``), and kubelet
gets the error, rejecting the pod with ``UnexpectedAdmissionError``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Callable

from gpuslice.codec import errors as codec_errors
from gpuslice.codec import keys, mig_allocations
from gpuslice.kube import client as kclient
from gpuslice.kube import errors, locks, pods
from gpuslice.model import allocations
from gpuslice_dev import migsim
from gpuslice_dev.deviceplugin import entries, hostdirs, inventory, pending, podview, responses
from gpuslice_dev.deviceplugin.v1beta1 import api_pb2

log = logging.getLogger(__name__)

CAS_ATTEMPTS = 5
"""Re-reads of the pod after a lost compare-and-swap before the call fails."""
DEVICE_NUMBER_NOT_MATCHED = "device number not matched"
NO_PENDING = "no pending device allocation found"
NO_MIG_RECORD = "no realised MIG allocation found for pod"


class AllocateError(Exception):
    """``Allocate`` failed; the message goes back to kubelet (and into the pod's rejection)."""


class _Failure(Exception):
    """A failure for a known pod: mark it failed and release the lock."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """How ``Allocate`` answers.

    Attributes:
        node: this node's name.
        options: env switches (memory scaling, log level, core limit, device specs).
        paths: host and container paths.
        align_to_kubelet: give the container the cards of kubelet's device IDs rather than the
            annotation's (HAMi's ``enableGetPreferredAllocation``; kubelet follows
            ``GetPreferredAllocation``, so both agree unless kubelet overrides it).
    """

    node: str
    options: responses.Options = dataclasses.field(default_factory=responses.Options)
    paths: responses.Paths = dataclasses.field(default_factory=responses.Paths)
    align_to_kubelet: bool = False


@dataclasses.dataclass(frozen=True)
class _Planned:
    container: responses.Container
    remaining: str
    position: int


class Allocator:
    """Answers kubelet's ``Allocate`` calls for one node.

    Args:
        kube: the API client.
        settings: see ``Settings``.
        cards: the current inventory (UUID to NVML index for device nodes; unknown cards fail).
        new_id: the shared-cache file name per container (HAMi: a random UUID).
    """

    def __init__(
        self,
        kube: kclient.KubeClient,
        settings: Settings,
        cards: Callable[[], inventory.Inventory],
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self.kube = kube
        self.settings = settings
        self._cards = cards
        self._new_id = new_id
        self._lock = asyncio.Lock()
        self.served: list[str] = []
        """Keys of pods whose every container was served (bind-phase success), in order."""
        self.failed: list[str] = []
        """Keys of pods marked ``bind-phase: failed``, in order."""

    async def allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        """Serve one ``AllocateRequest``.

        Raises:
            AllocateError: no pod is being allocated here, or its allocation failed (marked).
        """
        async with self._lock:
            node = self.settings.node
            try:
                pod = await pending.find(self.kube, node)
            except pending.NoBindingPod as exc:
                raise AllocateError(str(exc)) from None
            except errors.ApiError as exc:
                raise AllocateError(f"finding the pod to allocate on node {node}: {exc}") from None
            log.info("Allocate %s for pod %s", _ids(request), pod.key)
            if not entries.has_pending(pod.annotations.get(keys.DEVICES_TO_ALLOCATE, "")):
                await self._stale(pod)
                raise AllocateError(f"{NO_PENDING} for pod {pod.key}")
            try:
                return await self._serve(pod, request)
            except _Failure as exc:
                await self._mark_failed(pod)
                raise AllocateError(f"pod {pod.key}: {exc}") from None

    async def _serve(self, pod: podview.Pod, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        meta = pod.metadata
        for _ in range(CAS_ATTEMPTS):
            planned = self._plan(pod, request)
            realised = self._realise(pod, planned)
            answers = [self._answer(p.container) for p in planned]
            remaining = planned[-1].remaining
            done = not entries.has_pending(remaining)
            patch = {keys.DEVICES_TO_ALLOCATE: remaining}
            if realised is not None:
                patch[keys.MIG_ALLOCATIONS] = mig_allocations.encode(realised)
            if done:
                patch[keys.BIND_PHASE] = keys.BIND_PHASE_SUCCESS
            try:
                await pods.patch_annotations(
                    self.kube,
                    meta.namespace,
                    meta.name,
                    patch,
                    resource_version=pod.metadata.resource_version,
                    uid=meta.uid,
                )
            except errors.Conflict:
                try:
                    pod = await pending.get(self.kube, meta.namespace, meta.name)
                except errors.ApiError as exc:
                    raise _Failure(f"re-reading the pod: {exc}") from None
                if pod.metadata.uid != meta.uid:
                    raise _Failure("the pod was recreated during Allocate") from None
                continue
            except errors.ApiError as exc:
                raise _Failure(f"writing {keys.DEVICES_TO_ALLOCATE}: {exc}") from None
            if done:
                self.served.append(pod.key)
                await self._release(pod)
                log.info("pod %s: every container allocated; bind-phase success, node lock released", pod.key)
            return api_pb2.AllocateResponse(container_responses=answers)
        raise _Failure(f"the pod kept changing ({CAS_ATTEMPTS} lost compare-and-swaps)")

    def _plan(self, pod: podview.Pod, request: api_pb2.AllocateRequest) -> list[_Planned]:
        """Pop one entry per container request and check it; raises ``_Failure``."""
        value = pod.annotations.get(keys.DEVICES_TO_ALLOCATE, "")
        known = self._cards().by_uuid()
        planned: list[_Planned] = []
        if not request.container_requests:
            raise _Failure("empty AllocateRequest")
        for creq in request.container_requests:
            try:
                popped = entries.pop_next(value)
            except codec_errors.DecodeError as exc:
                raise _Failure(str(exc)) from None
            if popped is None:
                raise _Failure(NO_PENDING)
            container = podview.container_at(pod, popped.position)
            if container is None:
                raise _Failure(
                    f"container index {popped.position} out of range (init={len(pod.spec.init_containers)}, "
                    f"regular={len(pod.spec.containers)})"
                )
            if len(popped.grants) != len(creq.devices_ids):
                raise _Failure(DEVICE_NUMBER_NOT_MATCHED)
            grants = popped.grants
            if self.settings.align_to_kubelet:
                grants = tuple(
                    allocations.DeviceGrant(
                        uuid=inventory.physical_id(i), memory_mib=g.memory_mib, cores=g.cores, vendor=g.vendor
                    )
                    for g, i in zip(grants, creq.devices_ids, strict=True)
                )
            for grant in grants:
                if grant.uuid not in known:
                    raise _Failure(f"device {grant.uuid} is not on node {self.settings.node}")
            planned.append(
                _Planned(
                    container=responses.Container(
                        pod_uid=pod.metadata.uid,
                        name=container.name,
                        grants=grants,
                        control_disabled=podview.control_disabled(container),
                    ),
                    remaining=popped.remaining,
                    position=popped.position,
                )
            )
            value = popped.remaining
        return planned

    def _realise(self, pod: podview.Pod, planned: list[_Planned]) -> list[mig_allocations.Record] | None:
        """Create the served containers' MIG instances: the records with their runtime identity.

        Each planned container gets the MIG UUIDs of its records (in device order); None when
        nothing changes. Raises ``_Failure`` when the annotation does not decode, names a card of a
        served container that this node does not have, or a container holds a MIG card without a
        record (HAMi: ``no realised MIG allocation found for pod``).
        """
        cards = self._cards().by_uuid()
        value = pod.annotations.get(keys.MIG_ALLOCATIONS, "")
        try:
            records = mig_allocations.decode(value)
        except codec_errors.DecodeError as exc:
            raise _Failure(f"record MIG runtime placement: {exc}") from None
        for p in planned:
            on_mig = any(g.uuid in cards and cards[g.uuid].registered.is_mig for g in p.container.grants)
            if on_mig and not any(r.container == p.position for r in records):
                raise _Failure(f"record MIG runtime placement: {NO_MIG_RECORD}")  # HAMi's error
        if not records:
            return None
        slices = migsim.card_slices([c.registered for c in cards.values()])
        served = {p.position for p in planned}
        for r in records:
            if r.container in served and r.gpu_uuid not in cards:
                raise _Failure(f"resolve MIG parent GPU {r.gpu_uuid!r}")
        done = migsim.realise(records, lambda u: slices.get(u, migsim.A100_40GB_SLICES), served)
        for k, p in enumerate(planned):
            mine = sorted((r for r in done if r.container == p.position), key=lambda r: r.device)
            if mine:
                planned[k] = dataclasses.replace(
                    p, container=dataclasses.replace(p.container, mig_uuids=tuple(r.mig_uuid for r in mine))
                )
        return None if done == records else done

    def _answer(self, container: responses.Container) -> api_pb2.ContainerAllocateResponse:
        paths = self.settings.paths
        if container.mig_uuids:  # HAMi's MIG mode: no HAMi-core, so no shared-cache dir
            index_of = {uuid_: card.index for uuid_, card in self._cards().by_uuid().items()}
            return responses.container_response(
                container, self.settings.options, paths, index_of, "", hostdirs.exists
            )
        try:
            hostdirs.prepare_container(paths, container.pod_uid, container.name)
        except OSError as exc:
            raise _Failure(f"preparing {paths.cache_dir(container.pod_uid, container.name)}: {exc}") from None
        index_of = {uuid_: card.index for uuid_, card in self._cards().by_uuid().items()}
        return responses.container_response(
            container, self.settings.options, paths, index_of, self._new_id(), hostdirs.exists
        )

    async def _release(self, pod: podview.Pod) -> None:
        meta = pod.metadata
        try:
            await locks.release(self.kube, self.settings.node, meta.namespace, meta.name)
        except errors.ApiError as exc:
            log.error("pod %s: releasing the node lock failed: %s", pod.key, exc)

    async def _mark_failed(self, pod: podview.Pod) -> None:
        """HAMi's ``PodAllocationFailed``: ``bind-phase: failed`` and the lock released."""
        meta = pod.metadata
        self.failed.append(pod.key)
        try:
            await pods.patch_annotations(
                self.kube, meta.namespace, meta.name, {keys.BIND_PHASE: keys.BIND_PHASE_FAILED}, uid=meta.uid
            )
        except errors.ApiError as exc:
            log.error("pod %s: setting bind-phase failed: %s", pod.key, exc)
        await self._release(pod)

    async def _stale(self, pod: podview.Pod) -> None:
        """The named pod has nothing left: a lock it still holds after success is released."""
        if pod.annotations.get(keys.BIND_PHASE) == keys.BIND_PHASE_SUCCESS:
            log.warning("pod %s was fully allocated but still held the node lock; releasing it", pod.key)
            await self._release(pod)


def _ids(request: api_pb2.AllocateRequest) -> list[list[str]]:
    return [list(c.devices_ids) for c in request.container_requests]
