"""Run a rendered Pod template's containers as local processes, as a kubelet and runtime would.

A chart-driven test renders a chart (``helm template``), creates its ServiceAccounts and RBAC in
a ``ControlPlane``, and starts each workload's containers with exactly their commands,
arguments, environment and mounted files::

    runner = PodRunner(cp, manifests, workdir, {"gpuslice": ".venv/bin/gpuslice"})
    with runner.start(pod_template_of(deployment), namespace="gpuslice", pod_name="gpuslice-0",
                      node_name="node-a") as pod:
        ...  # pod.processes["extender"], pod.log_path("extender")

What happens per pod (``workdir/<pod>/``):

- volumes are materialized under ``volumes/<name>`` (``podvolumes``): ConfigMaps and Secrets
  come from ``manifests``, then from the API; ``kube-root-ca.crt`` is the apiserver's CA;
- unless ``automountServiceAccountToken: false``, a token for ``spec.serviceAccountName`` is
  minted with the TokenRequest API and mounted with ``ca.crt`` and ``namespace`` at
  ``/var/run/secrets/kubernetes.io/serviceaccount``; ``KUBERNETES_SERVICE_HOST``/``PORT`` point
  at the apiserver, so in-cluster configs (client-go ``rest.InClusterConfig``, lightkube
  ``KubeConfig.from_service_account``) work unmodified;
- each container runs in its own private mount (and UTS) namespace with its volumes at their
  real paths (``podmounts``), nothing visible on the host; its environment is built from
  scratch (``podenv``) plus a minimal ``PATH``/``HOME``/``LANG`` and ``HOSTNAME``;
- ``command[0]`` is looked up in ``executables`` (the image is not available);
- init containers run first, in order, each to success; ``restartPolicy: Always`` init
  containers (sidecars) keep running;
- stdout and stderr go to ``<container>.log``; the setup script is kept as ``<container>.sh``.

Not emulated: probes, lifecycle hooks, restarts, resource limits, ``securityContext`` (logged),
network namespaces (every container shares the host network; bind to 127.0.0.1), the ``/etc/hosts``
and ``/etc/resolv.conf`` the kubelet writes, and service links for Services other than
``kubernetes``. Every process is stopped by its own pid (SIGTERM, then SIGKILL) in
``RunningPod.stop()``, which also runs at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any
from urllib.parse import quote

import msgspec

from gpuslice_dev import podenv, podmounts, podvolumes
from gpuslice_dev.controlplane import ControlPlane
from gpuslice_dev.paths import REPO_ROOT
from gpuslice_dev.podenv import PodSpecError

log = logging.getLogger(__name__)

__all__ = [
    "ContainerLaunch",
    "PodRunError",
    "PodRunner",
    "PodSpecError",
    "RunningPod",
    "apiserver_ca_pem",
    "pod_template_of",
]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""``PATH`` when the container does not set one (containerd's default)."""

TOKEN_EXPIRATION_S = 3600
"""``expirationSeconds`` of the automounted service-account token."""

_WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job")
_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----\n?", re.DOTALL)
_TOOLS = ("unshare", "mount", "mkdir", "touch", "env")


class PodRunError(RuntimeError):
    """A container could not be started, or an init container failed."""


class ContainerLaunch(msgspec.Struct, frozen=True):
    """How one container was started (for assertions and debugging)."""

    name: str
    init: bool
    """An init container (run to completion unless ``sidecar``)."""
    sidecar: bool
    argv: tuple[str, ...]
    """``command`` + ``args`` expanded; ``argv[0]`` as written in the template."""
    executable: str
    """The local program run for ``argv[0]``."""
    env: dict[str, str]
    working_dir: str
    mounts: tuple[podmounts.MountRequest, ...]
    script: str
    """The mount-namespace setup script."""
    read_only_root_fs: bool
    """``securityContext.readOnlyRootFilesystem`` (recorded, not enforced)."""


def pod_template_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The PodTemplateSpec of a rendered Pod, Deployment, DaemonSet, StatefulSet, ReplicaSet, Job or CronJob.

    Raises:
        PodSpecError: another kind.
    """
    kind = obj.get("kind")
    spec = obj.get("spec") or {}
    if kind == "Pod":
        return {"metadata": dict(obj.get("metadata") or {}), "spec": dict(spec)}
    if kind in _WORKLOAD_KINDS:
        return dict(spec["template"])
    if kind == "CronJob":
        return dict(spec["jobTemplate"]["spec"]["template"])
    raise PodSpecError(f"{kind} has no pod template")


def apiserver_ca_pem(cp: ControlPlane) -> bytes:
    """The CA that signed the apiserver's self-signed serving certificate.

    kube-apiserver without ``--tls-cert-file`` writes ``<cert-dir>/apiserver.crt``: the serving
    certificate followed by its CA (client-go ``GenerateSelfSignedCertKeyWithFixtures``); the
    CA is the last block.

    Raises:
        PodRunError: the file has no certificate.
    """
    path = cp.workdir / "pki" / "apiserver.crt"
    blocks = _PEM.findall(path.read_bytes())
    if not blocks:
        raise PodRunError(f"{path} holds no certificate")
    last: bytes = blocks[-1]
    return last if last.endswith(b"\n") else last + b"\n"


def host_kind(path: str) -> podmounts.PathKind:
    """What ``path`` is on this host, following symlinks."""
    try:
        st = os.stat(path)
    except OSError:
        return "missing"
    return "dir" if stat.S_ISDIR(st.st_mode) else "file"


def host_mount_points() -> frozenset[str]:
    """This process's mount points (``/proc/self/mountinfo``, field 5, octal escapes decoded)."""
    points = set()
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split(" ")
            if len(fields) > 4:
                points.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return frozenset(points)


def _host_allocatable() -> dict[str, str]:
    """This machine's cpu and memory, standing in for a Node that does not exist."""
    alloc = {"cpu": str(os.cpu_count() or 1)}
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                alloc["memory"] = f"{int(line.split()[1])}Ki"
    return alloc


class RunningPod:
    """The processes of one started pod.

    Attributes:
        pod: the pod's identity (name, namespace, uid, node...).
        pod_dir: ``workdir/<pod>``.
        processes: container name -> process (the Popen pid is the container's own process).
        launches: container name -> how it was started.
    """

    def __init__(self, pod: podenv.PodInfo, pod_dir: Path, stop_grace_s: float) -> None:
        self.pod = pod
        self.pod_dir = pod_dir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.launches: dict[str, ContainerLaunch] = {}
        self._logs: list[IO[bytes]] = []
        self._grace = stop_grace_s
        self._stopped = False
        atexit.register(self.stop)

    def _track(self, launch: ContainerLaunch, proc: subprocess.Popen[bytes], log_file: IO[bytes]) -> None:
        self.processes[launch.name] = proc
        self.launches[launch.name] = launch
        self._logs.append(log_file)

    def log_path(self, container: str) -> Path:
        """``workdir/<pod>/<container>.log``: the container's stdout and stderr."""
        return self.pod_dir / f"{container}.log"

    def log_text(self, container: str) -> str:
        """The container's log so far."""
        try:
            return self.log_path(container).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait(self, container: str, timeout: float | None = None) -> int:
        """Wait for a container's process to exit and return its status.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout`` seconds.
        """
        return self.processes[container].wait(timeout)

    def running(self, container: str) -> bool:
        """Whether the container's process is still running."""
        return self.processes[container].poll() is None

    def stop(self) -> None:
        """SIGTERM every running container by its pid, SIGKILL what is left after the grace period.

        Safe to call more than once; the mount namespaces vanish with their processes.
        """
        for proc in self.processes.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self._grace
        for proc in self.processes.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        while self._logs:
            self._logs.pop().close()
        if not self._stopped:
            atexit.unregister(self.stop)
            self._stopped = True

    def __enter__(self) -> RunningPod:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class PodRunner:
    """Starts pod templates against a ``ControlPlane``.

    Args:
        cp: the running control plane (tokens are minted and objects read as its admin).
        manifests: the rendered objects; ConfigMaps and Secrets are looked up here first.
        workdir: where each pod's directory is made.
        executables: ``command[0]`` -> local executable (absolute, or found on ``PATH``).
        api_fallback: read ConfigMaps and Secrets missing from ``manifests`` from the API.
        stop_grace_s: seconds between SIGTERM and SIGKILL in ``RunningPod.stop``.
        init_timeout_s: seconds an init container may run.
        setup_timeout_s: seconds a container's mount setup may take.
    """

    def __init__(
        self,
        cp: ControlPlane,
        manifests: Sequence[Mapping[str, Any]],
        workdir: Path,
        executables: Mapping[str, str],
        *,
        api_fallback: bool = True,
        stop_grace_s: float = 10.0,
        init_timeout_s: float = 120.0,
        setup_timeout_s: float = 30.0,
    ) -> None:
        self.cp = cp
        self.workdir = Path(workdir)
        self.executables = dict(executables)
        self._stop_grace_s = stop_grace_s
        self._init_timeout_s = init_timeout_s
        self._setup_timeout_s = setup_timeout_s
        self._objects = podenv.ManifestObjects(manifests, self._from_api if api_fallback else self._root_ca)
        self._pods: dict[str, RunningPod] = {}
        tools = {name: shutil.which(name) for name in (*_TOOLS, "hostname")}
        missing = [name for name in _TOOLS if tools[name] is None]
        if missing:
            raise PodRunError(f"podrun needs {', '.join(missing)} on PATH")
        self._tools = {name: path for name, path in tools.items() if path is not None}

    # ----------------------------------------------------------------- objects

    def _root_ca(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        if kind == "ConfigMap" and name == podvolumes.ROOT_CA_CONFIGMAP:
            return {"kind": "ConfigMap", "data": {"ca.crt": apiserver_ca_pem(self.cp).decode()}}
        return None

    def _from_api(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        resource = {"ConfigMap": "configmaps", "Secret": "secrets"}[kind]
        status, obj = self.cp.api_request(
            "GET", f"/api/v1/namespaces/{quote(namespace)}/{resource}/{quote(name)}"
        )
        if status == 200:
            return obj
        if status != 404:
            raise PodRunError(f"GET {kind} {namespace}/{name}: HTTP {status}: {obj}")
        return self._root_ca(kind, namespace, name)

    def _mint(self, namespace: str, account: str, audience: str | None, expiration: int) -> str:
        spec: dict[str, Any] = {"expirationSeconds": expiration}
        if audience is not None:
            spec["audiences"] = [audience]
        status, obj = self.cp.api_request(
            "POST",
            f"/api/v1/namespaces/{quote(namespace)}/serviceaccounts/{quote(account)}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        token = (obj.get("status") or {}).get("token") if status == 201 else None
        if not token:
            raise PodRunError(f"TokenRequest for ServiceAccount {namespace}/{account}: HTTP {status}: {obj}")
        return str(token)

    def _automount(self, spec: Mapping[str, Any], namespace: str, account: str) -> bool:
        """Whether to mount a token (pod setting, else the ServiceAccount's; ServiceAccount must exist)."""
        if spec.get("automountServiceAccountToken") is False:
            return False
        status, sa = self.cp.api_request(
            "GET", f"/api/v1/namespaces/{quote(namespace)}/serviceaccounts/{quote(account)}"
        )
        if status != 200:
            raise PodRunError(
                f"ServiceAccount {namespace}/{account}: HTTP {status} "
                "(create the rendered ServiceAccounts first)"
            )
        if (
            spec.get("automountServiceAccountToken") is None
            and sa.get("automountServiceAccountToken") is False
        ):
            return False
        return True

    def _node_allocatable(self, node_name: str) -> dict[str, str]:
        status, node = self.cp.api_request("GET", f"/api/v1/nodes/{quote(node_name)}")
        alloc = (node.get("status") or {}).get("allocatable") if status == 200 else None
        return {str(k): str(v) for k, v in alloc.items()} if alloc else _host_allocatable()

    # ----------------------------------------------------------------- start

    def start(
        self,
        template: Mapping[str, Any],
        *,
        namespace: str,
        pod_name: str,
        node_name: str,
        pod_ip: str = "127.0.0.1",
        host_ip: str = "127.0.0.1",
        containers: Sequence[str] | None = None,
    ) -> RunningPod:
        """Materialize the pod's volumes and start its containers.

        Args:
            template: a PodTemplateSpec (``{"metadata", "spec"}``) or a bare PodSpec.
            namespace: the pod's namespace (also where ConfigMaps, Secrets and the
                ServiceAccount are looked up).
            pod_name: the pod's name (``metadata.name``, ``HOSTNAME``, the host name).
            node_name: ``spec.nodeName``; its allocatable (if the Node exists) fills unset limits.
            pod_ip: ``status.podIP``.
            host_ip: ``status.hostIP``.
            containers: names of the (init or regular) containers to run; None: all.

        Returns:
            The running pod: init containers have completed, the others are running (their
            mount setup done).

        Raises:
            PodSpecError: the template cannot run (missing object or key, unsupported volume,
                no command, unmapped ``command[0]``...).
            PodRunError: a container's setup or an init container failed; everything started
                is stopped first.
        """
        spec: Mapping[str, Any] = template["spec"] if "spec" in template else template
        meta: Mapping[str, Any] = (template.get("metadata") or {}) if "spec" in template else {}
        running = self._pods.get(pod_name)
        if running is not None and any(p.poll() is None for p in running.processes.values()):
            raise PodRunError(f"pod {pod_name} is already running in {self.workdir}")
        init = list(spec.get("initContainers") or ())
        regular = list(spec.get("containers") or ())
        every = init + regular
        names = [str(c.get("name")) for c in every]
        if containers is not None:
            unknown = sorted(set(containers) - set(names))
            if unknown:
                raise PodSpecError(f"pod has no containers {unknown}; it has {names}")
        selected = set(names if containers is None else containers)

        account = str(spec.get("serviceAccountName") or spec.get("serviceAccount") or "default")
        pod = podenv.PodInfo(
            name=pod_name,
            namespace=namespace,
            uid=str(uuid.uuid4()),
            node_name=node_name,
            service_account=account,
            pod_ip=pod_ip,
            host_ip=host_ip,
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            annotations={str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
        )
        if spec.get("securityContext"):
            log.debug("pod %s: securityContext %s ignored", pod_name, spec["securityContext"])
        allocatable = self._node_allocatable(node_name)
        volumes = [dict(v) for v in spec.get("volumes") or ()]
        sa_volume = None
        if self._automount(spec, namespace, account):
            sa_volume = f"kube-api-access-{pod.uid[:5]}"
            volumes.append(podvolumes.service_account_volume(sa_volume, TOKEN_EXPIRATION_S))

        pod_dir = self.workdir / pod_name
        if pod_dir.exists():
            shutil.rmtree(pod_dir)
        (pod_dir / "ns").mkdir(parents=True)
        contents: dict[str, tuple[podvolumes.VolumeContent, Path]] = {}
        for volume in volumes:
            content = podvolumes.volume_content(
                volume,
                pod=pod,
                objects=self._objects,
                containers=every,
                node_allocatable=allocatable,
                mint_token=lambda aud, exp: self._mint(namespace, account, aud, exp),
            )
            name = str(volume["name"])
            if name in contents:
                raise PodSpecError(f"pod has two volumes named {name!r}")
            if content.note:
                log.info("pod %s volume %s: %s", pod_name, name, content.note)
            path = pod_dir / "volumes" / name
            podvolumes.write_volume(content, path)
            contents[name] = (content, path)

        hostname = None
        if not spec.get("hostNetwork"):
            hostname = str(spec.get("hostname") or pod_name)[:63]
        services = podenv.service_env("127.0.0.1", int(self.cp.server.rsplit(":", 1)[1]))
        running = RunningPod(pod, pod_dir, self._stop_grace_s)
        self._pods[pod_name] = running
        try:
            for c in every:
                name = str(c.get("name"))
                if name not in selected:
                    continue
                is_init = any(c is i for i in init)
                sidecar = is_init and c.get("restartPolicy") == "Always"
                launch = self._launch_spec(
                    c,
                    pod=pod,
                    every=every,
                    init=is_init,
                    sidecar=sidecar,
                    contents=contents,
                    sa_volume=sa_volume,
                    services=services,
                    allocatable=allocatable,
                    hostname=hostname,
                )
                self._launch(running, launch, hostname is not None)
                if is_init and not sidecar:
                    self._await_init(running, name)
        except BaseException:
            running.stop()
            raise
        return running

    def _launch_spec(
        self,
        c: Mapping[str, Any],
        *,
        pod: podenv.PodInfo,
        every: Sequence[Mapping[str, Any]],
        init: bool,
        sidecar: bool,
        contents: Mapping[str, tuple[podvolumes.VolumeContent, Path]],
        sa_volume: str | None,
        services: Mapping[str, str],
        allocatable: Mapping[str, str],
        hostname: str | None,
    ) -> ContainerLaunch:
        name = str(c.get("name"))
        env = {"PATH": DEFAULT_PATH, "HOME": "/tmp", "LANG": "C.UTF-8"}
        env["HOSTNAME"] = hostname if hostname is not None else socket.gethostname()
        env.update(
            podenv.container_env(
                c,
                pod=pod,
                objects=self._objects,
                all_containers=every,
                services=services,
                node_allocatable=allocatable,
            )
        )
        argv = podenv.container_argv(c, env)
        if argv[0] not in self.executables:
            raise PodSpecError(
                f"container {name}: command[0] {argv[0]!r} has no local executable "
                f"(executables maps {sorted(self.executables)})"
            )
        exe = shutil.which(self.executables[argv[0]])
        if exe is None:
            raise PodSpecError(f"container {name}: {self.executables[argv[0]]!r} is not an executable")
        exe = os.path.abspath(exe)

        requests = []
        for vm in c.get("volumeMounts") or ():
            vol = str(vm.get("name"))
            if vol not in contents:
                raise PodSpecError(f"container {name}: volumeMount names unknown volume {vol!r}")
            content, host = contents[vol]
            sub = str(vm.get("subPath") or "")
            if vm.get("subPathExpr"):
                sub = podenv.expand(str(vm["subPathExpr"]), env.get)
            source = host
            if sub:
                podvolumes.check_path(sub, f"container {name} subPath")
                source = host / sub
                if not source.exists():
                    source.mkdir(parents=True)  # the kubelet creates a missing subPath as a directory
            requests.append(
                podmounts.MountRequest(
                    target=str(vm.get("mountPath", "")),
                    volume=str(host),
                    sub_path=sub,
                    is_file=source.is_file() if sub else content.shape == "file",
                    read_only=bool(vm.get("readOnly")) or content.read_only,
                )
            )
        if sa_volume is not None and not any(
            os.path.normpath(r.target) == podvolumes.SERVICE_ACCOUNT_DIR for r in requests
        ):
            requests.append(
                podmounts.MountRequest(
                    podvolumes.SERVICE_ACCOUNT_DIR, str(contents[sa_volume][1]), read_only=True
                )
            )
        security = c.get("securityContext") or {}
        if security:
            log.debug("pod %s container %s: securityContext %s ignored", pod.name, name, security)
        working_dir = str(c.get("workingDir") or "/")
        plan = podmounts.plan_mounts(
            requests,
            kind_of=host_kind,
            resolve=os.path.realpath,
            mount_points=host_mount_points(),
            working_dir=working_dir,
            keep=(os.path.dirname(os.path.dirname(exe)), str(REPO_ROOT), sys.base_prefix, sys.prefix),
        )
        scratch = self.workdir / pod.name / "ns" / name
        script = podmounts.render_script(
            plan,
            scratch=str(scratch),
            tools=self._tools,
            working_dir=working_dir,
            env=env,
            hostname=hostname if "hostname" in self._tools else None,
        )
        return ContainerLaunch(
            name=name,
            init=init,
            sidecar=sidecar,
            argv=tuple(argv),
            executable=exe,
            env=env,
            working_dir=working_dir,
            mounts=tuple(requests),
            script=script,
            read_only_root_fs=bool(security.get("readOnlyRootFilesystem")),
        )

    def _launch(self, running: RunningPod, launch: ContainerLaunch, uts: bool) -> None:
        """Start one container and wait until its mount setup is done (it wrote ``ok``)."""
        pod_dir = running.pod_dir
        (pod_dir / "ns" / launch.name).mkdir()
        script_path = pod_dir / f"{launch.name}.sh"
        script_path.touch(mode=0o600)  # it holds the environment, secrets included
        script_path.write_text(launch.script)
        # As root a mount namespace suffices; otherwise a user namespace maps us to root in it.
        ns = ["--mount"] if os.geteuid() == 0 else ["--user", "--map-root-user", "--mount"]
        if uts and "hostname" in self._tools:
            ns.append("--uts")  # the script sets the pod's host name there
        argv = [
            self._tools["unshare"],
            *ns,
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            launch.script,
            launch.executable,
            *launch.argv[1:],
        ]
        log_file = open(running.log_path(launch.name), "wb")  # noqa: SIM115 - closed in RunningPod.stop
        ready_r, ready_w = os.pipe()
        try:
            proc = subprocess.Popen(  # noqa: S603 - argv built from the template and the executables map
                argv,
                stdin=ready_w,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={"PATH": DEFAULT_PATH},  # the container's own is set by the script's env -i
                cwd=pod_dir,
                close_fds=True,
            )
        except BaseException:
            log_file.close()
            raise
        finally:
            os.close(ready_w)
        running._track(launch, proc, log_file)
        try:
            answer = _read_until_eof(ready_r, self._setup_timeout_s)
        finally:
            os.close(ready_r)
        if answer != b"ok":
            if answer is None:
                proc.kill()
            code = proc.wait()
            raise PodRunError(
                f"pod {running.pod.name} container {launch.name}: setup failed (status {code}); "
                f"{running.log_path(launch.name)}:\n{_tail(running.log_text(launch.name))}"
            )
        log.info("pod %s container %s started, pid %d", running.pod.name, launch.name, proc.pid)

    def _await_init(self, running: RunningPod, name: str) -> None:
        try:
            code = running.wait(name, self._init_timeout_s)
        except subprocess.TimeoutExpired:
            raise PodRunError(
                f"pod {running.pod.name} init container {name} still running "
                f"after {self._init_timeout_s:.0f} s"
            ) from None
        if code != 0:
            raise PodRunError(
                f"pod {running.pod.name} init container {name} exited with status {code}; "
                f"{running.log_path(name)}:\n{_tail(running.log_text(name))}"
            )

    def stop_all(self) -> None:
        """Stop every pod this runner started."""
        for pod in self._pods.values():
            pod.stop()


def _read_until_eof(fd: int, timeout: float) -> bytes | None:
    """Everything written to pipe ``fd`` until its writers close it, or None after ``timeout`` s."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])
