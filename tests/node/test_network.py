"""Pods on the real nodes live in network namespaces of their own, with IPs from their node's CNI
bridge that this machine can reach: a GPU pod serving HTTP is fetched from here by its pod IP.
"""

from __future__ import annotations

import ipaddress
import urllib.request

import pytest

from tests.node.conftest import NodeCluster, gpu_pod

pytestmark = pytest.mark.node

SERVE = (
    'mkdir -p /tmp/www && echo "hello from $HOSTNAME" > /tmp/www/index.html && '
    "exec httpd -f -p 8080 -h /tmp/www"
)


def test_pods_get_routable_ips_from_their_nodes_bridge(cluster: NodeCluster, ns: str) -> None:
    seen: dict[str, str] = {}
    for node in cluster.nodes:
        name = f"web-{node}"
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "500"}
        cluster.create(ns, gpu_pod(name, [{"name": "web", "limits": limits, "command": SERVE}], node=node))
        pod = cluster.wait_running(ns, name)
        ip = pod["status"]["podIP"]
        assert ipaddress.ip_address(ip) in ipaddress.ip_network(cluster.nodes[node].subnet), (node, ip)
        assert pod["status"]["hostIP"] == cluster.nodes[node].host_ip
        seen[name] = ip

    def fetch(ip: str) -> str:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"http://{ip}:8080/", timeout=5) as resp:
                return str(resp.read().decode())
        except OSError:
            return ""

    for name, ip in seen.items():
        body = cluster.wait(lambda ip=ip: fetch(ip), 30, f"{name} not reachable at {ip}:8080")  # type: ignore[misc]
        assert body.strip() == f"hello from {name}"
    assert len(set(seen.values())) == len(seen)
