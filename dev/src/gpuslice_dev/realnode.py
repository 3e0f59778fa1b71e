"""Real Kubernetes nodes on this machine: containerd, runc, CNI and kubelet, plus a device plugin.

Each ``RealNode`` is a node as a GPU cluster runs it, minus the GPUs:

- **containerd** (Debian's 1.6 package, with ``containerd-shim-runc-v2`` and runc) with its own
  ``root``, ``state`` and socket under the node's directory, and a pause image built here (no
  registry is reachable: ``devcluster.ociimage``); the settings are ``devcluster.nodeconfig``'s;
- **CNI**: a ``bridge`` (one per node, its own private /24 of ``10.177.0.0/16``) with
  ``host-local`` IPAM, then ``portmap``, plus ``loopback``; pods live in their own network
  namespaces and their IPs are routable from this machine through the bridge, whose ``.1`` is the
  node's address (kubelet refuses a loopback node IP);
- **kubelet** v1.34 built from the control plane's module (``hack/node/build.sh``), registered
  with its own client certificate (user ``system:node:<name>``, group ``system:nodes``, confined
  by the Node authorizer), ``cgroupfs`` under a cgroup root of its own (``/gpuslice/<name>``),
  serving on the node's address with ports of its own;
- a **device plugin** on kubelet's device-plugin API (``devcluster.nodeplugins``: gpuslice's own
  or any other command, HAMi's among them). kubelet's plugin directory is fixed at
  ``/var/lib/kubelet/device-plugins`` whatever ``--root-dir`` says
  (``k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/constants.go``), so each node gets a mount
  namespace of its own, held open by a small holder process, in which that path is a bind mount
  of the node's own directory; kubelet and the plugin both run inside it. The node's directory is
  a shared mount, so what kubelet mounts there (volumes) reaches containerd;
- **GPUs**: a machine shape of the agent's fake backend served through NVML by the fake
  ``libnvidia-ml.so.1`` (``devcluster.fakenvml``), placeholder device nodes (``dev/nvidia<i>``,
  ``nvidiactl``, ``nvidia-uvm``, NVIDIA's major number) and HAMi-core placeholders
  (``hami/libvgpu.so``, ``hami/ld.so.preload``) for the plugin to hand to containers.

Every process is started here and stopped by its own pid; processes the node's containerd forks
(shims and containers) are found through the node's cgroups and stopped by their pids too; mounts
under the node's directory are undone and its cgroups removed on ``stop``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from gpuslice.agent import fake
from gpuslice_dev import fakenvml, nodeconfig, nodeplugins, ociimage
from gpuslice_dev.controlplane import ControlPlane, ControlPlaneError, built_path
from gpuslice_dev.paths import REPO_ROOT

NODE_DIR = REPO_ROOT / "hack" / "node"
BUILD_SCRIPT = NODE_DIR / "build.sh"
INSTALL_SCRIPT = NODE_DIR / "install.sh"

DEVICE_PLUGIN_PATH = Path("/var/lib/kubelet/device-plugins")
"""kubelet's device-plugin directory, the same for every kubelet on a machine (module docstring)."""

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "gpuslice"
PAUSE_IMAGE = "gpuslice.local/pause:1"
BUSYBOX_IMAGE = "gpuslice.local/busybox:1"
CONTAINERD_NAMESPACE = "k8s.io"
POD_SUBNET = "10.177.{index}.0/24"
"""Each node's pods take a /24 of 10.177.0.0/16, a private range that only exists on the bridges."""

NVIDIA_MAJOR = 195
"""Character-device major of ``/dev/nvidia<i>`` and ``/dev/nvidiactl`` (NVIDIA's driver README)."""

_STOP_GRACE_S = 10.0


class NodeError(RuntimeError):
    """A real node could not be set up, started or stopped."""


def node_binaries() -> Path:
    """The directory holding ``kubelet`` and ``pause`` (``GPUSLICE_NODE_BIN`` or ``hack/node/build.sh``)."""
    try:
        return built_path(BUILD_SCRIPT, "GPUSLICE_NODE_BIN")
    except ControlPlaneError as exc:
        raise NodeError(str(exc)) from exc


def host_problems() -> list[str]:
    """Why this machine cannot run real nodes, empty when it can."""
    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append("real nodes need root (mounts, cgroups, network namespaces)")
    for tool in ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "unshare", "nsenter", "mount", "ip"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} not found (hack/node/install.sh installs the packages)")
    for plugin in ("bridge", "host-local", "loopback", "portmap"):
        if not (Path("/usr/lib/cni") / plugin).exists():
            problems.append(f"CNI plugin {plugin} not in /usr/lib/cni (package containernetworking-plugins)")
    if not (CGROUP_ROOT / "memory").is_dir():
        problems.append("no cgroup v1 memory hierarchy under /sys/fs/cgroup")
    return problems


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound to port 0, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_tool(
    argv: Sequence[str], what: str, timeout: float = 60.0, env: Mapping[str, str] | None = None
) -> str:
    """Run a host tool; its stdout, or ``NodeError`` with its stderr when it fails."""
    proc = subprocess.run(  # noqa: S603 - argv built here from fixed tools
        list(argv), capture_output=True, text=True, timeout=timeout, check=False, env=env
    )
    if proc.returncode != 0:
        raise NodeError(f"{what}: {' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


class Proc:
    """A process this module started, with its log."""

    def __init__(
        self, name: str, popen: subprocess.Popen[bytes], log_path: Path, log_file: IO[bytes]
    ) -> None:
        self.name = name
        self.popen = popen
        self.log_path = log_path
        self._log_file = log_file

    @property
    def pid(self) -> int:
        """The process id."""
        return self.popen.pid

    def alive(self) -> bool:
        """True while the process runs."""
        return self.popen.poll() is None

    def stop(self, sig: signal.Signals = signal.SIGTERM, grace: float = _STOP_GRACE_S) -> int | None:
        """Signal it by pid, wait ``grace`` seconds, then SIGKILL; close its log; its exit status."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.popen.kill()
                self.popen.wait(timeout=grace)
        self._log_file.close()
        return self.popen.returncode

    def tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of its log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class RealNode:
    """One real node: containerd, kubelet and a device plugin in a mount namespace of their own.

    Args:
        plane: The started control plane the kubelet registers with.
        name: Node name.
        index: Small integer unique among this machine's nodes: picks the bridge name
            (``gsl<index>``) and the pod subnet (``POD_SUBNET``).
        root: The node's directory (must not exist yet, or be empty); removed by ``stop``.
        plugin: The device-plugin command, ``None`` for a node without GPUs.
        machine: The node's GPUs: a machine shape of the agent's fake backend (``agent.fake``),
            served through NVML by the fake ``libnvidia-ml.so.1`` (``devcluster.fakenvml``);
            ``None`` for a node without GPUs.
        labels: Node labels kubelet registers with.
        bin_dir: Directory with ``kubelet`` and ``pause`` (default ``node_binaries()``).
    """

    def __init__(
        self,
        plane: ControlPlane,
        name: str,
        index: int,
        root: Path,
        *,
        plugin: nodeplugins.PluginCommand | None,
        machine: str | None = None,
        labels: Mapping[str, str] | None = None,
        bin_dir: Path | None = None,
    ) -> None:
        if not 0 <= index < 250:
            raise NodeError(f"node index must be in 0..249, got {index}")
        self.plane = plane
        self.name = name
        self.index = index
        self.root = root
        self.plugin_command = plugin
        self.machine = machine
        self.cards = 0 if machine is None else len(fake.shape(machine).gpus)
        self.nvml_dir: Path | None = None
        self.nvml_shape: Path | None = None
        self.labels = dict(labels or {})
        self._bin_dir = bin_dir
        self.bridge = f"gsl{index}"
        self.subnet = POD_SUBNET.format(index=index)
        self.kubelet_port = 0
        self.kubelet_healthz_port = 0
        self.containerd: Proc | None = None
        self.holder: Proc | None = None
        self.kubelet: Proc | None = None
        self.plugin: Proc | None = None
        self._started = False

    # ------------------------------------------------------------------ paths
    @property
    def containerd_socket(self) -> Path:
        """The node's containerd socket (kubelet's CRI endpoint)."""
        return self.root / "containerd" / "containerd.sock"

    @property
    def socket_dir(self) -> Path:
        """The node's own device-plugin directory, seen as ``DEVICE_PLUGIN_PATH`` in its namespace."""
        return self.root / "device-plugins"

    @property
    def kubelet_dir(self) -> Path:
        """The kubelet's ``--root-dir``."""
        return self.root / "kubelet"

    @property
    def dev_dir(self) -> Path:
        """Placeholder ``/dev/nvidia*`` nodes the device plugin hands to containers."""
        return self.root / "dev"

    @property
    def hami_dir(self) -> Path:
        """Placeholder HAMi-core files (``libvgpu.so``, ``ld.so.preload``, caches, locks)."""
        return self.root / "hami"

    @property
    def cgroup(self) -> str:
        """The kubelet's ``cgroupRoot``: pods, shims and containerd all live below it."""
        return f"/{CGROUP_PARENT}/{self.name}"

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 90.0) -> RealNode:
        """Set up and start containerd, kubelet and the plugin; wait for Ready (and the GPUs)."""
        if self._started:
            raise NodeError(f"node {self.name} already started")
        problems = host_problems()
        if problems:
            raise NodeError("this machine cannot run real nodes: " + "; ".join(problems))
        self._started = True
        try:
            bin_dir = self._bin_dir or node_binaries()
            self._bin_dir = bin_dir
            self._prepare(bin_dir)
            self.start_containerd()
            self._import_images(bin_dir)
            self._start_holder()
            self.start_kubelet()
            self.wait_ready(timeout)
            if self.plugin_command is not None:
                mark = self.kubelet_log_mark()
                self.start_plugin()
                self.wait_plugin_registered(mark, timeout)
                self.wait_gpus(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _prepare(self, bin_dir: Path) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        # A shared mount, so that kubelet's mounts in its namespace (volumes) reach containerd.
        run_tool(["mount", "--bind", str(self.root), str(self.root)], "bind the node dir")
        run_tool(["mount", "--make-shared", str(self.root)], "share the node dir")
        for sub in (
            "containerd",
            "device-plugins",
            "kubelet",
            "cni/net.d",
            "cni/ipam",
            "dev",
            "hami",
            "logs",
        ):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._make_cgroups()
        self._make_bridge()
        self._write_cni()
        self._write_containerd_config()
        self._make_placeholders()
        if self.machine is not None:
            self.nvml_shape = self.root / "nvml" / "machine"
            self.nvml_shape.parent.mkdir(exist_ok=True)
            fakenvml.write_shape(fake.shape(self.machine), self.nvml_shape)
            self.nvml_dir = fakenvml.build_library().parent
        self.kubelet_port = free_port()
        self.kubelet_healthz_port = free_port()
        self._write_credentials()

    def _hierarchies(self) -> list[Path]:
        """The cgroup v1 hierarchies (real directories; ``cpu``/``cpuacct`` may be links to one)."""
        found = []
        for entry in sorted(CGROUP_ROOT.iterdir()):
            if entry.is_symlink() or not entry.is_dir() or entry.name == "unified":
                continue
            found.append(entry)
        return found

    def _make_cgroups(self) -> None:
        for hierarchy in self._hierarchies():
            parent = hierarchy / CGROUP_PARENT
            node = parent / self.name
            node.mkdir(parents=True, exist_ok=True)
            if hierarchy.name == "cpuset" or hierarchy.name.startswith("cpuset,"):
                for group, above in ((parent, hierarchy), (node, parent)):
                    for key in ("cpuset.cpus", "cpuset.mems"):
                        if not (group / key).read_text().strip():
                            (group / key).write_text((above / key).read_text())

    @property
    def host_ip(self) -> str:
        """The node's address: its bridge's gateway, the address its pods see as the host."""
        return self.subnet.replace(".0/24", ".1")

    def _make_bridge(self) -> None:
        """The pods' bridge, made before kubelet so that the node's address exists.

        kubelet refuses a loopback node IP; CNI's bridge plugin adopts the bridge.
        """
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, check=False)  # noqa: S603, S607
        run_tool(["ip", "link", "add", self.bridge, "type", "bridge"], "create the bridge")
        run_tool(["ip", "addr", "add", f"{self.host_ip}/24", "dev", self.bridge], "address the bridge")
        run_tool(["ip", "link", "set", self.bridge, "up"], "bring the bridge up")

    def _write_cni(self) -> None:
        conf_dir = self.root / "cni" / "net.d"
        network = nodeconfig.cni_network(
            name=f"gpuslice-{self.name}",
            bridge=self.bridge,
            subnet=self.subnet,
            gateway=self.host_ip,
            ipam_dir=self.root / "cni" / "ipam",
        )
        (conf_dir / "10-gpuslice.conflist").write_text(json.dumps(network, indent=2))
        (conf_dir / "99-loopback.conf").write_text(json.dumps(nodeconfig.cni_loopback()))

    def _write_containerd_config(self) -> None:
        text = nodeconfig.containerd_config(
            root=self.root / "containerd" / "root",
            state=self.root / "containerd" / "state",
            socket=self.containerd_socket,
            pause_image=PAUSE_IMAGE,
            cni_conf_dir=self.root / "cni" / "net.d",
            runc=shutil.which("runc") or "runc",
        )
        (self.root / "containerd" / "config.toml").write_text(text)

    def _make_placeholders(self) -> None:
        """Device nodes and host files a device plugin hands to containers (module docstring)."""
        nodes = [(f"nvidia{i}", i) for i in range(self.cards)] + [("nvidiactl", 255)]
        for name, minor in nodes:
            path = self.dev_dir / name
            if not path.exists():
                os.mknod(path, 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, minor))
        uvm = self.dev_dir / "nvidia-uvm"
        if not uvm.exists():
            # nvidia-uvm's major is allocated dynamically; 0 stands for it here.
            os.mknod(uvm, 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR + 40, 0))
        (self.hami_dir / "libvgpu.so").write_bytes(b"")
        (self.hami_dir / "ld.so.preload").write_text(
            "# placeholder: HAMi-core's libvgpu.so would be preloaded here\n"
        )
        (self.hami_dir / "containers").mkdir(exist_ok=True)
        (self.hami_dir / "vgpulock").mkdir(exist_ok=True)

    def _write_credentials(self) -> None:
        self.kubelet_kubeconfig = self.plane.client_kubeconfig(f"system:node:{self.name}", ["system:nodes"])
        try:
            self.plugin_kubeconfig = nodeplugins.credentials(self.plane, self.name)
        except nodeplugins.PluginSetupError as exc:
            raise NodeError(str(exc)) from exc

    def _spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Proc:
        log_path = self.root / "logs" / f"{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed by Proc.stop
        try:
            popen = subprocess.Popen(  # noqa: S603 - argv built here
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )
        except BaseException:
            log_file.close()
            raise
        return Proc(name, popen, log_path, log_file)

    def _ctr(self, *args: str, timeout: float = 60.0) -> str:
        return run_tool(
            ["ctr", "--address", str(self.containerd_socket), "--namespace", CONTAINERD_NAMESPACE, *args],
            "ctr",
            timeout=timeout,
        )

    def start_containerd(self, timeout: float = 30.0) -> None:
        """Start (or restart) this node's containerd, in the node's runtime cgroup."""
        runtime_group = f"{self.cgroup}/runtime"
        for hierarchy in self._hierarchies():
            (hierarchy / runtime_group.lstrip("/")).mkdir(parents=True, exist_ok=True)
        if self.containerd_socket.exists():
            self.containerd_socket.unlink()
        # The shell moves itself into the runtime cgroup, so containerd and every shim it forks
        # are found there by stop().
        procs = " ".join(
            str(h / runtime_group.lstrip("/") / "cgroup.procs")
            for h in self._hierarchies()
            if h.name in ("pids", "memory", "freezer", "systemd")
        )
        script = f'for f in {procs}; do echo $$ > "$f"; done; exec containerd --config "$1"'
        self.containerd = self._spawn(
            "containerd", ["sh", "-c", script, "containerd", str(self.root / "containerd" / "config.toml")]
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.containerd.alive():
                raise NodeError(f"containerd of {self.name} exited:\n{self.containerd.tail()}")
            if self.containerd_socket.exists():
                with contextlib.suppress(NodeError):
                    self._ctr("version", timeout=5)
                    return
            time.sleep(0.1)
        raise NodeError(f"containerd of {self.name} not serving after {timeout} s:\n{self.containerd.tail()}")

    def stop_containerd(self) -> None:
        """Stop containerd by pid (SIGTERM); its shims and containers keep running, as on a node."""
        if self.containerd is not None:
            self.containerd.stop()

    def _import_images(self, bin_dir: Path) -> None:
        images = self.root / "images"
        images.mkdir(exist_ok=True)
        built = [
            ociimage.write_layout(
                images / "pause.tar",
                PAUSE_IMAGE,
                ociimage.pause_files(bin_dir / "pause"),
                entrypoint=["/pause"],
            ),
            ociimage.write_layout(
                images / "busybox.tar",
                BUSYBOX_IMAGE,
                ociimage.busybox_files(Path("/bin/busybox"), busybox_applets()),
                cmd=["sh"],
            ),
        ]
        for image in built:
            self._ctr("images", "import", str(image.path), timeout=120)
        # Unpack (and pin against kubelet's image GC) by labelling them as CRI does for pinned images.
        for image in built:
            self._ctr("images", "label", image.name, "io.cri-containerd.pinned=pinned")

    def import_image(self, archive: Path, name: str) -> None:
        """Import an OCI archive into the node's containerd, as a registry pull would leave it.

        The image is pinned (as CRI pins its sandbox image), so kubelet's image garbage collection
        never removes an image no registry could give back.
        """
        self._ctr("images", "import", str(archive), timeout=300)
        self._ctr("images", "label", name, "io.cri-containerd.pinned=pinned")

    def _start_holder(self) -> None:
        DEVICE_PLUGIN_PATH.mkdir(parents=True, exist_ok=True)
        script = 'mount --bind "$1" "$2" && exec sleep infinity'
        self.holder = self._spawn(
            "mount-namespace",
            [
                "unshare", "--mount", "--propagation", "unchanged", "--",
                "sh", "-c", script, "holder", str(self.socket_dir), str(DEVICE_PLUGIN_PATH),
            ],
        )  # fmt: skip
        deadline = time.monotonic() + 10
        ns = Path(f"/proc/{self.holder.pid}/ns/mnt")
        while time.monotonic() < deadline:
            if not self.holder.alive():
                raise NodeError(f"mount namespace of {self.name} failed:\n{self.holder.tail()}")
            if ns.exists() and os.readlink(ns) != os.readlink("/proc/self/ns/mnt"):
                # The bind mount happens just before exec: wait until the marker file shows through.
                with contextlib.suppress(OSError):
                    mounts = Path(f"/proc/{self.holder.pid}/mountinfo").read_text()
                    if (
                        f" {DEVICE_PLUGIN_PATH} " in mounts
                        and "sleep" in Path(f"/proc/{self.holder.pid}/cmdline").read_text()
                    ):
                        return
            time.sleep(0.05)
        raise NodeError(f"mount namespace of {self.name} not ready:\n{self.holder.tail()}")

    def _in_namespace(self, argv: Sequence[str]) -> list[str]:
        if self.holder is None or not self.holder.alive():
            raise NodeError(f"mount namespace of {self.name} is gone")
        return ["nsenter", f"--mount=/proc/{self.holder.pid}/ns/mnt", "--", *argv]

    def _kubelet_config(self) -> Path:
        config = nodeconfig.kubelet_config(
            address=self.host_ip,
            port=self.kubelet_port,
            healthz_port=self.kubelet_healthz_port,
            cgroup_root=self.cgroup,
            runtime_socket=self.containerd_socket,
            client_ca=self.plane.ca_file,
            pod_logs=self.root / "pod-logs",
        )
        path = self.root / "kubelet-config.json"
        path.write_text(json.dumps(config, indent=2))
        return path

    def start_kubelet(self) -> None:
        """Start (or restart) kubelet in the node's mount namespace."""
        bin_dir = self._bin_dir or node_binaries()
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        argv = [
            str(bin_dir / "kubelet"),
            f"--config={self._kubelet_config()}",
            f"--kubeconfig={self.kubelet_kubeconfig}",
            f"--root-dir={self.kubelet_dir}",
            f"--cert-dir={self.root / 'kubelet-pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.host_ip}",
            "--v=2",
        ]
        if labels:
            argv.append(f"--node-labels={labels}")
        self.kubelet = self._spawn("kubelet", self._in_namespace(argv))

    def stop_kubelet(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop kubelet by pid; its pods keep running."""
        if self.kubelet is not None:
            self.kubelet.stop(sig)

    def plugin_context(self) -> nodeplugins.PluginContext:
        """What the device-plugin command is told about this node."""
        return nodeplugins.PluginContext(
            node=self.name,
            kubeconfig=self.plugin_kubeconfig,
            socket_dir=DEVICE_PLUGIN_PATH,
            dev_dir=self.dev_dir,
            hami_dir=self.hami_dir,
            work_dir=self.root,
            cards=self.cards,
            nvml_dir=self.nvml_dir,
            nvml_shape=self.nvml_shape,
        )

    def start_plugin(self) -> None:
        """Start (or restart) the device plugin in the node's mount namespace."""
        if self.plugin_command is None:
            raise NodeError(f"node {self.name} has no device plugin")
        argv, extra = self.plugin_command(self.plugin_context())
        env = {**os.environ, "NODE_NAME": self.name, "KUBECONFIG": str(self.plugin_kubeconfig), **extra}
        self.plugin = self._spawn("device-plugin", self._in_namespace(argv), env=env)

    def stop_plugin(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop the device plugin by pid."""
        if self.plugin is not None:
            self.plugin.stop(sig)

    # ------------------------------------------------------------------ waiting
    def node_object(self) -> dict[str, object] | None:
        """The Node as the apiserver has it, ``None`` if absent."""
        status, body = self.plane.api_request("GET", f"/api/v1/nodes/{self.name}")
        return body if status == 200 and isinstance(body, dict) else None

    def ready(self) -> bool:
        """Whether the Node's ``Ready`` condition is ``True``."""
        node = self.node_object()
        if node is None:
            return False
        conditions = node.get("status", {}).get("conditions", [])  # type: ignore[attr-defined]
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def _check_alive(self) -> None:
        for proc in (self.containerd, self.holder, self.kubelet):
            if proc is not None and not proc.alive():
                raise NodeError(f"{proc.name} of node {self.name} exited:\n{proc.tail()}")

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Wait for ``Ready``; NodeError (with kubelet's log) if a process dies or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            if self.ready():
                return
            time.sleep(0.25)
        kubelet_tail = self.kubelet.tail() if self.kubelet else ""
        raise NodeError(f"node {self.name} not Ready after {timeout} s:\n{kubelet_tail}")

    def allocatable(self, resource: str) -> int:
        """The Node's allocatable ``resource`` (0 when absent)."""
        node = self.node_object() or {}
        value = node.get("status", {}).get("allocatable", {}).get(resource, "0")  # type: ignore[attr-defined]
        return int(str(value))

    def wait_gpus(self, timeout: float = 90.0, resource: str = "nvidia.com/gpu") -> None:
        """Wait until kubelet advertises the device plugin's ``resource``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            if self.plugin is not None and not self.plugin.alive():
                raise NodeError(f"device plugin of {self.name} exited:\n{self.plugin.tail()}")
            if self.allocatable(resource) > 0:
                return
            time.sleep(0.25)
        plugin_tail = self.plugin.tail() if self.plugin else ""
        raise NodeError(f"node {self.name} advertises no {resource} after {timeout} s:\n{plugin_tail}")

    def kubelet_log_mark(self) -> int:
        """Where kubelet's log ends now, for ``wait_plugin_registered``."""
        path = self.root / "logs" / "kubelet.log"
        return path.stat().st_size if path.exists() else 0

    def wait_plugin_registered(self, since: int, timeout: float = 60.0) -> None:
        """Wait until kubelet, after log offset ``since``, has a device plugin's devices.

        kubelet logs ``State pushed for device plugin`` once a registered plugin's first
        ``ListAndWatch`` answer reached its device manager (``pkg/kubelet/cm/devicemanager``); only
        then does it admit pods asking for the resource. The Node's allocatable lags by up to a
        status update, so it cannot tell a restarted plugin from the one before.
        """
        path = self.root / "logs" / "kubelet.log"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            with contextlib.suppress(OSError), open(path, "rb") as log:
                log.seek(since)
                if b"State pushed for device plugin" in log.read():
                    return
            time.sleep(0.2)
        plugin_tail = self.plugin.tail() if self.plugin else ""
        raise NodeError(
            f"no device plugin registered with {self.name}'s kubelet within {timeout} s:\n{plugin_tail}"
        )

    def restart_kubelet(self, timeout: float = 60.0) -> None:
        """Stop kubelet (SIGTERM) and start it again; returns once the plugin re-registered with it."""
        self.stop_kubelet()
        mark = self.kubelet_log_mark()
        self.start_kubelet()
        if self.plugin_command is not None:
            self.wait_plugin_registered(mark, timeout)
        self.wait_ready(timeout)

    def restart_plugin(self, timeout: float = 60.0) -> None:
        """Stop the device plugin (SIGTERM) and start it again; returns once kubelet has its devices."""
        self.stop_plugin()
        mark = self.kubelet_log_mark()
        self.start_plugin()
        self.wait_plugin_registered(mark, timeout)

    def restart_containerd(self, timeout: float = 30.0) -> None:
        """Stop containerd (SIGTERM; shims and containers live on) and start it again."""
        self.stop_containerd()
        self.start_containerd(timeout)

    # ------------------------------------------------------------------ teardown
    def _cgroup_pids(self) -> list[int]:
        pids: set[int] = set()
        for hierarchy in self._hierarchies():
            if hierarchy.name not in ("pids", "memory", "freezer"):
                continue
            base = hierarchy / self.cgroup.lstrip("/")
            if not base.is_dir():
                continue
            for procs in base.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(line) for line in procs.read_text().split())
        return sorted(pids)

    def kill_runtime_processes(self) -> int:
        """SIGKILL every process in the node's cgroups (shims and containers), by pid."""
        killed = 0
        for _ in range(50):
            pids = [pid for pid in self._cgroup_pids() if pid != os.getpid()]
            if not pids:
                return killed
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
            time.sleep(0.1)
        return killed

    def _unmount_all(self) -> None:
        """Unmount everything under the node dir, deepest first (lazy: a dying shim may hold one)."""
        root = str(self.root)
        for _ in range(3):
            points = []
            for line in Path("/proc/self/mountinfo").read_text().splitlines():
                point = line.split()[4].replace("\\040", " ")
                if point == root or point.startswith(root + "/"):
                    points.append(point)
            if not points:
                return
            for point in sorted(points, key=len, reverse=True):
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)  # noqa: S603, S607

    def _remove_cgroups(self) -> None:
        for hierarchy in self._hierarchies():
            base = hierarchy / self.cgroup.lstrip("/")
            if not base.is_dir():
                continue
            for group in sorted(
                (p for p in base.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
            ):
                with contextlib.suppress(OSError):
                    group.rmdir()
            with contextlib.suppress(OSError):
                base.rmdir()
            with contextlib.suppress(OSError):
                base.parent.rmdir()

    def stop(self) -> None:
        """Stop the plugin, kubelet and containerd by pid, kill what containerd forked, clean up."""
        for proc in (self.plugin, self.kubelet):
            if proc is not None:
                proc.stop()
        self.kill_runtime_processes()
        if self.containerd is not None:
            self.containerd.stop()
        self.kill_runtime_processes()
        if self.holder is not None:
            self.holder.stop(signal.SIGKILL)
        self._unmount_all()
        self._remove_cgroups()
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, check=False)  # noqa: S603, S607
        if os.environ.get("GPUSLICE_KEEP_NODES") != "1":
            shutil.rmtree(self.root, ignore_errors=True)
        self._started = False


def busybox_applets() -> list[str]:
    """The applets of this machine's static busybox (``busybox --list``)."""
    return run_tool(["/bin/busybox", "--list"], "busybox --list").split()


def start_all(nodes: Sequence[RealNode], timeout: float = 120.0) -> None:
    """Start several nodes at once (each start waits mostly on its kubelet); all or none.

    On any failure every node is stopped and the first error raised.
    """
    errors: list[BaseException] = []

    def start(node: RealNode) -> None:
        try:
            node.start(timeout)
        except BaseException as exc:  # noqa: BLE001 - re-raised below in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(node,), name=f"start-{node.name}") for node in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        for node in nodes:
            node.stop()
        raise errors[0]
