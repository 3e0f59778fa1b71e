"""A real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler) as local processes.

Integration and e2e tests run the genuine binaries, built from the Go module proxy by
``hack/control-plane/build.sh``, as plain child processes on loopback ports: no containers, no
kubelet, no controller-manager. Nodes are API objects whose capacity is set through the
``/status`` subresource (see ``ControlPlane.create_node``).

Typical use::

    with ControlPlane() as cp:
        cp.create_node("gpu-0", {"cpu": "96", "memory": "384Gi", "pods": "110"})
        status, node = cp.api_request("GET", "/api/v1/nodes/gpu-0")

Every process is stopped by its own pid (SIGTERM, then SIGKILL after 10 s) in ``stop()``, which
also runs at interpreter exit. Set ``GPUSLICE_KEEP_CONTROL_PLANE=1`` to keep the work directory
(logs, kubeconfigs, etcd data) for inspection, ``GPUSLICE_CONTROL_PLANE_BIN`` to use prebuilt
binaries instead of running ``build.sh``.

Fault injection for the chaos tier, all by pid: ``freeze_apiserver``/``thaw_apiserver``
(SIGSTOP/SIGCONT), ``restart_apiserver`` (SIGKILL, then a new kube-apiserver on the same etcd,
port, certificates and tokens), and the same for kube-scheduler (``freeze_scheduler``,
``thaw_scheduler``, ``restart_scheduler``); ``stop()`` resumes a frozen process before stopping it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from gpuslice_dev import pki
from gpuslice_dev.paths import REPO_ROOT

CONTROL_PLANE_DIR = REPO_ROOT / "hack" / "control-plane"
BUILD_SCRIPT = CONTROL_PLANE_DIR / "build.sh"
VERSIONS_FILE = CONTROL_PLANE_DIR / "versions.env"

BINARIES = ("etcd", "kube-apiserver", "kube-scheduler")
USER_NAME = "gpuslice"
"""The non-admin user of the second token (no groups besides ``system:authenticated``)."""

DISABLED_ADMISSION_PLUGINS = "ServiceAccount,TaintNodesByCondition,StorageObjectInUseProtection"

_STOP_GRACE_S = 10.0
_PORT_WAIT_S = 10.0
_LOG_TAIL_LINES = 40


class ControlPlaneError(RuntimeError):
    """The control plane could not be built, started or reached."""


def pinned_versions() -> dict[str, str]:
    """Read the pinned versions from ``hack/control-plane/versions.env``.

    Returns:
        The ``KEY=value`` pairs of the file, e.g. ``{"K8S_VERSION": "v1.34.4", ...}``.
    """
    versions: dict[str, str] = {}
    for raw in VERSIONS_FILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        versions[key.strip()] = value.strip().strip("\"'")
    return versions


def built_path(script: Path, override_env: str) -> Path:
    """``$override_env`` when set, else the last line ``script`` prints (it builds what is not cached).

    Raises:
        ControlPlaneError: the script failed or printed nothing.
    """
    override = os.environ.get(override_env)
    if override:
        return Path(override)
    proc = subprocess.run(  # noqa: S603 - fixed script path from this repository
        ["bash", str(script)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, check=False
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise ControlPlaneError(f"{script} failed with exit status {proc.returncode}")
    return Path(lines[-1])


def binaries_dir() -> Path:
    """Return the directory holding ``etcd``, ``kube-apiserver`` and ``kube-scheduler``.

    Uses ``$GPUSLICE_CONTROL_PLANE_BIN`` when set; otherwise runs ``hack/control-plane/build.sh``,
    which returns at once when the pinned versions are already cached and otherwise builds them
    (10-20+ minutes on 2 cores, once per version).

    Returns:
        The bin directory.

    Raises:
        ControlPlaneError: If the build fails or a binary is missing.
    """
    bin_dir = built_path(BUILD_SCRIPT, "GPUSLICE_CONTROL_PLANE_BIN")
    missing = [name for name in BINARIES if not os.access(bin_dir / name, os.X_OK)]
    if missing:
        raise ControlPlaneError(f"{bin_dir} lacks executable {', '.join(missing)}")
    return bin_dir


def _free_ports(count: int) -> list[int]:
    """Find ``count`` distinct free TCP ports on 127.0.0.1 by binding port 0."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _port_free(port: int) -> bool:
    """True when 127.0.0.1:``port`` can be bound (with SO_REUSEADDR, as Go's listeners do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """Return the last ``lines`` lines of a log file, or a note if it cannot be read."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def _insecure_context() -> ssl.SSLContext:
    """TLS context that accepts the apiserver's self-signed serving certificate."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


# No proxies: an HTTPS_PROXY in the environment must not capture loopback requests.
_OPENER = urllib.request.build_opener(
    urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=_insecure_context())
)


class _Process:
    """A started child process and its log file."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log_path: Path, log_file: IO[bytes]):
        self.name = name
        self.popen = popen
        self.log_path = log_path
        self.log_file = log_file

    def stop(self) -> None:
        """Stop the process by its own pid: SIGTERM, wait, then SIGKILL."""
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(signal.SIGTERM)
                self.popen.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
            except ProcessLookupError:
                pass
        self.log_file.close()

    def kill(self) -> None:
        """SIGKILL the process by its own pid (resumed first if stopped) and reap it."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGCONT)
                self.popen.kill()
            self.popen.wait()
        self.log_file.close()


class ControlPlane:
    """etcd + kube-apiserver (+ optionally kube-scheduler) on free loopback ports.

    Authentication is by static bearer tokens: ``admin_token`` (group ``system:masters``) and
    ``user_token`` for the user ``gpuslice`` with no groups, so tests can check RBAC rules.
    Authorization mode is RBAC. The admission plugins that need absent controllers
    (``ServiceAccount``, ``TaintNodesByCondition``, ``StorageObjectInUseProtection``) are disabled.
    ``Priority`` stays on, as in every real cluster: a pod's ``spec.priority`` is resolved from its
    ``priorityClassName`` (``priority_class``), and a pod that sets another value is refused.

    Args:
        bin_dir: Directory with the binaries; defaults to ``binaries_dir()``.
        workdir: Directory for keys, tokens, kubeconfigs, logs and etcd data; defaults to a fresh
            temporary directory that ``stop()`` removes (a given one is never removed).
        startup_timeout: Seconds to wait for ``/readyz`` before giving up.
        extra_apiserver_args: Additional kube-apiserver flags (e.g. feature gates).
        address: The address kube-apiserver binds and advertises. The default loopback address is
            for clients on this machine only; a cluster whose pods talk to the apiserver (through
            the ``kubernetes`` Service) needs an address the pods can route to
            (``devcluster.clusterhost``), and then the ``kubernetes`` endpoints are reconciled.
        service_cluster_ip_range: kube-apiserver's ``--service-cluster-ip-range``.
        service_accounts: Keep the ``ServiceAccount`` admission plugin on, so that pods get their
            account's token projected (needs kube-controller-manager for ``default`` accounts and
            the ``kube-root-ca.crt`` ConfigMaps).
    """

    def __init__(
        self,
        bin_dir: Path | None = None,
        workdir: Path | None = None,
        startup_timeout: float = 90.0,
        extra_apiserver_args: Sequence[str] = (),
        *,
        address: str = "127.0.0.1",
        service_cluster_ip_range: str = "10.0.0.0/24",
        service_accounts: bool = False,
    ) -> None:
        self._address = address
        self._service_range = service_cluster_ip_range
        self._service_accounts = service_accounts
        self._bin_dir = bin_dir
        self._given_workdir = workdir
        self._workdir: Path | None = None
        self._startup_timeout = startup_timeout
        self._extra_apiserver_args = list(extra_apiserver_args)
        self._processes: list[_Process] = []
        self._scheduler: _Process | None = None
        self._scheduler_count = 0
        self._scheduler_config = ""
        self._apiserver: _Process | None = None
        self._apiserver_argv: list[str] = []
        self._apiserver_frozen = False
        self._scheduler_frozen = False
        self._admin_token = secrets.token_hex(16)
        self._user_token = secrets.token_hex(16)
        self._server = ""
        self._etcd_url = ""
        self._atexit_registered = False
        self._ca: pki.ClientCA | None = None

    # ----------------------------------------------------------------- properties

    @property
    def server(self) -> str:
        """The apiserver URL, ``https://127.0.0.1:<port>``."""
        self._require_started()
        return self._server

    @property
    def etcd_url(self) -> str:
        """The etcd client URL, ``http://127.0.0.1:<port>``."""
        self._require_started()
        return self._etcd_url

    @property
    def admin_token(self) -> str:
        """Bearer token of user ``admin`` in group ``system:masters`` (bypasses RBAC)."""
        return self._admin_token

    @property
    def user_token(self) -> str:
        """Bearer token of the non-admin user ``gpuslice`` (no RBAC grants by default)."""
        return self._user_token

    @property
    def workdir(self) -> Path:
        """Directory with keys, tokens, kubeconfigs and the ``*.log`` files."""
        self._require_started()
        assert self._workdir is not None
        return self._workdir

    @property
    def kubeconfig(self) -> Path:
        """Path of the admin kubeconfig (token auth, TLS verification skipped)."""
        return self.workdir / "kubeconfig.yaml"

    @property
    def user_kubeconfig(self) -> Path:
        """Path of the kubeconfig of the non-admin user ``gpuslice``."""
        return self.workdir / "kubeconfig-gpuslice.yaml"

    @property
    def scheduler(self) -> subprocess.Popen[bytes] | None:
        """The running kube-scheduler process, if any."""
        return None if self._scheduler is None else self._scheduler.popen

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> ControlPlane:
        """Start the control plane."""
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the control plane."""
        self.stop()

    def start(self) -> ControlPlane:
        """Start etcd and kube-apiserver and wait until the apiserver is ready.

        Returns:
            self, for chaining.

        Raises:
            ControlPlaneError: If a process dies or ``/readyz`` is not ok within the timeout; the
                message includes the tails of the log files.
        """
        if self._workdir is not None:
            raise ControlPlaneError("control plane already started")
        bin_dir = self._bin_dir or binaries_dir()
        if self._given_workdir is not None:
            self._given_workdir.mkdir(parents=True, exist_ok=True)
            self._workdir = self._given_workdir
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix="gpuslice-cp-"))
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            self._start(bin_dir, self._workdir)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, bin_dir: Path, work: Path) -> None:
        self._write_credentials(work)
        etcd_port, peer_port, api_port = _free_ports(3)
        self._etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._server = f"https://{self._address}:{api_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"

        self._spawn(
            "etcd",
            [
                str(bin_dir / "etcd"),
                "--name=gpuslice",
                f"--data-dir={work / 'etcd'}",
                f"--listen-client-urls={self._etcd_url}",
                f"--advertise-client-urls={self._etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=gpuslice={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            work,
            # etcd reads ETCD_* variables as flags; a developer's environment must not leak in.
            env={k: v for k, v in os.environ.items() if not k.startswith("ETCD")},
        )
        self._apiserver_argv = [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers={self._etcd_url}",
            f"--bind-address={self._address}",
            f"--advertise-address={self._address}",
            f"--secure-port={api_port}",
            f"--cert-dir={work / 'pki'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={work / 'sa.pub'}",
            f"--service-account-signing-key-file={work / 'sa.key'}",
            f"--service-cluster-ip-range={self._service_range}",
            f"--token-auth-file={work / 'tokens.csv'}",
            # Client certificates signed by the cluster CA: kubelets and device plugins get their
            # own identities (``client_kubeconfig``), and the apiserver its kubelet client.
            f"--client-ca-file={work / 'ca.crt'}",
            f"--kubelet-client-certificate={work / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={work / 'apiserver-kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP",
            # The Node authorizer confines a kubelet (user system:node:<name>) to its own node and
            # pods, as on a kubeadm cluster; RBAC does the rest.
            "--authorization-mode=Node,RBAC",
            f"--disable-admission-plugins={self._disabled_admission()}",
            "--allow-privileged=true",
            *self._endpoint_args(),
            *self._extra_apiserver_args,
        ]
        self._apiserver = self._spawn("kube-apiserver", self._apiserver_argv, work)
        self._wait_ready()
        (work / "kubeconfig.yaml").write_text(pki.kubeconfig(self._server, "admin", token=self._admin_token))
        (work / "kubeconfig-gpuslice.yaml").write_text(
            pki.kubeconfig(self._server, USER_NAME, token=self._user_token)
        )

    def _disabled_admission(self) -> str:
        if not self._service_accounts:
            return DISABLED_ADMISSION_PLUGINS
        return ",".join(p for p in DISABLED_ADMISSION_PLUGINS.split(",") if p != "ServiceAccount")

    def _endpoint_args(self) -> list[str]:
        # 127.0.0.1 may not be an Endpoints address, and nothing in-cluster reaches a loopback
        # apiserver anyway: skip reconciling the `kubernetes` endpoints then (no log noise).
        return ["--endpoint-reconciler-type=none"] if self._address.startswith("127.") else []

    @property
    def address(self) -> str:
        """The address kube-apiserver binds and advertises."""
        return self._address

    @property
    def serving_ca_file(self) -> Path:
        """The CA of the apiserver's own (self-signed) serving certificate, for in-cluster clients.

        kube-apiserver writes ``apiserver.crt`` (its leaf and the CA that signed it) into
        ``--cert-dir`` when no serving certificate is given; pods trust it through the
        ``kube-root-ca.crt`` ConfigMap that kube-controller-manager publishes from this file.
        """
        return self.workdir / "pki" / "apiserver.crt"

    def _write_credentials(self, work: Path) -> None:
        """Write the service-account key pair, the client CA and the static token file."""
        try:
            pki.rsa_key_pair(work / "sa.key", work / "sa.pub")
            self._ca = pki.ClientCA(work)
            self._ca.sign("apiserver-kubelet-client", "kube-apiserver-kubelet-client")
        except pki.PkiError as exc:
            raise ControlPlaneError(str(exc)) from exc
        # token,user,uid,"group1,group2"
        (work / "tokens.csv").write_text(
            f'{self._admin_token},admin,admin,"system:masters"\n{self._user_token},{USER_NAME},{USER_NAME}\n'
        )

    def client_kubeconfig(self, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig authenticating as ``user`` in ``groups`` with a CA-signed client certificate.

        A kubelet is ``client_kubeconfig("system:node:<name>", ["system:nodes"])``; what the user
        may do is up to the Node authorizer and RBAC, never an admin token.
        """
        self._require_started()
        if self._ca is None:
            raise ControlPlaneError("control plane has no client CA")
        stem = "client-" + "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in user)
        cert, key = self._ca.sign(stem, user, groups)
        path = self.workdir / f"{stem}.kubeconfig"
        path.write_text(pki.kubeconfig(self._server, user, cert=cert, key=key))
        return path

    @property
    def ca_file(self) -> Path:
        """The cluster CA that signs client certificates (kubelets trust it for the apiserver's)."""
        return self.workdir / "ca.crt"

    def _spawn(
        self, name: str, argv: list[str], work: Path, env: Mapping[str, str] | None = None
    ) -> _Process:
        log_path = work / f"{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed by _Process.stop
        try:
            popen = subprocess.Popen(  # noqa: S603 - argv built from fixed binaries
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=work,
                env=dict(env) if env is not None else None,
            )
        except BaseException:
            log_file.close()
            raise
        proc = _Process(name, popen, log_path, log_file)
        self._processes.append(proc)
        return proc

    def _failure(self, message: str) -> ControlPlaneError:
        parts = [message]
        if os.environ.get("GPUSLICE_KEEP_CONTROL_PLANE") != "1" and self._given_workdir is None:
            parts.append("(set GPUSLICE_KEEP_CONTROL_PLANE=1 to keep the work dir and its logs)")
        for proc in self._processes:
            state = "running" if proc.popen.poll() is None else f"exited {proc.popen.returncode}"
            parts.append(f"--- {proc.name} (pid {proc.popen.pid}, {state}), {proc.log_path}:")
            parts.append(_tail(proc.log_path))
        return ControlPlaneError("\n".join(parts))

    def _check_alive(self) -> None:
        for proc in self._processes:
            if proc.popen.poll() is not None:
                raise self._failure(f"{proc.name} exited with status {proc.popen.returncode}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._startup_timeout
        last = "no answer yet"
        ready = False
        while time.monotonic() < deadline:
            self._check_alive()
            if not ready:
                status, text = self._raw_request("GET", "/readyz", timeout=5.0)
                ready = status == 200 and text.strip() == "ok"
                last = f"/readyz: {status} {text.strip()[-500:]}"
            if ready:
                # The `default` namespace is created by a post-start controller; tests need it.
                status, text = self._raw_request("GET", "/api/v1/namespaces/default", timeout=5.0)
                if status == 200:
                    return
                last = f"namespace default: {status}"
            time.sleep(0.2)
        raise self._failure(f"kube-apiserver not ready after {self._startup_timeout:.0f} s ({last})")

    def stop(self) -> None:
        """Stop every started process by its pid and remove the temporary work directory.

        Safe to call more than once. The work directory is kept when
        ``GPUSLICE_KEEP_CONTROL_PLANE=1`` or when it was passed to the constructor.
        """
        self.stop_scheduler()
        self._resume(self._apiserver)
        self._apiserver_frozen = False
        self._apiserver = None
        # Reverse start order: apiserver before etcd.
        while self._processes:
            self._processes.pop().stop()
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False
        work, self._workdir = self._workdir, None
        if work is None or self._given_workdir is not None:
            return
        if os.environ.get("GPUSLICE_KEEP_CONTROL_PLANE") == "1":
            print(f"gpuslice: kept control-plane work dir {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    def _require_started(self) -> None:
        if self._workdir is None:
            raise ControlPlaneError("control plane not started")

    # ----------------------------------------------------------------- scheduler

    def start_scheduler(self, config_yaml: str, timeout: float = 30.0) -> subprocess.Popen[bytes]:
        """Start kube-scheduler with the given ``KubeSchedulerConfiguration`` text, verbatim.

        The config must name its own ``clientConnection.kubeconfig`` (e.g. ``self.kubeconfig``).
        The scheduler serves ``/healthz`` on a free 127.0.0.1 port; this waits until it answers.

        Args:
            config_yaml: The configuration file contents; nothing is substituted.
            timeout: Seconds to wait for ``/healthz``.

        Returns:
            The kube-scheduler process (log: ``workdir/kube-scheduler.log``).

        Raises:
            ControlPlaneError: If a scheduler is already running, or it exits or does not become
                healthy in time.
        """
        work = self.workdir
        if self._scheduler is not None:
            raise ControlPlaneError("kube-scheduler already running; call stop_scheduler() first")
        bin_dir = self._bin_dir or binaries_dir()
        self._scheduler_count += 1
        config = work / f"kube-scheduler-config-{self._scheduler_count}.yaml"
        config.write_text(config_yaml)
        self._scheduler_config = config_yaml
        (port,) = _free_ports(1)
        proc = self._spawn(
            "kube-scheduler",
            [
                str(bin_dir / "kube-scheduler"),
                f"--config={config}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={work / 'scheduler-pki'}",
                # Delegated authn/authz of the scheduler's own endpoints.
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "-v=2",
            ],
            work,
        )
        self._processes.remove(proc)
        self._scheduler = proc
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                code = proc.popen.returncode
                self.stop_scheduler()
                raise ControlPlaneError(
                    f"kube-scheduler exited with status {code}; {proc.log_path}:\n{_tail(proc.log_path)}"
                )
            status, text = self._raw_request("GET", "/healthz", base=f"https://127.0.0.1:{port}", timeout=2.0)
            if status == 200:
                return proc.popen
            last = f"{status} {text.strip()[-300:]}"
            time.sleep(0.2)
        self.stop_scheduler()
        raise ControlPlaneError(
            f"kube-scheduler /healthz not ok after {timeout:.0f} s ({last}); {proc.log_path}:\n"
            f"{_tail(proc.log_path)}"
        )

    def stop_scheduler(self) -> None:
        """Stop kube-scheduler by its pid, if it runs; its log file stays in the work dir."""
        proc, self._scheduler = self._scheduler, None
        if proc is not None:
            self._resume(proc)
            self._scheduler_frozen = False
            proc.stop()

    # ----------------------------------------------------------------- faults

    @property
    def apiserver_pid(self) -> int:
        """The pid of the running kube-apiserver (it changes with ``restart_apiserver``)."""
        self._require_started()
        if self._apiserver is None:
            raise ControlPlaneError("kube-apiserver not running")
        return int(self._apiserver.popen.pid)

    @property
    def apiserver_frozen(self) -> bool:
        """True between ``freeze_apiserver()`` and ``thaw_apiserver()``."""
        return self._apiserver_frozen

    @staticmethod
    def _signal(proc: _Process | None, sig: signal.Signals, what: str) -> None:
        if proc is None or proc.popen.poll() is not None:
            raise ControlPlaneError(f"{what} is not running")
        proc.popen.send_signal(sig)

    def _resume(self, proc: _Process | None) -> None:
        """SIGCONT a process this object froze, so that SIGTERM can stop it."""
        if proc is None or proc.popen.poll() is not None:
            return
        if (proc is self._apiserver and self._apiserver_frozen) or (
            proc is self._scheduler and self._scheduler_frozen
        ):
            with contextlib.suppress(ProcessLookupError):
                proc.popen.send_signal(signal.SIGCONT)

    def freeze_apiserver(self) -> None:
        """Suspend kube-apiserver with SIGSTOP: connections stay open, nothing is answered.

        Raises:
            ControlPlaneError: If the apiserver is not running.
        """
        self._require_started()
        self._signal(self._apiserver, signal.SIGSTOP, "kube-apiserver")
        self._apiserver_frozen = True

    def thaw_apiserver(self, wait_ready: bool = True) -> None:
        """Resume a frozen kube-apiserver with SIGCONT.

        Args:
            wait_ready: Also wait until ``/readyz`` answers ok again.

        Raises:
            ControlPlaneError: If the apiserver is not running, or not ready in time.
        """
        self._require_started()
        self._signal(self._apiserver, signal.SIGCONT, "kube-apiserver")
        self._apiserver_frozen = False
        if wait_ready:
            self._wait_ready()

    def kill_apiserver(self) -> None:
        """SIGKILL kube-apiserver by its pid (etcd keeps running); ``restart_apiserver`` brings it back."""
        self._require_started()
        proc, self._apiserver = self._apiserver, None
        self._apiserver_frozen = False
        if proc is None:
            return
        if proc in self._processes:
            self._processes.remove(proc)
        proc.kill()

    def restart_apiserver(self) -> int:
        """SIGKILL kube-apiserver and start a new one on the same etcd, port, certificates and tokens.

        Waits until the new apiserver's ``/readyz`` is ok. Clients keep their kubeconfigs: the URL,
        the serving certificate (kept in the cert dir) and the tokens are unchanged.

        Returns:
            The new apiserver's pid.

        Raises:
            ControlPlaneError: If the new apiserver exits or is not ready in time.
        """
        work = self.workdir
        self.kill_apiserver()
        deadline = time.monotonic() + _PORT_WAIT_S
        port = int(self._server.rsplit(":", 1)[1])
        while not _port_free(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._apiserver = self._spawn("kube-apiserver", self._apiserver_argv, work)
        self._wait_ready()
        return self.apiserver_pid

    @property
    def scheduler_pid(self) -> int | None:
        """The pid of the running kube-scheduler, if any."""
        return None if self._scheduler is None else int(self._scheduler.popen.pid)

    def freeze_scheduler(self) -> None:
        """Suspend kube-scheduler with SIGSTOP.

        Raises:
            ControlPlaneError: If no scheduler runs.
        """
        self._signal(self._scheduler, signal.SIGSTOP, "kube-scheduler")
        self._scheduler_frozen = True

    def thaw_scheduler(self) -> None:
        """Resume a frozen kube-scheduler with SIGCONT.

        Raises:
            ControlPlaneError: If no scheduler runs.
        """
        self._signal(self._scheduler, signal.SIGCONT, "kube-scheduler")
        self._scheduler_frozen = False

    def restart_scheduler(self, timeout: float = 30.0) -> subprocess.Popen[bytes]:
        """SIGKILL kube-scheduler and start it again with the configuration it was last started with.

        Args:
            timeout: Seconds to wait for the new scheduler's ``/healthz``.

        Returns:
            The new kube-scheduler process.

        Raises:
            ControlPlaneError: If no scheduler was ever started, or the new one is not healthy.
        """
        if not self._scheduler_config:
            raise ControlPlaneError("kube-scheduler was never started")
        proc, self._scheduler = self._scheduler, None
        self._scheduler_frozen = False
        if proc is not None:
            proc.kill()
        return self.start_scheduler(self._scheduler_config, timeout)

    # ----------------------------------------------------------------- API helpers

    def _raw_request(
        self,
        method: str,
        path: str,
        data: bytes | None = None,
        token: str | None = None,
        content_type: str = "application/json",
        base: str | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, str]:
        """Send one HTTPS request; return (status, body text), status 0 if unreachable."""
        req = urllib.request.Request(f"{base or self._server}{path}", data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self._admin_token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with _OPENER.open(req, timeout=timeout) as resp:
                return int(resp.status), resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as err:
            return int(err.code), err.read().decode("utf-8", "replace")
        except (urllib.error.URLError, OSError) as err:
            return 0, str(err)

    def api_request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        token: str | None = None,
        *,
        content_type: str | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, dict[str, Any]]:
        """Call the apiserver with a JSON body; HTTP errors are returned, not raised.

        Args:
            method: HTTP method.
            path: Path and query, e.g. ``/api/v1/nodes?labelSelector=a%3Db``.
            body: JSON body, if any.
            token: Bearer token; defaults to ``admin_token``.
            content_type: Defaults to ``application/merge-patch+json`` for PATCH and
                ``application/json`` otherwise.
            timeout: Socket timeout in seconds.

        Returns:
            ``(HTTP status, decoded JSON object)``; a non-JSON body comes back as ``{"text": ...}``
            and an unreachable server as status 0.
        """
        self._require_started()
        if content_type is None:
            content_type = "application/merge-patch+json" if method.upper() == "PATCH" else "application/json"
        data = None if body is None else json.dumps(body).encode()
        status, text = self._raw_request(method.upper(), path, data, token, content_type, timeout=timeout)
        try:
            decoded = json.loads(text) if text else {}
        except ValueError:
            decoded = None
        if not isinstance(decoded, dict):
            decoded = {"text": text}
        return status, decoded

    def priority_class(self, name: str, value: int) -> None:
        """Create the PriorityClass ``name`` with ``value`` (an existing one is left as it is)."""
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        status, got = self.api_request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body)
        if status not in (201, 409):
            raise ControlPlaneError(f"creating PriorityClass {name}: HTTP {status}: {got}")

    def create_node(
        self,
        name: str,
        allocatable: Mapping[str, str],
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        capacity: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Create a Node and set its capacity/allocatable through the ``/status`` subresource.

        Without a kubelet, ``allocatable`` should include ``cpu``, ``memory`` and ``pods`` or the
        scheduler's in-tree fit rejects every pod.

        Args:
            name: Node name.
            allocatable: ``status.allocatable``, e.g. ``{"cpu": "96", "nvidia.com/gpu": "8"}``.
            labels: Node labels.
            annotations: Node annotations.
            capacity: ``status.capacity``; defaults to ``allocatable``.

        Returns:
            The Node as returned by the status patch.

        Raises:
            ControlPlaneError: If the apiserver rejects either request.
        """
        meta: dict[str, Any] = {"name": name}
        if labels:
            meta["labels"] = dict(labels)
        if annotations:
            meta["annotations"] = dict(annotations)
        status, obj = self.api_request(
            "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": meta}
        )
        if status != 201:
            raise ControlPlaneError(f"create node {name}: HTTP {status}: {obj}")
        patch = {"status": {"capacity": dict(capacity or allocatable), "allocatable": dict(allocatable)}}
        status, obj = self.api_request("PATCH", f"/api/v1/nodes/{name}/status", patch)
        if status != 200:
            raise ControlPlaneError(f"patch node {name} status: HTTP {status}: {obj}")
        return obj

    def log_tail(self, component: str, lines: int = _LOG_TAIL_LINES) -> str:
        """Return the last lines of ``etcd``, ``kube-apiserver`` or ``kube-scheduler``'s log.

        Args:
            component: Process name.
            lines: How many lines.

        Returns:
            The tail of ``workdir/<component>.log``.
        """
        return _tail(self.workdir / f"{component}.log", lines)
