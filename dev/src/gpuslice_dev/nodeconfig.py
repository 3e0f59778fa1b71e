"""What a real test node is configured with: containerd's config, the CNI network, kubelet's config.

Pure renderers (``devcluster.realnode`` writes their output into the node's directory), so each
setting that matters on this kind of machine is written and tested in one place:

- containerd (``config.toml`` version 2, containerd 1.6's CRI plugin
  https://github.com/containerd/containerd/blob/release/1.6/docs/cri/config.md): the node's own
  ``root``, ``state`` and sockets; ``sandbox_image`` naming the locally built pause image (no
  registry is reachable); ``restrict_oom_score_adj`` (root here may lack ``CAP_SYS_RESOURCE``, and
  the sandbox asks for ``oom_score_adj -998``: runc then fails with "can't get final child's PID
  from pipe"); ``netns_mounts_under_state_dir`` (pod network namespaces under the node's state
  dir, undone with it); runc with cgroupfs; the CNI binaries of Debian's package;
- CNI (https://www.cni.dev/plugins/current/): ``bridge`` with ``host-local`` IPAM on the node's own
  subnet, then ``portmap``; and ``loopback``;
- kubelet (``KubeletConfiguration`` v1beta1,
  https://kubernetes.io/docs/reference/config-api/kubelet-config.v1beta1/): ``cgroupfs`` under a
  cgroup root of the node's own (two kubelets must not share ``/kubepods``), cgroup v1 and swap
  tolerated, x509 client authentication against the cluster CA, image GC off (the images cannot be
  pulled again), eviction thresholds low enough for a shared development disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CNI_BIN_DIR = "/usr/lib/cni"
"""Where Debian's ``containernetworking-plugins`` installs the plugins."""


def _toml(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's for the characters paths hold)."""
    return json.dumps(value)


def containerd_config(
    *, root: Path, state: Path, socket: Path, pause_image: str, cni_conf_dir: Path, runc: str
) -> str:
    """Containerd's ``config.toml`` for one node."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = {_toml(str(root))}
state = {_toml(str(state))}
oom_score = 0

[grpc]
  address = {_toml(str(socket))}

[ttrpc]
  address = {_toml(str(socket) + ".ttrpc")}

[debug]
  level = "warn"

[metrics]
  address = ""

[{cri}]
  sandbox_image = {_toml(pause_image)}
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  max_container_log_line_size = 16384

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = {_toml(runc)}

[{cri}.cni]
  bin_dir = {_toml(CNI_BIN_DIR)}
  conf_dir = {_toml(str(cni_conf_dir))}
  max_conf_num = 1
"""


def cni_network(*, name: str, bridge: str, subnet: str, gateway: str, ipam_dir: Path) -> dict[str, Any]:
    """The pods' network: a bridge with host-local addresses from ``subnet``, then portmap."""
    return {
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(ipam_dir),
                    "ranges": [[{"subnet": subnet, "gateway": gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def cni_loopback() -> dict[str, Any]:
    """The loopback network every pod also gets."""
    return {"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}


def kubelet_config(
    *,
    address: str,
    port: int,
    healthz_port: int,
    cgroup_root: str,
    runtime_socket: Path,
    client_ca: Path,
    pod_logs: Path,
) -> dict[str, Any]:
    """Kubelet's ``KubeletConfiguration`` for one node (module docstring)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "failSwapOn": False,
        "failCgroupV1": False,
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "imageServiceEndpoint": f"unix://{runtime_socket}",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(client_ca)},
        },
        # Served on the node's bridge address only, to clients the cluster CA signed (the apiserver).
        "authorization": {"mode": "AlwaysAllow"},
        "evictionHard": {
            "memory.available": "64Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "resolvConf": "",
        "registerNode": True,
        "maxPods": 110,
        "podLogsDir": str(pod_logs),
        "syncFrequency": "10s",
        "nodeStatusUpdateFrequency": "4s",
        "nodeStatusReportFrequency": "10s",
        "serializeImagePulls": False,
        "protectKernelDefaults": False,
        "localStorageCapacityIsolation": True,
        "shutdownGracePeriod": "0s",
    }
