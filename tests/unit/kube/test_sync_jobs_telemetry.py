"""What the watches give the cache for task affinity and telemetry age: a pod's job, a node's ``ts``."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from gpuslice.codec import keys, telemetry
from gpuslice.kube import objects, sync
from gpuslice.model import nodes, requests

pytestmark = pytest.mark.unit


def _pod(labels: dict[str, str] | None, owners: list[dict[str, Any]]) -> objects.Pod:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": "u"}
    if labels is not None:
        meta["labels"] = labels
    if owners:
        meta["ownerReferences"] = owners
    return objects.decode_stored_pod(json.dumps({"metadata": meta, "spec": {"nodeName": "n"}}).encode())


RS = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u-rs", "controller": True}
OTHER = {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u-cm"}


def test_the_stored_pod_keeps_labels_and_only_the_controller_uid() -> None:
    pod = _pod({"team": "a", "job": "train-7"}, [OTHER, RS])
    assert pod.metadata.labels == {"team": "a", "job": "train-7"}
    assert pod.metadata.owner_references == [objects.OwnerReference(uid="u-rs", controller=True)]
    assert _pod(None, [OTHER]).metadata.owner_references == []


def test_pod_job_matches_the_scheduling_side() -> None:
    pod = _pod({"job": "train-7"}, [OTHER, RS])
    assert sync.pod_job(pod) == "owner:u-rs"
    assert sync.pod_job(pod, "job") == "label:train-7"
    assert sync.pod_job(pod, "missing") == "owner:u-rs"
    assert sync.pod_job(_pod(None, [])) == ""
    # the same keys as a PodRequest under scheduling
    req = requests.PodRequest(owner="u-rs", labels=(("job", "train-7"),))
    assert req.job() == sync.pod_job(pod) and req.job("job") == sync.pod_job(pod, "job")


def test_telemetry_at() -> None:
    when = dt.datetime(2026, 11, 30, 1, 2, 3, tzinfo=dt.UTC)
    value = telemetry.encode([nodes.CardTelemetry(uuid="GPU-a", temperature_c=40.0)], when)
    assert sync.telemetry_at({keys.GPU_TELEMETRY: value}) == when.timestamp()
    assert sync.telemetry_at({}) is None
    assert sync.telemetry_at({keys.GPU_TELEMETRY: "{"}) is None
