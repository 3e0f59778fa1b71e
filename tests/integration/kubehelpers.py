"""Object builders for the integration tests (plain dicts posted through the control plane)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuslice_dev.controlplane import ControlPlane

NODE_ALLOCATABLE = {"cpu": "96", "memory": "384Gi", "pods": "110"}


def pod_body(
    name: str,
    *,
    annotations: Mapping[str, str] | None = None,
    gpus: int = 0,
    node_name: str | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if gpus:
        resources = {"limits": {"nvidia.com/gpu": str(gpus)}}
    spec: dict[str, Any] = {
        "schedulerName": "gpuslice-test-none",
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": resources}],
    }
    if node_name:
        spec["nodeName"] = node_name
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def create_pod(cp: ControlPlane, namespace: str, name: str, **kwargs: Any) -> dict[str, Any]:
    status, body = cp.api_request("POST", f"/api/v1/namespaces/{namespace}/pods", pod_body(name, **kwargs))
    assert status == 201, body
    return body


def create_node(
    cp: ControlPlane,
    name: str,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    return cp.create_node(name, NODE_ALLOCATABLE, labels=labels, annotations=annotations)


def delete_pod(cp: ControlPlane, namespace: str, name: str) -> None:
    cp.api_request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}?gracePeriodSeconds=0")
