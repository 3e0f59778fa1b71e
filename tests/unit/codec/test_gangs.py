"""codec.gangs: a pod's gang from each source, its group objects, and bad values named."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.codec import errors, gangs, keys
from gpuslice.model import gangs as model_gangs

pytestmark = pytest.mark.unit


def pod(
    labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ml", "labels": labels or {}, "annotations": annotations or {}},
        "spec": spec,
    }


def test_no_gang() -> None:
    assert gangs.gang_of(pod()) is None


def test_scheduler_plugins_label() -> None:
    ref = gangs.gang_of(pod({keys.POD_GROUP_LABEL: "train"}))
    assert ref == model_gangs.GangRef(
        namespace="ml", name="train", source=model_gangs.SOURCE_POD_GROUP, group="train"
    )
    assert ref is not None and ref.key == "ml/train" and ref.min_member == 0


def test_gpuslice_annotations() -> None:
    ref = gangs.gang_of(
        pod(annotations={keys.GANG: "g", keys.GANG_MIN_MEMBERS: "4", keys.GANG_TIMEOUT_SECONDS: "30"})
    )
    assert ref is not None and (ref.source, ref.key, ref.min_member, ref.timeout_s) == (
        "annotation",
        "ml/g",
        4,
        30,
    )


def test_native_scheduling_group_and_workload_ref() -> None:
    ref = gangs.gang_of(pod(schedulingGroup={"podGroupName": "pg-0"}))
    assert ref is not None and (ref.source, ref.name, ref.group) == ("scheduling-group", "pg-0", "pg-0")
    ref = gangs.gang_of(pod(workloadRef={"name": "job", "podGroup": "workers", "podGroupReplicaKey": "1"}))
    assert ref is not None and (ref.source, ref.name, ref.group, ref.pod_group) == (
        "workload",
        "job/workers/1",
        "job",
        "workers",
    )


@pytest.mark.parametrize(
    ("p", "field"),
    [
        (pod(annotations={keys.GANG: "g"}), keys.GANG_MIN_MEMBERS),
        (pod(annotations={keys.GANG: "g", keys.GANG_MIN_MEMBERS: "zero"}), keys.GANG_MIN_MEMBERS),
        (pod(annotations={keys.GANG: "g", keys.GANG_MIN_MEMBERS: "0"}), keys.GANG_MIN_MEMBERS),
        (pod(annotations={keys.GANG: "g", keys.GANG_MIN_MEMBERS: "99999"}), keys.GANG_MIN_MEMBERS),
        (pod(annotations={keys.GANG_MIN_MEMBERS: "3"}), keys.GANG_MIN_MEMBERS),
        (pod(annotations={keys.GANG: "a/b", keys.GANG_MIN_MEMBERS: "3"}), keys.GANG),
        (pod({keys.POD_GROUP_LABEL: ""}), keys.POD_GROUP_LABEL),
        (pod(schedulingGroup={"podGroupName": 3}), "spec.schedulingGroup"),
        (pod(workloadRef={"name": "w"}), "spec.workloadRef"),
        (pod(schedulingGroup="x"), "pod"),
    ],
)
def test_bad_values_name_their_field(p: dict[str, Any], field: str) -> None:
    with pytest.raises(errors.DecodeError) as caught:
        gangs.gang_of(p)
    assert caught.value.annotation == field


def test_group_objects() -> None:
    assert gangs.pod_group({"spec": {"minMember": 3, "scheduleTimeoutSeconds": 20}}) == model_gangs.GroupSpec(
        min_member=3, timeout_s=20
    )
    assert gangs.native_pod_group({"spec": {"schedulingPolicy": {"gang": {"minCount": 4}}}}).min_member == 4
    assert gangs.native_pod_group({"spec": {"schedulingPolicy": {"basic": {}}}}).min_member == 1
    workload = {
        "spec": {
            "podGroups": [
                {"name": "a", "policy": {"gang": {"minCount": 2}}},
                {"name": "b", "policy": {"basic": {}}},
            ]
        }
    }
    assert gangs.workload_group(workload, "a") == model_gangs.GroupSpec(min_member=2)
    assert gangs.workload_group(workload, "b") == model_gangs.GroupSpec(min_member=1)
    assert gangs.workload_group(workload, "c") is None
    with pytest.raises(errors.DecodeError):
        gangs.pod_group({"spec": {"minMember": "many"}})
