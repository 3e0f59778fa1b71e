"""What a cluster with real nodes runs beyond etcd, kube-apiserver and the nodes themselves.

A Helm chart installed for real needs the parts every cluster has, each the upstream binary at the
control plane's pinned version (built by ``hack/node/build.sh``):

- an apiserver address that pods can route to. Pods reach the apiserver through the ``kubernetes``
  Service, whose endpoint is the apiserver's advertised address; a loopback address cannot be one.
  ``add_api_address`` puts ``API_ADDRESS`` on a bridge of its own (``API_BRIDGE``, no ports), so the
  apiserver listens on an address that exists only on this machine, and pods route to it through
  their node's bridge;
- kube-controller-manager: Deployments, ReplicaSets, DaemonSets, disruption budgets, endpoint
  slices, garbage collection, and the ``default`` ServiceAccounts and ``kube-root-ca.crt``
  ConfigMaps every namespace needs once the ``ServiceAccount`` admission plugin runs;
- kube-proxy in iptables mode: Service addresses (``SERVICE_RANGE``) for the pods and for the
  apiserver's calls to webhooks. All nodes share this machine's network namespace, so one
  kube-proxy serves them all; its rules are removed again (``kube-proxy --cleanup``) at stop.

Every process is stopped by its own pid. Only one such cluster may run on a machine at a time:
kube-proxy's iptables chains have fixed names.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from gpuslice_dev import realnode
from gpuslice_dev.controlplane import ControlPlane

API_BRIDGE = "gslapi"
API_ADDRESS = "10.177.250.1"
"""The apiserver's address: private, on a bridge this module makes, routable from every pod bridge."""
SERVICE_RANGE = "10.176.0.0/24"
"""Service ClusterIPs (kube-apiserver's ``--service-cluster-ip-range``)."""
CLUSTER_CIDR = "10.177.0.0/16"
"""Every node's pod subnet lies in it (``realnode.POD_SUBNET``); kube-proxy's local-traffic test."""


class ClusterHostError(RuntimeError):
    """A cluster service could not be started or did not become ready."""


def add_api_address() -> None:
    """Create ``API_BRIDGE`` holding ``API_ADDRESS`` (replacing a stale one)."""
    remove_api_address()
    realnode.run_tool(["ip", "link", "add", API_BRIDGE, "type", "bridge"], "create the apiserver bridge")
    realnode.run_tool(
        ["ip", "addr", "add", f"{API_ADDRESS}/32", "dev", API_BRIDGE], "address the apiserver bridge"
    )
    realnode.run_tool(["ip", "link", "set", API_BRIDGE, "up"], "bring the apiserver bridge up")


def remove_api_address() -> None:
    """Delete ``API_BRIDGE`` if it exists."""
    subprocess.run(["ip", "link", "delete", API_BRIDGE], capture_output=True, check=False)  # noqa: S603, S607


def control_plane(workdir: Path | None = None) -> ControlPlane:
    """A control plane (not started) whose apiserver pods can reach, with service accounts on."""
    return ControlPlane(
        workdir=workdir,
        address=API_ADDRESS,
        service_cluster_ip_range=SERVICE_RANGE,
        service_accounts=True,
    )


class ClusterServices:
    """kube-controller-manager and kube-proxy for ``plane``.

    Args:
        plane: The started control plane (made by ``control_plane``).
        work: Directory for configurations and logs (created).
        bin_dir: Directory with ``kube-controller-manager`` and ``kube-proxy`` (default
            ``realnode.node_binaries()``).
    """

    def __init__(self, plane: ControlPlane, work: Path, bin_dir: Path | None = None) -> None:
        self.plane = plane
        self.work = work
        self._bin_dir = bin_dir
        self.controller_manager: realnode.Proc | None = None
        self.proxy: realnode.Proc | None = None
        self.proxy_healthz_port = 0

    @property
    def bin_dir(self) -> Path:
        """Directory with ``kube-controller-manager`` and ``kube-proxy``."""
        if self._bin_dir is None:
            self._bin_dir = realnode.node_binaries()
        return self._bin_dir

    def _spawn(self, name: str, argv: list[str]) -> realnode.Proc:
        self.work.mkdir(parents=True, exist_ok=True)
        log_path = self.work / f"{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed by Proc.stop
        try:
            popen = subprocess.Popen(  # noqa: S603 - argv built here from fixed binaries
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.work,
                start_new_session=True,
            )
        except BaseException:
            log_file.close()
            raise
        return realnode.Proc(name, popen, log_path, log_file)

    # ------------------------------------------------------------------ controller manager
    def start_controller_manager(self, timeout: float = 60.0) -> None:
        """Start kube-controller-manager; wait for the ``default`` namespace's account and CA map.

        It runs as ``system:kube-controller-manager`` (a client certificate), each controller with
        its own service account's credentials, as kubeadm sets it up.
        """
        kubeconfig = self.plane.client_kubeconfig("system:kube-controller-manager")
        argv = [
            str(self.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={realnode.free_port()}",
            f"--cert-dir={self.work / 'controller-manager-pki'}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.plane.workdir / 'sa.key'}",
            f"--root-ca-file={self.plane.serving_ca_file}",
            # Node IPAM stays off: each node's CNI bridge has its own fixed subnet.
            "--allocate-node-cidrs=false",
            "--v=2",
        ]
        self.controller_manager = self._spawn("kube-controller-manager", argv)
        self._wait(
            self.controller_manager,
            timeout,
            "the default ServiceAccount and kube-root-ca.crt",
            lambda: (
                self._exists("/api/v1/namespaces/default/serviceaccounts/default")
                and self._exists("/api/v1/namespaces/default/configmaps/kube-root-ca.crt")
            ),
        )

    # ------------------------------------------------------------------ proxy
    def proxy_config(self, node: str) -> Path:
        """kube-proxy's ``KubeProxyConfiguration``: iptables mode, sysctls and host ports left alone."""
        kubeconfig = self.plane.client_kubeconfig("system:kube-proxy")
        self.proxy_healthz_port = realnode.free_port()
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "mode": "iptables",
            "hostnameOverride": node,
            "clusterCIDR": CLUSTER_CIDR,
            "detectLocalMode": "ClusterCIDR",
            "bindAddress": "127.0.0.1",
            "healthzBindAddress": f"127.0.0.1:{self.proxy_healthz_port}",
            "metricsBindAddress": f"127.0.0.1:{realnode.free_port()}",
            # NodePorts only on the apiserver's private address, never on this machine's own.
            "nodePortAddresses": [f"{API_ADDRESS}/32"],
            "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
            # 0: leave the machine's conntrack sysctls as they are.
            "conntrack": {"maxPerCore": 0, "min": 0},
        }
        path = self.work / "kube-proxy-config.json"
        self.work.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=2))
        return path

    def start_proxy(self, node: str, timeout: float = 60.0) -> None:
        """Start kube-proxy (as user ``system:kube-proxy``) for the nodes; wait until it is healthy.

        Args:
            node: A node's name: kube-proxy reads its address from that Node object.
            timeout: Seconds to wait for its ``/healthz``.
        """
        config = self.proxy_config(node)
        self.proxy = self._spawn(
            "kube-proxy", [str(self.bin_dir / "kube-proxy"), f"--config={config}", "--v=2"]
        )
        self._wait(self.proxy, timeout, "kube-proxy /healthz", self._proxy_healthy)

    def _proxy_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.proxy_healthz_port}/healthz", timeout=2
            ) as resp:  # noqa: S310
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop_proxy(self) -> None:
        """Stop kube-proxy by pid, then remove its iptables rules."""
        proxy, self.proxy = self.proxy, None
        if proxy is None:
            return
        proxy.stop(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            subprocess.run(  # noqa: S603 - fixed binary
                [str(self.bin_dir / "kube-proxy"), "--cleanup"],
                capture_output=True,
                timeout=60,
                check=False,
            )

    # ------------------------------------------------------------------ common
    def _exists(self, path: str) -> bool:
        status, _ = self.plane.api_request("GET", path)
        return status == 200

    def _wait(self, proc: realnode.Proc, timeout: float, what: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                raise ClusterHostError(f"{proc.name} exited {proc.popen.returncode}:\n{proc.tail()}")
            if ready():
                return
            time.sleep(0.25)
        raise ClusterHostError(f"{proc.name}: no {what} after {timeout:.0f} s:\n{proc.tail()}")

    def stop(self) -> None:
        """Stop kube-proxy (removing its rules) and kube-controller-manager, by pid."""
        self.stop_proxy()
        manager, self.controller_manager = self.controller_manager, None
        if manager is not None:
            manager.stop()

    def logs(self) -> str:
        """The tails of both logs, for failure messages."""
        parts = []
        for proc in (self.controller_manager, self.proxy):
            if proc is not None:
                parts.append(f"--- {proc.name} ({proc.log_path}):\n{proc.tail()}")
        return "\n".join(parts) or "(no cluster services started)"
