"""Pods, reviews and an RFC 6902 ``add`` applier for the webhook's unit tests."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

GPU, MEM, PCT, CORES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
)


def ctr(
    name: str = "c",
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": "pause", **extra}
    res: dict[str, Any] = {}
    if limits is not None:
        res["limits"] = dict(limits)
    if requests is not None:
        res["requests"] = dict(requests)
    if res:
        out["resources"] = res
    return out


def defaulted(c: dict[str, Any]) -> dict[str, Any]:
    """The container as the apiserver hands it to admission: requests default to limits."""
    out = copy.deepcopy(c)
    res = out.get("resources") or {}
    if res.get("limits"):
        res.setdefault("requests", {})
        for k, v in res["limits"].items():
            res["requests"].setdefault(k, v)
    return out


def pod(
    *containers: dict[str, Any],
    init: tuple[dict[str, Any], ...] = (),
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    scheduler: str | None = None,
    node_name: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if annotations is not None:
        meta["annotations"] = annotations
    if labels is not None:
        meta["labels"] = labels
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if node_name is not None:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def review(
    obj: Any,
    *,
    uid: str = "uid-1",
    operation: str = "CREATE",
    version: str = "admission.k8s.io/v1",
    kind: str = "Pod",
) -> dict[str, Any]:
    return {
        "apiVersion": version,
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": operation,
            "namespace": "ns",
            "name": "p",
            "object": obj,
            "userInfo": {"username": "admin"},
            "dryRun": False,
        },
    }


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def apply_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """Apply RFC 6902 ``add`` operations (all the webhook emits) to a copy of ``doc``."""
    out = copy.deepcopy(doc)
    for op in ops:
        assert op["op"] == "add", op
        assert op["path"].startswith("/"), op
        tokens = [_unescape(t) for t in op["path"][1:].split("/")]
        parent = out
        for t in tokens[:-1]:
            parent = parent[int(t)] if isinstance(parent, list) else parent[t]
        last = tokens[-1]
        if isinstance(parent, list):
            parent.insert(len(parent) if last == "-" else int(last), copy.deepcopy(op["value"]))
        else:
            assert isinstance(parent, dict), (op, parent)
            parent[last] = copy.deepcopy(op["value"])
    return out


def decode_patch(text: str) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(text))
    return ops
