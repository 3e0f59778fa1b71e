"""Mutual TLS end to end: ``gpuslice serve --tls-client-ca`` and a kube-scheduler presenting a client
certificate, configured by ``gpuslice render scheduler-config --ca-file --client-cert --client-key``.

A second extender (its own Lease) and a second kube-scheduler (its own profile name, so the
session's scheduler never picks these pods) run next to the session's pair, on the same
apiserver and fake GPU nodes. The extender also serves ``/metrics`` and the probes over plain
HTTP on ``--metrics-listen``, which is how ``Extender.start`` waits for it to become ready.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.codec import keys
from gpuslice_dev import controlplane, devcluster
from tests import pki
from tests.e2e.conftest import NODES, Cluster, inventory

pytestmark = pytest.mark.e2e

MTLS_SCHEDULER = "gpuslice-mtls-scheduler"


@contextlib.contextmanager
def kube_scheduler(cluster: Cluster, config_yaml: str, work: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A second kube-scheduler process with this configuration, stopped by its pid on exit."""
    config = work / "kube-scheduler.yaml"
    config.write_text(config_yaml)
    port = devcluster.free_port()
    log_path = work / "kube-scheduler.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(  # noqa: S603 - the pinned binary
            [
                str(controlplane.binaries_dir() / "kube-scheduler"),
                f"--config={config}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={work / 'scheduler-pki'}",
                f"--authentication-kubeconfig={cluster.cp.kubeconfig}",
                f"--authorization-kubeconfig={cluster.cp.kubeconfig}",
                "-v=2",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while devcluster.http_status(f"https://127.0.0.1:{port}/healthz") != 200:
                assert proc.poll() is None, f"kube-scheduler exited:\n{log_path.read_text()[-3000:]}"
                assert time.monotonic() < deadline, (
                    f"kube-scheduler not healthy:\n{log_path.read_text()[-3000:]}"
                )
                time.sleep(0.2)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def plain_get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback URL
        return int(resp.status), resp.read().decode()


def requests_served(metrics_text: str, verb: str) -> float:
    """``gpuslice_extender_requests_total{verb, code="200"}`` from a /metrics page."""
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "gpuslice_extender_requests_total" and sample.labels == {
                "verb": verb,
                "code": "200",
            }:
                return float(sample.value)
    return 0.0


@pytest.fixture
def certs(tmp_path: Path) -> pki.Pki:
    return pki.make(tmp_path / "pki")


@pytest.fixture
def mtls_extender(e2e_cluster: Cluster, certs: pki.Pki, tmp_path: Path) -> Iterator[devcluster.Extender]:
    ext = devcluster.Extender(
        e2e_cluster.cp.kubeconfig,
        tmp_path / "gpuslice-mtls.log",
        extra_args=["-v", "4", "--lease-name", "gpuslice-mtls-extender", "--scheduler-name", MTLS_SCHEDULER],
        tls=(certs.server_cert, certs.server_key),
        client_ca=certs.ca,
    )
    ext.start()  # ready through the plain metrics listener: the main port wants a certificate
    try:
        yield ext
    finally:
        ext.stop()


def test_client_without_certificate_is_refused_in_the_handshake(
    mtls_extender: devcluster.Extender, certs: pki.Pki
) -> None:
    port = mtls_extender.port
    client = (certs.client_cert, certs.client_key)
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        assert pki.tls_get(port, certs.ca, client, version=version).startswith(b"HTTP/1.1 200 ")
    for who in (None, (certs.stranger_cert, certs.stranger_key)):  # none, or one from another CA
        with pytest.raises(ssl.SSLError):
            pki.tls_get(port, certs.ca, who, version=ssl.TLSVersion.TLSv1_2)
        # TLS 1.3: the client's half of the handshake ends before the server checks its
        # certificate; the server then closes the connection without a byte of HTTP.
        assert pki.tls_get(port, certs.ca, who) == b""


def test_metrics_over_plain_http_while_the_main_port_wants_a_certificate(
    mtls_extender: devcluster.Extender, certs: pki.Pki
) -> None:
    assert mtls_extender.metrics_port is not None
    base = mtls_extender.probe_url
    assert base == f"http://127.0.0.1:{mtls_extender.metrics_port}"
    status, text = plain_get(base + "/metrics")
    assert status == 200 and "gpuslice_cache_synced 1.0" in text  # start() waited for /readyz there
    assert plain_get(base + "/healthz") == (200, "ok") and plain_get(base + "/readyz") == (200, "ok")
    # The main port: /metrics only with a client certificate, and no plain HTTP at all.
    assert pki.tls_get(mtls_extender.port, certs.ca, None, "/metrics") == b""
    answer = pki.tls_get(mtls_extender.port, certs.ca, (certs.client_cert, certs.client_key), "/metrics")
    assert answer.startswith(b"HTTP/1.1 200 ") and b"gpuslice_leader" in answer
    with pytest.raises(OSError):
        plain_get(f"http://127.0.0.1:{mtls_extender.port}/metrics")


def test_kube_scheduler_schedules_through_the_mtls_extender(
    e2e_cluster: Cluster, mtls_extender: devcluster.Extender, certs: pki.Pki, tmp_path: Path
) -> None:
    url = f"https://127.0.0.1:{mtls_extender.port}"
    config_yaml = devcluster.render_scheduler_config(
        url,
        e2e_cluster.cp.kubeconfig,
        MTLS_SCHEDULER,
        ca_file=certs.ca,
        client=(certs.client_cert, certs.client_key),
    )
    assert f"caFile: {certs.ca}" in config_yaml and f"certFile: {certs.client_cert}" in config_yaml
    assert "insecure" not in config_yaml
    ns = e2e_cluster.namespace("mtls")
    name = f"mtls-{uuid.uuid4().hex[:6]}"
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "schedulerName": MTLS_SCHEDULER,
            "containers": [
                {
                    "name": "c",
                    "image": "pause",
                    "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}},
                }
            ],
        },
    }
    with kube_scheduler(e2e_cluster, config_yaml, tmp_path):
        status, obj = e2e_cluster.cp.api_request("POST", f"/api/v1/namespaces/{ns}/pods", body)
        assert status == 201, obj
        pod = e2e_cluster.wait_bound(ns, name)
    node = pod["spec"]["nodeName"]
    assert node in NODES
    ann = pod["metadata"]["annotations"]
    assert ann[keys.VGPU_NODE] == node  # gpuslice's bind wrote the HAMi contract
    assert any(d.uuid in ann[keys.DEVICES_ALLOCATED] for d in inventory(node))
    # It was this extender, over mTLS, that filtered and bound the pod.
    _, text = plain_get(mtls_extender.probe_url + "/metrics")
    assert requests_served(text, "filter") >= 1 and requests_served(text, "bind") >= 1
    e2e_cluster.delete_pod(ns, name)


def test_sigterm_stops_both_listeners(e2e_cluster: Cluster, certs: pki.Pki, tmp_path: Path) -> None:
    ext = devcluster.Extender(
        e2e_cluster.cp.kubeconfig,
        tmp_path / "gpuslice-stop.log",
        extra_args=["--lease-name", "gpuslice-mtls-stop"],
        tls=(certs.server_cert, certs.server_key),
        client_ca=certs.ca,
    ).start()
    assert ext.metrics_port is not None
    ext.stop()  # SIGTERM
    assert ext.returncode == 0, ext.tail()
    for port in (ext.port, ext.metrics_port):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_metrics_port_taken_exits_non_zero(e2e_cluster: Cluster, certs: pki.Pki, tmp_path: Path) -> None:
    ext = devcluster.Extender(
        e2e_cluster.cp.kubeconfig,
        tmp_path / "gpuslice-taken.log",
        extra_args=["--lease-name", "gpuslice-mtls-taken"],
        tls=(certs.server_cert, certs.server_key),
        client_ca=certs.ca,
    )
    assert ext.metrics_port is not None
    try:
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", ext.metrics_port))
            holder.listen()
            ext.spawn()
            code = ext.wait_exit(60)
    finally:
        ext.stop()
    assert code is not None and code != 0, ext.tail()
    assert "a listener failed" in ext.tail()
