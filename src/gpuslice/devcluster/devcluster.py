"""``gpuslice dev-cluster``: a local cluster where a real kube-scheduler calls gpuslice.

Started, in order: etcd + kube-apiserver (``ControlPlane``), ``gpuslice serve`` as a child
process on a free loopback port, kube-scheduler configured with the output of ``gpuslice render
scheduler-config`` (the same text e2e tests use), and N fake GPU nodes with the device-plugin
stand-in (``nodesim``). It prints a kubeconfig path so ``kubectl`` works, runs until Ctrl-C and
stops every process by its own pid.

The extender runs as a child process because ``devcluster`` and ``extender`` are independent
layers; the helpers here (``start_extender``, ``render_scheduler_config``) are what the e2e
fixtures use too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from gpuslice.devcluster import controlplane, nodesim
from gpuslice.kube import client as kclient

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


def render_scheduler_config(url: str, kubeconfig: Path, scheduler_name: str = "gpuslice-scheduler") -> str:
    """The output of ``gpuslice render scheduler-config`` for this cluster."""
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
        ),
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout


class Extender:
    """A ``gpuslice serve`` child process.

    Args:
        kubeconfig: the kubeconfig it talks to the apiserver with.
        log_path: where its stdout/stderr go.
        port: listen port (a free one when None).
        extra_args: more ``serve`` flags (e.g. ``-v 4``).
        tls: (certificate, key) files to serve HTTPS with.
    """

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.tls = tls
        self.log_path = log_path
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.popen: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """Its base URL."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Extender:
        """Start it and wait until ``/readyz`` answers 200 (caches synced)."""
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(  # noqa: S603 - our own CLI
            gpuslice_command(
                "serve",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--kubeconfig",
                str(self.kubeconfig),
                *(["--tls-cert", str(self.tls[0]), "--tls-key", str(self.tls[1])] if self.tls else []),
                *self.extra_args,
            ),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                code = self.popen.returncode
                self.stop()
                raise DevClusterError(
                    f"gpuslice serve exited with {code}; see {self.log_path}:\n{self.tail()}"
                )
            if http_status(self.url + "/readyz") == 200:
                return self
            time.sleep(0.2)
        self.stop()
        raise DevClusterError(
            f"gpuslice serve not ready after {timeout:.0f} s; see {self.log_path}:\n{self.tail()}"
        )

    def stop(self) -> None:
        """Stop it by its pid (SIGTERM, then SIGKILL)."""
        popen, self.popen = self.popen, None
        if popen is not None and popen.poll() is None:
            popen.send_signal(signal.SIGTERM)
            try:
                popen.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
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


class NodeSimThread:
    """Fake GPU nodes and ``nodesim.NodeSim`` on their own event loop in a background thread.

    Args:
        kubeconfig: admin kubeconfig.
        nodes: node name -> keyword arguments of ``nodesim.make_node`` (model, count, memory_mib,
            numa, ...).
        workers: handshake queues the nodes are split over (one pod watch and one node watch).
    """

    def __init__(self, kubeconfig: Path, nodes: Mapping[str, Mapping[str, Any]], workers: int = 4) -> None:
        self.kubeconfig = kubeconfig
        self.nodes = dict(nodes)
        self.workers = max(1, min(workers, len(self.nodes)))
        self.sims: list[nodesim.NodeSim] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._thread_main, name="nodesim", daemon=True)

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
            self.sims = [nodesim.NodeSim(kube, nodes=list(self.nodes), workers=self.workers)]
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
) -> Iterator[dict[str, Any]]:
    """Everything running; yields ``{"control_plane", "extender", "kubeconfig", "sim"}``."""
    with contextlib.ExitStack() as stack:
        cp = controlplane.ControlPlane(workdir=workdir)
        cp.start()
        stack.callback(cp.stop)
        specs = {
            f"gpu-node-{i}": {
                "model": model,
                "count": gpus_per_node,
                "memory_mib": memory_mib,
                "numa_nodes": 2,
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
        yield {"control_plane": cp, "extender": ext, "kubeconfig": cp.kubeconfig, "sim": sim}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``gpuslice dev-cluster`` flags."""
    parser.add_argument("--nodes", type=int, default=4, help="fake GPU nodes")
    parser.add_argument(
        "--model", default="A100", help=f"GPU model: {', '.join(MODELS)} or a full name registered as given"
    )
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--memory-mib", type=int, default=0, help="memory per GPU (default: the model's)")
    parser.add_argument("-v", "--verbosity", type=int, default=2, help="gpuslice log level")
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs and kubeconfigs here")


def main(args: argparse.Namespace) -> int:
    """Run the dev cluster until Ctrl-C (or SIGTERM)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        model, memory = MODELS.get(args.model, (args.model, 81920))
        memory = args.memory_mib or memory
        with cluster(args.nodes, model, args.gpus, memory, args.verbosity, args.workdir) as running:
            cp = running["control_plane"]
            print(f"kubeconfig: {running['kubeconfig']}")
            print(f"  export KUBECONFIG={running['kubeconfig']}")
            print(f"gpuslice:   {running['extender'].url} (log {running['extender'].log_path})")
            print(f"logs:       {cp.workdir}")
            print("pods must set spec.schedulerName: gpuslice-scheduler; Ctrl-C stops everything", flush=True)
            while not stop.wait(1.0):
                if running["extender"].popen is None or running["extender"].popen.poll() is not None:
                    print("gpuslice serve exited; stopping", file=sys.stderr)
                    return 1
    except (DevClusterError, controlplane.ControlPlaneError) as err:
        print(f"gpuslice dev-cluster: {err}", file=sys.stderr)
        return 1
    return 0
