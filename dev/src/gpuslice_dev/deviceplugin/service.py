"""The running device plugin: cards and health from the backend, the gRPC plugin, the Node reports.

``run`` opens the backend (retried until it answers), reads the cards once (as HAMi's plugin does
at start), starts the agent's NVML health watcher (a card turning unhealthy, or healthy again
after the quiet period, makes a new inventory: ``ListAndWatch`` re-sends the list and the Node's
registration is written again), and runs ``plugin.Plugin`` and ``reporter.Reporter`` until
``stop`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable

from gpuslice.agent import backend, collect, discover, health
from gpuslice.kube import client as kclient
from gpuslice_dev.deviceplugin import allocator, hostdirs, inventory, plugin, reporter, servicer

log = logging.getLogger(__name__)

OPEN_RETRY_S = 5.0


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the plugin is told on its command line.

    Attributes:
        endpoint: socket dir, resource name, registration options.
        registration: split count, memory and core scaling.
        allocate: ``Allocate``'s settings (node, env options, paths, alignment).
        numa_topology: send each card's NUMA node to kubelet.
        quiet_period_s: how long an unhealthy card must stay quiet to be healthy again.
        report_period_s: time between Node reports.
        poll_s: socket check period.
        retry_s: least time between failed registrations.
        health_poll_s: the longest single NVML event wait (how soon recoveries and stops are seen).
    """

    endpoint: plugin.Endpoint
    registration: discover.RegistrationConfig
    allocate: allocator.Settings
    numa_topology: bool = True
    quiet_period_s: float = 300.0
    report_period_s: float = reporter.PERIOD_S
    poll_s: float = 1.0
    retry_s: float = 2.0
    health_poll_s: float = 1.0


class Service:
    """One node's device plugin.

    Args:
        settings: see ``Settings``.
        open_backend: opens the card source (raises ``backend.BackendError``).
        kube: the API client.
    """

    def __init__(
        self, settings: Settings, open_backend: Callable[[], backend.Backend], kube: kclient.KubeClient
    ) -> None:
        self.settings = settings
        self._open_backend = open_backend
        self.kube = kube
        self.cards: servicer.DeviceList | None = None
        self.plugin: plugin.Plugin | None = None
        self.reporter: reporter.Reporter | None = None
        self.allocator: allocator.Allocator | None = None
        self.ready = asyncio.Event()
        """Set once the cards are read and the plugin and reporter are running."""

    async def _open(self, stop: asyncio.Event) -> backend.Backend | None:
        while not stop.is_set():
            try:
                return await asyncio.to_thread(self._open_backend)
            except backend.BackendError as exc:
                log.warning(
                    "card source unavailable (%s: %s); retrying in %gs", exc.reason, exc, OPEN_RETRY_S
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), OPEN_RETRY_S)
        return None

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set."""
        nvml = await self._open(stop)
        if nvml is None:
            return
        watcher: health.Watcher | None = None
        try:
            records = await asyncio.to_thread(collect.inventory, nvml)
            s = self.settings
            first = inventory.build(records, s.registration)
            for note in first.notes:
                log.info("discovery: %s", note)
            log.info(
                "%s: %d cards: %s", nvml.describe(), len(first.cards), ", ".join(c.uuid for c in first.cards)
            )
            cards = self.cards = servicer.DeviceList(first)
            hostdirs.prepare(s.allocate.paths)
            loop = asyncio.get_running_loop()
            tracker = health.Tracker((c.index for c in first.cards), s.quiet_period_s)

            async def rebuild() -> None:
                healthy = watcher.healthy() if watcher is not None else {}
                await cards.set(inventory.build(records, s.registration, healthy))

            def on_change(_changes: list[health.Change]) -> None:  # the watcher's thread
                asyncio.run_coroutine_threadsafe(rebuild(), loop)

            watcher = health.Watcher(nvml, tracker, time.monotonic, on_change, poll_s=s.health_poll_s)
            watcher.start()
            allocate = self.allocator = allocator.Allocator(self.kube, s.allocate, lambda: cards.current)
            self.plugin = plugin.Plugin(
                s.endpoint,
                lambda stopping: servicer.Servicer(
                    cards, s.registration.split_count, s.numa_topology, allocate, stopping
                ),
                poll_s=s.poll_s,
                retry_s=s.retry_s,
            )
            self.reporter = reporter.Reporter(self.kube, s.allocate.node, cards, period_s=s.report_period_s)
            tasks = [
                asyncio.create_task(self.plugin.run(stop), name="deviceplugin-grpc"),
                asyncio.create_task(self.reporter.run(stop), name="deviceplugin-report"),
            ]
            self.ready.set()
            try:
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        finally:
            if watcher is not None:
                await asyncio.to_thread(watcher.stop)
            nvml.close()
