"""The plugin's life next to kubelet: serve on a unix socket, register, follow kubelet's restarts.

kubelet's device-plugin API (``k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1``, constants.go): the
plugin serves ``v1beta1.DevicePlugin`` on ``<socket-dir>/<endpoint>`` and calls
``v1beta1.Registration/Register`` on ``<socket-dir>/kubelet.sock`` with the API version
``v1beta1``, its endpoint (the socket's file name), the resource name and its options. kubelet
then dials the endpoint, asks ``GetDevicePluginOptions`` and opens ``ListAndWatch``.

When kubelet restarts it deletes every socket in the directory and recreates ``kubelet.sock``.
Every ``poll_s`` the plugin checks both files by identity (``file_id``):

- its own socket gone or replaced: stop the server, start a fresh one on a new socket and
  register again (NVIDIA's and HAMi's plugins restart the same way, HAMi on the inotify event of
  ``kubelet.sock`` being created);
- ``kubelet.sock`` replaced since the last registration (a kubelet that did not clear the
  directory): register again;
- not registered yet: try whenever ``kubelet.sock`` exists, at most every ``retry_s`` after a
  failure (kubelet not up yet, or still starting).

``run`` returns when ``stop`` is set, after stopping the server and removing its socket (only if
the file is still the one it created).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable

import grpc

from gpuslice_dev.deviceplugin import servicer
from gpuslice_dev.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
"""``v1beta1.Version``."""
DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins"
"""``v1beta1.DevicePluginPath``."""
KUBELET_SOCKET = "kubelet.sock"
"""The registration socket's name in that directory (``v1beta1.KubeletSocket``)."""

FileId = tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where the plugin serves and registers.

    Attributes:
        socket_dir: kubelet's device-plugin directory.
        resource_name: the extended resource (``nvidia.com/gpu``).
        preferred_allocation: the ``GetPreferredAllocationAvailable`` option sent in ``Register``
            (HAMi sends its ``enableGetPreferredAllocation`` setting, default false).
    """

    socket_dir: str = DEVICE_PLUGIN_PATH
    resource_name: str = "nvidia.com/gpu"
    preferred_allocation: bool = False

    @property
    def name(self) -> str:
        """The socket's file name: ``nvidia-<resource suffix>.sock``, as HAMi names it."""
        return f"nvidia-{self.resource_name.rpartition('/')[2]}.sock"

    @property
    def socket(self) -> str:
        """The plugin's socket path."""
        return os.path.join(os.path.abspath(self.socket_dir), self.name)

    @property
    def kubelet_socket(self) -> str:
        """Kubelet's registration socket path."""
        return os.path.join(os.path.abspath(self.socket_dir), KUBELET_SOCKET)

    def register_request(self) -> api_pb2.RegisterRequest:
        """What ``Register`` sends."""
        return api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self.name,
            resource_name=self.resource_name,
            options=api_pb2.DevicePluginOptions(
                pre_start_required=False, get_preferred_allocation_available=self.preferred_allocation
            ),
        )


def file_id(path: str) -> FileId | None:
    """A file's identity (device, inode, change time); None when it does not exist.

    The change time tells a recreated socket from the old one when the filesystem reuses the
    freed inode number at once (tmpfs and overlayfs do).
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


async def register(endpoint: Endpoint, timeout_s: float = 5.0) -> None:
    """Call ``Register`` on kubelet's socket.

    Raises:
        grpc.aio.AioRpcError: kubelet refused or did not answer.
    """
    async with grpc.aio.insecure_channel(f"unix://{endpoint.kubelet_socket}") as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)
        await stub.Register(endpoint.register_request(), timeout=timeout_s)


class Plugin:
    """Serve, register, and restart when kubelet does.

    Args:
        endpoint: socket dir, resource name, options.
        make_servicer: builds the ``DevicePlugin`` service for one server; the event is set when
            that server goes away (its ``ListAndWatch`` streams end).
        poll_s: how often the sockets are checked.
        retry_s: the least time between failed registration attempts.
        register_timeout_s: deadline of one ``Register`` call.
        grace_s: how long a stopping server lets calls in flight finish.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        make_servicer: Callable[[asyncio.Event], servicer.Servicer],
        *,
        poll_s: float = 1.0,
        retry_s: float = 2.0,
        register_timeout_s: float = 5.0,
        grace_s: float = 1.0,
    ) -> None:
        self.endpoint = endpoint
        self._make_servicer = make_servicer
        self.poll_s = poll_s
        self.retry_s = retry_s
        self.register_timeout_s = register_timeout_s
        self.grace_s = grace_s
        self.starts = 0
        """Servers started (1 + restarts)."""
        self.registrations = 0
        """Successful ``Register`` calls."""
        self.registered = asyncio.Event()
        """Set after a successful ``Register``, cleared when the server restarts."""
        self._server: grpc.aio.Server | None = None
        self._stopping: asyncio.Event | None = None
        self._own: FileId | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set."""
        try:
            while not stop.is_set():
                await self._start()
                await self._watch(stop)
                await self._stop_server()
        finally:
            await self._stop_server()

    async def _watch(self, stop: asyncio.Event) -> None:
        """Register when possible; return when the server must restart or ``stop`` is set."""
        registered_with: FileId | None = None
        next_try = 0.0
        while not stop.is_set():
            if file_id(self.endpoint.socket) != self._own:
                log.warning("socket %s was removed (kubelet restarted?); restarting", self.endpoint.socket)
                return
            kubelet = file_id(self.endpoint.kubelet_socket)
            if kubelet is not None and kubelet != registered_with and time.monotonic() >= next_try:
                if registered_with is not None:
                    log.info("%s was recreated; registering again", self.endpoint.kubelet_socket)
                try:
                    await register(self.endpoint, self.register_timeout_s)
                except grpc.aio.AioRpcError as exc:
                    log.warning("registering with kubelet failed (%s: %s)", exc.code().name, exc.details())
                    next_try = time.monotonic() + self.retry_s
                else:
                    registered_with = kubelet
                    self.registrations += 1
                    self.registered.set()
                    log.info(
                        "registered %s with kubelet (endpoint %s)",
                        self.endpoint.resource_name,
                        self.endpoint.name,
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_s)

    async def _start(self) -> None:
        path = self.endpoint.socket
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        self._stopping = asyncio.Event()
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self._make_servicer(self._stopping), server)
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        self._server = server
        self._own = file_id(path)
        self.starts += 1
        self.registered.clear()
        log.info("serving %s on %s", self.endpoint.resource_name, path)

    async def _stop_server(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        if self._stopping is not None:
            self._stopping.set()
        await server.stop(self.grace_s)
        if self._own is not None and file_id(self.endpoint.socket) == self._own:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.endpoint.socket)
        self._own = None
        log.info("stopped serving on %s", self.endpoint.socket)
