"""``gpuslice-dev dev-cluster``: a local cluster where a real kube-scheduler calls gpuslice.

Started, in order: etcd + kube-apiserver (``ControlPlane``), ``gpuslice serve`` as a child
process on a free loopback port, kube-scheduler configured with the output of ``gpuslice render
scheduler-config`` (the same text e2e tests use), and N fake GPU nodes with the device-plugin
stand-in (``nodesim``). It prints a kubeconfig path so ``kubectl`` works and the URL of the
extender's cluster view (``/ui``, docs/ui.md), runs until Ctrl-C and stops every process by its
own pid.

The extender runs as a child process because ``devcluster`` and ``extender`` are independent
layers; the helpers here (``Extender``, ``render_scheduler_config``, ``NodeSimThread``) are what
the e2e and chaos fixtures use too. For fault injection, ``Extender`` can be SIGKILLed and
restarted on its port (with extra environment variables such as ``GPUSLICE_FAILPOINTS``),
``NodeSimThread`` stops, mutes and restarts one node's device plugin, and ``ServiceProxy`` stands
in for a Kubernetes Service that routes only to ready replicas.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from gpuslice.kube import client as kclient
from gpuslice_dev import controlplane, nodeplugins, nodesim, realnode

_STOP_GRACE_S = 10.0


MODELS: dict[str, tuple[str, int]] = {
    "A100": ("NVIDIA A100-SXM4-80GB", 81920),
    "A100-40GB": ("NVIDIA A100-SXM4-40GB", 40960),
    "H100": ("NVIDIA H100 80GB HBM3", 81559),
    "V100": ("NVIDIA-Tesla V100-SXM2-32GB", 32768),
    "T4": ("NVIDIA-Tesla T4", 15360),
}
"""Short model names -> (registered type, MiB per card); other names are registered as given."""


class DevClusterError(RuntimeError):
    """A component did not start."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def gpuslice_command(*args: str) -> list[str]:
    """``python -m gpuslice <args>`` with this interpreter."""
    return [sys.executable, "-m", "gpuslice", *args]


def render_scheduler_config(
    url: str,
    kubeconfig: Path,
    scheduler_name: str = "gpuslice-scheduler",
    *,
    ca_file: Path | None = None,
    client: tuple[Path, Path] | None = None,
    extra_args: Sequence[str] = (),
) -> str:
    """The output of ``gpuslice render scheduler-config`` for this cluster.

    Args:
        url: the extender's URL.
        kubeconfig: kube-scheduler's kubeconfig.
        scheduler_name: the profile name.
        ca_file: for an https URL, the CA of the extender's serving certificate (``--ca-file``).
        client: (certificate, key) kube-scheduler presents to an mTLS extender.
        extra_args: more ``render scheduler-config`` flags (e.g. ``--node-choice rank``).
    """
    tls_args = ["--ca-file", str(ca_file)] if ca_file is not None else []
    if client is not None:
        tls_args += ["--client-cert", str(client[0]), "--client-key", str(client[1])]
    out = subprocess.run(  # noqa: S603 - our own CLI
        gpuslice_command(
            "render",
            "scheduler-config",
            "--url",
            url,
            "--kubeconfig",
            str(kubeconfig),
            "--scheduler-name",
            scheduler_name,
            *tls_args,
            *extra_args,
        ),
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout


class Extender:
    """A ``gpuslice serve`` child process, with the fault controls of the chaos tier.

    The port and the log file are fixed at construction, so ``restart()`` (or ``kill()`` then
    ``start()``) brings the extender back where kube-scheduler expects it; the log is appended to.

    Args:
        kubeconfig: the kubeconfig it talks to the apiserver with.
        log_path: where its stdout/stderr go.
        port: listen port (a free one when None).
        extra_args: more ``serve`` flags (e.g. ``-v 4``).
        tls: (certificate, key) files to serve HTTPS with.
        client_ca: CA bundle whose client certificates it requires (``--tls-client-ca``; needs
            ``tls``). It then also serves a plain-HTTP metrics listener (``--metrics-listen`` on
            ``metrics_port``), and ``start`` waits for readiness through that listener, since the
            main port refuses a client without a certificate.
        env: extra environment variables for the child (e.g. ``GPUSLICE_FAILPOINTS``), on top of
            this process's environment; change ``self.env`` before a restart to change them.
    """

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        tls: tuple[Path, Path] | None = None,
        env: Mapping[str, str] | None = None,
        client_ca: Path | None = None,
    ) -> None:
        if client_ca is not None and tls is None:
            raise ValueError("client_ca needs tls (mutual TLS is served over HTTPS only)")
        self.kubeconfig = kubeconfig
        self.tls = tls
        self.client_ca = client_ca
        self.metrics_port: int | None = free_port() if client_ca is not None else None
        """Port of the plain-HTTP metrics listener (with ``client_ca``), else None."""
        self.log_path = log_path
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.env: dict[str, str] = dict(env or {})
        self.popen: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        """Exit status of the last process that ended (killed, stopped or exited by itself)."""
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """Its base URL."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def probe_url(self) -> str:
        """Where ``/healthz``, ``/readyz`` and ``/metrics`` answer without a client certificate."""
        if self.metrics_port is not None:
            return f"http://127.0.0.1:{self.metrics_port}"
        return self.url

    @property
    def pid(self) -> int | None:
        """The pid of the running process; None when none was started or it was stopped."""
        return None if self.popen is None else int(self.popen.pid)

    def running(self) -> bool:
        """True while the started process has not exited."""
        return self.popen is not None and self.popen.poll() is None

    def spawn(self) -> Extender:
        """Start the process and return at once (nothing waited for; see ``start``).

        Raises:
            DevClusterError: If it is already running.
        """
        if self.running():
            raise DevClusterError(f"gpuslice serve already running (pid {self.pid})")
        self._reap()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop() / kill()
        env = {**os.environ, **self.env} if self.env else None
        self.popen = subprocess.Popen(  # noqa: S603 - our own CLI
            gpuslice_command(
                "serve",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--kubeconfig",
                str(self.kubeconfig),
                *(["--tls-cert", str(self.tls[0]), "--tls-key", str(self.tls[1])] if self.tls else []),
                *(["--tls-client-ca", str(self.client_ca)] if self.client_ca is not None else []),
                *(["--metrics-listen", f"127.0.0.1:{self.metrics_port}"] if self.metrics_port else []),
                *self.extra_args,
            ),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        return self

    def start(self, timeout: float = 60.0, wait_ready: bool = True) -> Extender:
        """Start it and wait until ``/readyz`` answers 200 on ``probe_url``.

        200 means caches synced, and leading, unless the replica knows its own pod
        (``--pod-name``): then a synced follower is ready too.

        Args:
            timeout: seconds to wait.
            wait_ready: when False, wait only until it serves HTTP (``/healthz`` answers with any
                status): a follower replica reports not-ready by design.

        Raises:
            DevClusterError: If it exits or is not ready (serving) in time; it is stopped.
        """
        self.spawn()
        assert self.popen is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                code = self.popen.returncode
                self.stop()
                raise DevClusterError(
                    f"gpuslice serve exited with {code}; see {self.log_path}:\n{self.tail()}"
                )
            if wait_ready and http_status(self.probe_url + "/readyz") == 200:
                return self
            if not wait_ready and http_status(self.probe_url + "/healthz") != 0:
                return self
            time.sleep(0.1)
        self.stop()
        what = "ready" if wait_ready else "serving"
        raise DevClusterError(
            f"gpuslice serve not {what} after {timeout:.0f} s; see {self.log_path}:\n{self.tail()}"
        )

    def kill(self) -> int | None:
        """SIGKILL it by its pid and reap it; returns its exit status (None when none ran)."""
        popen = self.popen
        if popen is not None and popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                popen.kill()
        self._reap()
        return self.returncode

    def restart(self, timeout: float = 60.0, wait_ready: bool = True) -> Extender:
        """SIGKILL it (when running) and start it again on the same port and log file.

        Args:
            timeout: seconds to wait, as in ``start``.
            wait_ready: as in ``start``.
        """
        self.kill()
        return self.start(timeout, wait_ready)

    def wait_exit(self, timeout: float) -> int | None:
        """Wait until the process exits by itself; returns its status, None if it still runs."""
        popen = self.popen
        if popen is None:
            return self.returncode
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._reap()
        return self.returncode

    def stop(self) -> None:
        """Stop it by its pid (SIGTERM, then SIGKILL)."""
        popen = self.popen
        if popen is not None and popen.poll() is None:
            popen.send_signal(signal.SIGTERM)
            try:
                popen.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                popen.kill()
        self._reap()

    def _reap(self) -> None:
        """Wait for an ended (or killed) process, remember its status, close the log."""
        popen, self.popen = self.popen, None
        if popen is not None:
            self.returncode = popen.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self, lines: int = 40) -> str:
        """The end of its log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def http_status(url: str, timeout: float = 2.0) -> int:
    """The HTTP status of a GET, 0 when unreachable (HTTPS certificates are not verified)."""
    context = ssl._create_unverified_context() if url.startswith("https://") else None  # noqa: S323 - loopback
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:  # noqa: S310 - loopback URL
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except (urllib.error.URLError, OSError):
        return 0


class ServiceProxy:
    """A loopback TCP proxy standing in for a Kubernetes Service with readiness.

    Like kube-proxy in front of a Deployment's endpoints: each backend's ``/readyz`` is polled
    every ``poll_s``; each *new* connection is forwarded to a ready backend (round robin), or
    closed at once when none is ready. Established connections stay with their backend until
    either side closes them, as conntrack keeps them. Point kube-scheduler's ``urlPrefix`` at
    ``url``.

    Args:
        backends: base URLs of the replicas, ``http://127.0.0.1:<port>`` (plain HTTP only: the
            proxy forwards bytes, TLS would pass through unchanged).
        poll_s: readiness poll period.
        ready_path: the readiness endpoint of each backend.
    """

    def __init__(self, backends: Sequence[str], poll_s: float = 0.2, ready_path: str = "/readyz") -> None:
        self._lock = threading.Lock()
        self._backends = [b.rstrip("/") for b in backends]
        self._ready: set[str] = set()
        self._poll_s = poll_s
        self._ready_path = ready_path
        self._next = 0
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self.port = 0
        self.forwarded: dict[str, int] = {}
        """Backend URL -> connections forwarded to it."""
        self.refused = 0
        """Connections closed because no backend was ready."""

    @property
    def url(self) -> str:
        """The proxy's base URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def backends(self) -> list[str]:
        """The backend URLs."""
        with self._lock:
            return list(self._backends)

    def set_backends(self, backends: Sequence[str]) -> None:
        """Replace the backend list (readiness of new ones is known after the next poll)."""
        with self._lock:
            self._backends = [b.rstrip("/") for b in backends]
            self._ready &= set(self._backends)

    def ready_backends(self) -> list[str]:
        """The backends whose last readiness poll answered 200, in backend order."""
        with self._lock:
            return [b for b in self._backends if b in self._ready]

    def start(self) -> ServiceProxy:
        """Listen on a free 127.0.0.1 port and start the poll and accept threads."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        listener.settimeout(0.2)
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        self._poll_once()
        for target, name in ((self._poll, "proxy-poll"), (self._accept, "proxy-accept")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop listening and close every forwarded connection."""
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self._threads = []
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._lock:
            open_sockets, self._sockets = list(self._sockets), set()
        for sock in open_sockets:
            _close(sock)

    def __enter__(self) -> ServiceProxy:
        """Start the proxy."""
        return self.start()

    def __exit__(self, *exc: object) -> None:
        """Stop the proxy."""
        self.stop()

    def _poll_once(self) -> None:
        for backend in self.backends:
            ok = http_status(backend + self._ready_path, timeout=1.0) == 200
            with self._lock:
                if ok and backend in self._backends:
                    self._ready.add(backend)
                else:
                    self._ready.discard(backend)

    def _poll(self) -> None:
        while not self._stop.wait(self._poll_s):
            self._poll_once()

    def _pick(self) -> str | None:
        with self._lock:
            ready = [b for b in self._backends if b in self._ready]
            if not ready:
                return None
            self._next += 1
            return ready[self._next % len(ready)]

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            backend = self._pick()
            upstream = None
            if backend is not None:
                host, _, port = backend.rpartition("//")[2].partition(":")
                try:
                    upstream = socket.create_connection((host, int(port or 80)), timeout=2.0)
                except OSError:
                    upstream = None
            if backend is None or upstream is None:
                with self._lock:
                    self.refused += 1
                _close(client)
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            with self._lock:
                self.forwarded[backend] = self.forwarded.get(backend, 0) + 1
                self._sockets.update((client, upstream))
            pair = _Pair(client, upstream)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump, args=(pair, src, dst), name="proxy-pump", daemon=True
                ).start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        """Copy bytes one way; at EOF half-close the other side; on any error close both."""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    break
                dst.sendall(data)
        except OSError:
            _close(src)
            _close(dst)
        if pair.done():
            _close(src)
            _close(dst)
            with self._lock:
                self._sockets.difference_update((src, dst))


class _Pair:
    """The two sockets of one forwarded connection; closed once both directions ended."""

    def __init__(self, a: socket.socket, b: socket.socket) -> None:
        self.sockets = (a, b)
        self._ended = 0
        self._lock = threading.Lock()

    def done(self) -> bool:
        """Count one direction as ended; True for the second."""
        with self._lock:
            self._ended += 1
            return self._ended == 2


def _close(sock: socket.socket) -> None:
    """Shut a socket down both ways and close it, ignoring errors."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class NodeSimThread:
    """Fake GPU nodes and ``nodesim.NodeSim`` on their own event loop in a background thread.

    The per-node fault controls (``stop_node``, ``mute_node``, ``start_node``) are called from the
    test's thread and run on the simulator's loop; each returns once its API writes are done.

    Args:
        kubeconfig: admin kubeconfig.
        nodes: node name -> keyword arguments of ``nodesim.make_node`` (model, count, memory_mib,
            numa, labels, ...).
        workers: handshake queues the nodes are split over (one pod watch and one node watch).
        report_period_s: period of the device plugin's ``Reported`` handshake on each node
            (HAMi: 30 s; 0 = never).
    """

    def __init__(
        self,
        kubeconfig: Path,
        nodes: Mapping[str, Mapping[str, Any]],
        workers: int = 4,
        report_period_s: float = 30.0,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.nodes = dict(nodes)
        self.workers = max(1, min(workers, len(self.nodes)))
        self.report_period_s = report_period_s
        self.sims: list[nodesim.NodeSim] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._thread_main, name="nodesim", daemon=True)

    @property
    def sim(self) -> nodesim.NodeSim:
        """The simulator serving every node (available once ``start`` returned)."""
        if not self.sims:
            raise DevClusterError("nodesim not started")
        return self.sims[0]

    def start(self, timeout: float = 60.0) -> NodeSimThread:
        """Create the nodes and start serving; returns once the nodes exist."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise DevClusterError("nodesim did not create the nodes in time")
        if self._error is not None:
            raise DevClusterError(f"nodesim failed: {self._error}") from self._error
        return self

    def stop(self) -> None:
        """Stop the simulator and its thread."""
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)
        self._thread.join(10)

    def _call(self, make: Callable[[nodesim.NodeSim], Coroutine[Any, Any, None]], timeout: float) -> None:
        loop = self._loop
        if loop is None or loop.is_closed() or not self.sims:
            raise DevClusterError("nodesim not running")
        asyncio.run_coroutine_threadsafe(make(self.sim), loop).result(timeout)

    def stop_node(self, node: str, timeout: float = 30.0) -> None:
        """The node's device plugin dies (see ``nodesim.NodeSim.stop_node``)."""
        self._call(lambda sim: sim.stop_node(node), timeout)

    def mute_node(self, node: str, timeout: float = 30.0) -> None:
        """The node's device plugin stops answering (see ``nodesim.NodeSim.mute_node``)."""
        self._call(lambda sim: sim.mute_node(node), timeout)

    def start_node(self, node: str, timeout: float = 30.0) -> None:
        """The node's device plugin is back (see ``nodesim.NodeSim.start_node``)."""
        self._call(lambda sim: sim.start_node(node), timeout)

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as err:  # noqa: BLE001 - reported through start()
            self._error = err
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        kube = kclient.KubeClient.from_kubeconfig(
            self.kubeconfig, qps=1000, burst=1000
        )  # a simulator: no throttle
        try:
            for name, spec in self.nodes.items():
                await nodesim.make_node(kube, name, **spec)
            # Real nodes each run their own device plugin; the simulator's worker queues keep
            # Allocate handshakes on different nodes concurrent, behind one pod and one node watch.
            self.sims = [
                nodesim.NodeSim(
                    kube, nodes=list(self.nodes), workers=self.workers, report_period_s=self.report_period_s
                )
            ]
            self._ready.set()
            await asyncio.gather(*(sim.run() for sim in self.sims))
        except asyncio.CancelledError:
            pass
        finally:
            await kube.aclose()


@contextlib.contextmanager
def cluster(
    nodes: int,
    model: str,
    gpus_per_node: int,
    memory_mib: int,
    verbosity: int = 0,
    workdir: Path | None = None,
    real_nodes: int = 0,
    real_machine: str = "t4-4",
    device_plugin: Path | None = None,
    mig_cards: int = 0,
) -> Iterator[dict[str, Any]]:
    """Everything running; yields ``{"control_plane", "extender", "kubeconfig", "sim", "real"}``.

    ``real_nodes`` more nodes are real (``devcluster.realnode``: containerd, runc, CNI, kubelet and
    a device plugin, gpuslice's own over the fake NVML library with the ``real_machine`` shape, or
    the executable ``device_plugin``); they need root and the packages ``hack/node/install.sh``
    installs. The first ``mig_cards`` cards of each fake node are in MIG mode
    (``nodesim.cards``: the A100-SXM4-40GB's profiles), the others ``hami-core``.
    """
    with contextlib.ExitStack() as stack:
        cp = controlplane.ControlPlane(workdir=workdir)
        cp.start()
        stack.callback(cp.stop)
        real: list[realnode.RealNode] = []
        if real_nodes:
            plugin = (
                nodeplugins.external_plugin(device_plugin)
                if device_plugin is not None
                else nodeplugins.gpuslice_plugin("nvml")
            )
            root = Path(tempfile.mkdtemp(prefix="gsn-", dir="/tmp"))  # short: unix socket paths
            stack.callback(lambda: root.rmdir() if root.exists() and not any(root.iterdir()) else None)
            real = [
                realnode.RealNode(
                    cp, f"real-node-{i}", i, root / f"real-node-{i}", plugin=plugin, machine=real_machine,
                    labels=nodesim.GPU_LABEL,
                )
                for i in range(real_nodes)
            ]  # fmt: skip
            realnode.start_all(real)
            for node in real:
                stack.callback(node.stop)
        specs = {
            f"gpu-node-{i}": {
                "model": model,
                "count": gpus_per_node,
                "memory_mib": memory_mib,
                "numa_nodes": 2,
                "mig_cards": set(range(mig_cards)),
            }
            for i in range(nodes)
        }
        sim = NodeSimThread(cp.kubeconfig, specs).start()
        stack.callback(sim.stop)
        ext = Extender(cp.kubeconfig, cp.workdir / "gpuslice.log", extra_args=["-v", str(verbosity)])
        ext.start()
        stack.callback(ext.stop)
        cp.start_scheduler(render_scheduler_config(ext.url, cp.kubeconfig))
        stack.callback(cp.stop_scheduler)
        yield {"control_plane": cp, "extender": ext, "kubeconfig": cp.kubeconfig, "sim": sim, "real": real}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``gpuslice-dev dev-cluster`` flags."""
    parser.add_argument("--nodes", type=int, default=4, help="fake GPU nodes")
    parser.add_argument(
        "--model", default="A100", help=f"GPU model: {', '.join(MODELS)} or a full name registered as given"
    )
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--memory-mib", type=int, default=0, help="memory per GPU (default: the model's)")
    parser.add_argument("-v", "--verbosity", type=int, default=2, help="gpuslice log level")
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs and kubeconfigs here")
    parser.add_argument(
        "--real-nodes",
        type=int,
        default=0,
        help="real nodes besides the fake ones: containerd, runc, CNI, kubelet and a device plugin "
        "each (root; docs/real-nodes.md)",
    )
    parser.add_argument(
        "--real-machine", default="t4-4", help="the real nodes' GPUs, a fake NVML machine shape (agent.fake)"
    )
    parser.add_argument(
        "--device-plugin",
        type=Path,
        default=None,
        help="the real nodes' device plugin, an executable (default: gpuslice's own; docs/real-nodes.md)",
    )
    parser.add_argument(
        "--mig-cards",
        type=int,
        default=0,
        help="the first N cards of each fake node in MIG mode with the A100-SXM4-40GB's profiles "
        "(pair with --model 'NVIDIA A100-SXM4-40GB' --memory-mib 40960); the others hami-core",
    )


def main(args: argparse.Namespace) -> int:
    """Run the dev cluster until Ctrl-C (or SIGTERM)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        model, memory = MODELS.get(args.model, (args.model, 81920))
        memory = args.memory_mib or memory
        with cluster(
            args.nodes,
            model,
            args.gpus,
            memory,
            args.verbosity,
            args.workdir,
            real_nodes=args.real_nodes,
            real_machine=args.real_machine,
            device_plugin=args.device_plugin,
            mig_cards=args.mig_cards,
        ) as running:
            cp = running["control_plane"]
            for node in running["real"]:
                logs = node.root / "logs"
                print(f"real node:  {node.name} ({node.machine}, pods on {node.subnet}, logs {logs})")
            print(f"kubeconfig: {running['kubeconfig']}")
            print(f"  export KUBECONFIG={running['kubeconfig']}")
            print(f"gpuslice:   {running['extender'].url} (log {running['extender'].log_path})")
            print(f"view:       {running['extender'].url}/ui (the cluster view, in a browser)")
            print(f"logs:       {cp.workdir}")
            print("pods must set spec.schedulerName: gpuslice-scheduler; Ctrl-C stops everything", flush=True)
            while not stop.wait(1.0):
                if running["extender"].popen is None or running["extender"].popen.poll() is not None:
                    print("gpuslice serve exited; stopping", file=sys.stderr)
                    return 1
    except (DevClusterError, controlplane.ControlPlaneError, realnode.NodeError) as err:
        print(f"gpuslice-dev dev-cluster: {err}", file=sys.stderr)
        return 1
    return 0
