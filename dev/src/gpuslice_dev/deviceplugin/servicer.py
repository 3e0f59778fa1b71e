"""The ``v1beta1.DevicePlugin`` gRPC service kubelet calls (grpc.aio).

- ``GetDevicePluginOptions``: ``GetPreferredAllocationAvailable`` true, ``PreStartRequired`` false,
  as HAMi answers (kubelet takes the options from this call, not from ``Register``).
- ``ListAndWatch``: the replica list (``inventory.kubelet_devices``) at once, then again whenever
  the inventory changes (a card's health); the stream ends when the plugin stops or restarts.
- ``GetPreferredAllocation``: ``preferred.choose`` against the next entry of the pod being
  allocated (HAMi: the same pod lookup as ``Allocate``; kubelet asks once per container, just
  before that container's ``Allocate``, so the next non-empty entry is that container's).
- ``Allocate``: ``allocator.Allocator``; its errors become gRPC status ``UNKNOWN`` with the message,
  which is what a Go plugin's plain error gives.
- ``PreStartContainer``: empty.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from gpuslice.codec import keys
from gpuslice.kube import errors
from gpuslice.model import allocations
from gpuslice_dev.deviceplugin import allocator, entries, inventory, pending, preferred
from gpuslice_dev.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]


class DeviceList:
    """The current inventory and a way to wait for the next one (single event loop)."""

    def __init__(self, first: inventory.Inventory) -> None:
        self._current = first
        self._version = 0
        self._changed = asyncio.Condition()

    @property
    def current(self) -> inventory.Inventory:
        """The inventory now."""
        return self._current

    @property
    def version(self) -> int:
        """Bumped on every ``set``."""
        return self._version

    async def set(self, value: inventory.Inventory) -> None:
        """Replace the inventory and wake every watcher."""
        async with self._changed:
            self._current = value
            self._version += 1
            self._changed.notify_all()

    async def wait_newer(self, version: int) -> int:
        """Wait until the version passes ``version``; returns the new version."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._version > version)
            return self._version


class Servicer(api_pb2_grpc.DevicePluginServicer):
    """kubelet's side of the plugin.

    Args:
        cards: the inventory and its changes.
        split_count: replicas per card.
        numa_topology: put each card's NUMA node in the device list.
        allocate: the ``Allocate`` logic.
        stopping: set when the server is going away (ends ``ListAndWatch`` streams).
    """

    def __init__(
        self,
        cards: DeviceList,
        split_count: int,
        numa_topology: bool,
        allocate: allocator.Allocator,
        stopping: asyncio.Event,
    ) -> None:
        self.cards = cards
        self.split_count = split_count
        self.numa_topology = numa_topology
        self.allocator = allocate
        self.stopping = stopping

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Context
    ) -> api_pb2.DevicePluginOptions:
        """HAMi's options."""
        return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        """The device list now, and after every change, until the server stops."""
        version = self.cards.version
        yield self._list()
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            while not self.stopping.is_set():
                change = asyncio.ensure_future(self.cards.wait_newer(version))
                done, _ = await asyncio.wait({change, stop}, return_when=asyncio.FIRST_COMPLETED)
                if change not in done:
                    change.cancel()
                    break
                version = change.result()
                log.info("device list changed; sending %d devices to kubelet", len(self._list().devices))
                yield self._list()
        finally:
            stop.cancel()

    def _list(self) -> api_pb2.ListAndWatchResponse:
        devices = inventory.kubelet_devices(self.cards.current, self.split_count, self.numa_topology)
        return api_pb2.ListAndWatchResponse(devices=devices)

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Context
    ) -> api_pb2.PreferredAllocationResponse:
        """Replicas of the annotated cards when the pod is known, else a spread over cards."""
        desired = await self._next_entry()
        order = inventory.card_order(self.cards.current)
        out = api_pb2.PreferredAllocationResponse()
        for creq in request.container_requests:
            chosen = preferred.choose(
                list(creq.available_deviceIDs),
                list(creq.must_include_deviceIDs),
                creq.allocation_size,
                desired,
                order,
            )
            out.container_responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return out

    async def _next_entry(self) -> allocations.ContainerAllocation | None:
        try:
            pod = await pending.find(self.allocator.kube, self.allocator.settings.node)
        except (pending.NoBindingPod, errors.ApiError) as exc:
            log.info("GetPreferredAllocation without an annotated pod (%s)", exc)
            return None
        return entries.first_pending(pod.annotations.get(keys.DEVICES_TO_ALLOCATE, ""))

    async def Allocate(self, request: api_pb2.AllocateRequest, context: Context) -> api_pb2.AllocateResponse:
        """Serve the pod being allocated; an error rejects kubelet's pod."""
        try:
            return await self.allocator.allocate(request)
        except allocator.AllocateError as exc:
            log.warning("Allocate failed: %s", exc)
            await context.abort(grpc.StatusCode.UNKNOWN, str(exc))

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Context
    ) -> api_pb2.PreStartContainerResponse:
        """Nothing to do (``PreStartRequired`` is false)."""
        return api_pb2.PreStartContainerResponse()
