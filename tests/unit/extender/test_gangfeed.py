"""extender.gangfeed: pod events and group objects into the gang directory."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpuslice.codec import keys
from gpuslice.extender import gangfeed, metrics
from gpuslice.extender.binding import barrier as barriers
from gpuslice.framework import gangs, logs, nominations, profile
from gpuslice.kube import informer, objects
from gpuslice.model import config as model_config
from gpuslice.model import gangs as model_gangs

pytestmark = pytest.mark.unit


def feed() -> gangfeed.GangFeed:
    directory = gangs.Directory()
    plans = gangs.Gangs(profile.Profile.build("binpack", "binpack"), directory, nominations.Nominator())
    barrier = barriers.Barrier(plans, time.time, time.monotonic, 1.0)
    kube: Any = None  # on_pod and the group handlers never call the API
    return gangfeed.GangFeed(
        kube, directory, plans, barrier, model_config.DEFAULT_REQUEST_CONFIG, logs.Log(0), metrics.Metrics()
    )


def pod(name: str, annotations: dict[str, str], node: str = "", gpu: bool = True) -> objects.Pod:
    limits = {"nvidia.com/gpu": "1"} if gpu else {}
    return objects.Pod(
        metadata=objects.ObjectMeta(name=name, namespace="ml", uid=f"u-{name}", annotations=annotations),
        spec=objects.PodSpec(
            node_name=node,
            containers=[objects.Container(name="c", resources=objects.ResourceRequirements(limits=limits))],
        ),
    )


GANG = {keys.GANG: "train", keys.GANG_MIN_MEMBERS: "3"}


def test_members_come_and_go_with_their_pods() -> None:
    f = feed()
    f.on_pod("ml/a", pod("a", GANG), False)
    f.on_pod("ml/b", pod("b", GANG, node="n1"), False)
    f.on_pod("ml/c", pod("c", GANG, gpu=False), False)
    f.on_pod("ml/x", pod("x", {}), False)
    members = {m.key: m for m in f.directory.members("ml/train")}
    assert set(members) == {"ml/a", "ml/b", "ml/c"}
    assert members["ml/b"].node == "n1" and members["ml/a"].request is not None
    c = members["ml/c"].request
    assert c is not None and not c.wants_gpu
    assert f.directory.has_uid("u-a") and not f.directory.has_uid("u-x")
    f.on_pod("ml/a", pod("a", GANG), True)
    assert not f.directory.has_uid("u-a")
    f.on_pod("ml/b", pod("b", {}), False)  # left the gang
    assert [m.key for m in f.directory.members("ml/train")] == ["ml/c"]


def test_a_pod_with_invalid_gang_fields_is_no_member() -> None:
    f = feed()
    f.on_pod("ml/a", pod("a", {keys.GANG: "train"}), False)  # no minimum
    assert f.directory.members("ml/train") == ()


def group_event(
    name: str, spec: dict[str, Any], kind: informer.EventType
) -> informer.Event[objects.GroupObject]:
    return informer.Event(
        kind, objects.GroupObject(metadata=objects.ObjectMeta(name=name, namespace="ml"), spec=spec)
    )


def test_group_objects_set_and_clear_the_minimum() -> None:
    f = feed()
    ref = model_gangs.GangRef(namespace="ml", name="pg", source=model_gangs.SOURCE_POD_GROUP, group="pg")
    handle = f._on_group(model_gangs.SOURCE_POD_GROUP)
    handle(group_event("pg", {"minMember": 4, "scheduleTimeoutSeconds": 30}, informer.EventType.ADDED))
    assert f.directory.spec(ref) == model_gangs.GroupSpec(min_member=4, timeout_s=30)
    handle(group_event("pg", {"minMember": "lots"}, informer.EventType.MODIFIED))  # not understood: dropped
    assert f.directory.spec(ref) is None
    handle(group_event("pg", {"minMember": 2}, informer.EventType.MODIFIED))
    handle(group_event("pg", {}, informer.EventType.DELETED))
    assert f.directory.spec(ref) is None
    workload = f._on_group(model_gangs.SOURCE_WORKLOAD)
    spec = {"podGroups": [{"name": "workers", "policy": {"gang": {"minCount": 8}}}]}
    workload(group_event("job", spec, informer.EventType.ADDED))
    wref = model_gangs.GangRef(
        namespace="ml",
        name="job/workers",
        source=model_gangs.SOURCE_WORKLOAD,
        group="job",
        pod_group="workers",
    )
    assert f.directory.spec(wref) == model_gangs.GroupSpec(min_member=8)


def test_plan_counts_reach_the_metrics() -> None:
    f = feed()
    f.plans.planned, f.plans.refused, f.plans.released = 3, 1, 2
    counted = {"planned": 0, "refused": 0, "released": 0}
    f.export(counted)
    f.plans.planned = 4
    f.export(counted)
    sample = f.metrics.registry.get_sample_value
    assert sample("gpuslice_gang_plans_total", {"outcome": "planned"}) == 4
    assert sample("gpuslice_gang_plans_total", {"outcome": "refused"}) == 1
    assert sample("gpuslice_gang_plans_total", {"outcome": "released"}) == 2
    assert sample("gpuslice_gang_plans_held", {}) == 0
