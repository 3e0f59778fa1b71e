"""Gangs through a stock kube-scheduler: all members bound together, or none (docs/gangs.md)."""

from __future__ import annotations

import json
import pathlib
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest
import yaml

from gpuslice.codec import keys
from tests.e2e import gpuaudit
from tests.e2e.conftest import SCHEDULER, Cluster

pytestmark = pytest.mark.e2e

CRD = pathlib.Path(__file__).parent / "manifests" / "podgroup-crd.yaml"
PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1"


def member(
    cluster: Cluster,
    ns: str,
    name: str,
    limits: dict[str, str],
    *,
    gang: str = "",
    minimum: int = 0,
    pod_group: str = "",
) -> None:
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if gang:
        meta["annotations"] = {keys.GANG: gang, keys.GANG_MIN_MEMBERS: str(minimum)}
    if pod_group:
        meta["labels"] = {keys.POD_GROUP_LABEL: pod_group}
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "schedulerName": SCHEDULER,
            "containers": [{"name": "c", "image": "pause", "resources": {"limits": dict(limits)}}],
        },
    }
    status, obj = cluster.cp.api_request("POST", f"/api/v1/namespaces/{ns}/pods", body)
    assert status == 201, obj


def bound(cluster: Cluster, ns: str, names: list[str]) -> dict[str, str]:
    """Pod name -> node, for the named pods bound now."""
    out = {}
    for n in names:
        node = cluster.pod(ns, n)["spec"].get("nodeName")
        if node:
            out[n] = node
    return out


def get_json(cluster: Cluster, path: str) -> Any:
    with urllib.request.urlopen(f"{cluster.ext.url}{path}", timeout=10) as resp:
        return json.loads(resp.read())


def audit_clean(cluster: Cluster) -> None:
    status, body = cluster.cp.api_request("GET", "/api/v1/nodes")
    assert status == 200
    report = gpuaudit.audit(body["items"], cluster.all_pods())
    assert report.problems == []


def delete_all(cluster: Cluster, ns: str, names: list[str]) -> None:
    for n in names:
        cluster.delete_pod(ns, n)


def test_a_gang_is_bound_whole_and_each_card_once(e2e_cluster: Cluster) -> None:
    ns = e2e_cluster.namespace("gang")
    names = [f"w{i}" for i in range(6)]
    for n in names:
        member(
            e2e_cluster, ns, n, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40000"}, gang="six", minimum=6
        )
    e2e_cluster.wait(lambda: len(bound(e2e_cluster, ns, names)) == 6, 60, "gang of 6 not bound")
    audit_clean(e2e_cluster)
    delete_all(e2e_cluster, ns, names)


def test_members_wait_at_the_barrier_until_the_last_one_comes(e2e_cluster: Cluster) -> None:
    ns = e2e_cluster.namespace("gang")
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}
    for n in ("a", "b"):
        member(e2e_cluster, ns, n, limits, gang="late", minimum=3)
    time.sleep(4.0)  # both filtered and at bind by now: the barrier holds them
    assert bound(e2e_cluster, ns, ["a", "b"]) == {}
    # explain and the cluster view show the plan and who waits
    doc = get_json(e2e_cluster, "/explain?" + urllib.parse.urlencode({"pod": f"{ns}/a"}))
    gang = doc["gang"]
    assert gang["gang"] == f"{ns}/late" and gang["minimum"] == 3
    assert sorted(gang["waiting"]) == [f"{ns}/a", f"{ns}/b"]
    states = sorted(slot["state"] for slot in gang["plan"]["slots"])
    assert states == ["planned", "waiting", "waiting"]  # c is not created yet: its slot is held
    view = get_json(e2e_cluster, "/ui/state")
    assert view["gangs_status"] == "on" and [g["gang"] for g in view["gangs"]] == [f"{ns}/late"]
    member(e2e_cluster, ns, "c", limits, gang="late", minimum=3)
    e2e_cluster.wait(lambda: len(bound(e2e_cluster, ns, ["a", "b", "c"])) == 3, 60, "late gang not bound")
    audit_clean(e2e_cluster)
    delete_all(e2e_cluster, ns, ["a", "b", "c"])


def test_a_gang_that_cannot_fit_binds_nobody_and_says_why(e2e_cluster: Cluster) -> None:
    ns = e2e_cluster.namespace("gang")
    names = [f"big{i}" for i in range(12)]  # 12 whole cards; the cluster has 10
    for n in names:
        member(e2e_cluster, ns, n, {"nvidia.com/gpu": "1"}, gang="too-big", minimum=12)
    event = e2e_cluster.wait_event(ns, "big0", "FilteringFailed", 60)
    assert "GangUnschedulable" in event["message"] and f"gang {ns}/too-big (minimum 12)" in event["message"]
    assert "members fit" in event["message"]
    time.sleep(3.0)
    assert bound(e2e_cluster, ns, names) == {}
    # a pod outside the gang still gets a card: the failed plan held nothing
    e2e_cluster.create_pod(ns, "solo", {"nvidia.com/gpu": "1"})
    e2e_cluster.wait_bound(ns, "solo", 60)
    delete_all(e2e_cluster, ns, [*names, "solo"])


def test_two_members_on_one_node_are_both_bound_at_once(e2e_cluster: Cluster) -> None:
    """HAMi's node lock admits one pod per node until its Allocate; two members sharing a node used
    to leave one Pending for the lock's expiry (5 min). Here both bind within seconds."""
    ns = e2e_cluster.namespace("gang")
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "10"}
    started = time.monotonic()
    for n in ("p0", "p1"):
        member(e2e_cluster, ns, n, limits, gang="pair", minimum=2)
    e2e_cluster.wait(lambda: len(bound(e2e_cluster, ns, ["p0", "p1"])) == 2, 60, "pair not bound")
    where = bound(e2e_cluster, ns, ["p0", "p1"])
    assert len(set(where.values())) == 1  # binpack put both on one node
    assert time.monotonic() - started < 30
    audit_clean(e2e_cluster)
    delete_all(e2e_cluster, ns, ["p0", "p1"])


def test_a_scheduler_plugins_pod_group_sets_the_minimum(e2e_cluster: Cluster) -> None:
    cp = e2e_cluster.cp
    crd = yaml.safe_load(CRD.read_text())
    status, body = cp.api_request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    assert status in (201, 409), body
    e2e_cluster.wait(lambda: cp.api_request("GET", f"{PODGROUPS}/podgroups")[0] == 200, 30, "CRD not served")
    ns = e2e_cluster.namespace("gang")
    pg = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "trio", "namespace": ns},
        "spec": {"minMember": 3},
    }
    status, body = cp.api_request("POST", f"{PODGROUPS}/namespaces/{ns}/podgroups", pg)
    assert status == 201, body
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000"}
    for n in ("x", "y"):
        member(e2e_cluster, ns, n, limits, pod_group="trio")
    time.sleep(4.0)
    assert bound(e2e_cluster, ns, ["x", "y"]) == {}  # two of three: held at the barrier (or not planned)
    member(e2e_cluster, ns, "z", limits, pod_group="trio")
    # the extender looks the PodGroup API up again within its discovery period
    e2e_cluster.wait(lambda: len(bound(e2e_cluster, ns, ["x", "y", "z"])) == 3, 90, "PodGroup gang not bound")
    audit_clean(e2e_cluster)
    delete_all(e2e_cluster, ns, ["x", "y", "z"])
