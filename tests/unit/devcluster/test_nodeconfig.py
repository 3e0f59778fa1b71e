"""The real nodes' configuration: the settings this kind of machine needs are in what is written."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gpuslice_dev import nodeconfig

pytestmark = pytest.mark.unit


def test_containerd_config_parses_and_carries_the_settings_that_matter() -> None:
    text = nodeconfig.containerd_config(
        root=Path("/n/a b/root"),
        state=Path("/n/state"),
        socket=Path("/n/containerd.sock"),
        pause_image="example.local/pause:1",
        cni_conf_dir=Path("/n/net.d"),
        runc="/usr/sbin/runc",
    )
    config = tomllib.loads(text)
    assert config["version"] == 2
    assert (config["root"], config["state"]) == ("/n/a b/root", "/n/state")
    assert config["grpc"]["address"] == "/n/containerd.sock"
    assert config["ttrpc"]["address"] == "/n/containerd.sock.ttrpc"
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "example.local/pause:1"
    assert cri["restrict_oom_score_adj"] is True  # root without CAP_SYS_RESOURCE
    assert cri["netns_mounts_under_state_dir"] is True
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"] == {"SystemdCgroup": False, "BinaryName": "/usr/sbin/runc"}
    assert cri["cni"]["bin_dir"] == nodeconfig.CNI_BIN_DIR
    assert cri["cni"]["conf_dir"] == "/n/net.d"


def test_cni_network_is_a_bridge_on_the_nodes_subnet() -> None:
    network = nodeconfig.cni_network(
        name="gpuslice-n",
        bridge="gsl3",
        subnet="10.177.3.0/24",
        gateway="10.177.3.1",
        ipam_dir=Path("/n/ipam"),
    )
    bridge, portmap = network["plugins"]
    assert (bridge["type"], bridge["bridge"], bridge["isGateway"]) == ("bridge", "gsl3", True)
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.177.3.0/24", "gateway": "10.177.3.1"}]]
    assert bridge["ipam"]["dataDir"] == "/n/ipam"
    assert portmap["type"] == "portmap"
    assert nodeconfig.cni_loopback()["type"] == "loopback"


def test_kubelet_config_uses_cgroupfs_under_its_own_root_and_the_cluster_ca() -> None:
    config = nodeconfig.kubelet_config(
        address="10.177.3.1",
        port=10250,
        healthz_port=10248,
        cgroup_root="/gpuslice/n",
        runtime_socket=Path("/n/containerd.sock"),
        client_ca=Path("/cp/ca.crt"),
        pod_logs=Path("/n/pod-logs"),
    )
    assert config["kind"] == "KubeletConfiguration"
    assert (config["cgroupDriver"], config["cgroupRoot"]) == ("cgroupfs", "/gpuslice/n")
    assert config["failCgroupV1"] is False and config["failSwapOn"] is False
    assert config["containerRuntimeEndpoint"] == "unix:///n/containerd.sock"
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authentication"]["x509"]["clientCAFile"] == "/cp/ca.crt"
    assert (config["address"], config["healthzBindAddress"], config["readOnlyPort"]) == (
        "10.177.3.1",
        "127.0.0.1",
        0,
    )
    assert config["imageGCHighThresholdPercent"] == 100  # local images cannot be pulled again
