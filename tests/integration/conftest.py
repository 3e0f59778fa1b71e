"""Integration fixtures: one real etcd + kube-apiserver per session, a namespace per test.

Async tests run on the session event loop (``loop_scope="session"``) so that the session's
clients and the tests share one loop.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from gpuslice.kube import client as kclient
from gpuslice_dev.controlplane import ControlPlane


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """etcd + kube-apiserver for the whole session (no scheduler)."""
    with ControlPlane() as plane:
        yield plane


@pytest_asyncio.fixture(loop_scope="session")
async def kube(control_plane: ControlPlane) -> AsyncIterator[kclient.KubeClient]:
    """An admin ``KubeClient`` on the session control plane (no rate limit)."""
    client = kclient.KubeClient.from_kubeconfig(control_plane.kubeconfig, qps=0)
    try:
        yield client
    finally:
        await client.aclose()


def unique(prefix: str) -> str:
    """A DNS-1123 name unique to this run."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace; deleted afterwards (it stays Terminating: no namespace controller)."""
    name = unique("it")
    status, body = control_plane.api_request(
        "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    assert status == 201, body
    yield name
    control_plane.api_request("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture
def node_name(control_plane: ControlPlane) -> Iterator[str]:
    """A unique node name; the Node (if a test created it) is deleted afterwards."""
    name = unique("node")
    yield name
    control_plane.api_request("DELETE", f"/api/v1/nodes/{name}")
