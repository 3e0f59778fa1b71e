"""``hami.io/gpu-topology-requirement``: parsing, errors naming the field, and the pod parser."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslice.codec import errors, keys, linkreq, resources
from gpuslice.model import requests

pytestmark = pytest.mark.unit


def parse(value: str) -> requests.TopologyRequirement | None:
    return linkreq.requirement({keys.GPU_TOPOLOGY_REQUIREMENT: value})


def test_key_follows_the_pod_annotation_convention() -> None:
    assert keys.GPU_TOPOLOGY_REQUIREMENT == "hami.io/gpu-topology-requirement"


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ('{"RequireNVLink": true}', requests.TopologyRequirement(require_nvlink=True)),
        ('{"MinGPUBandwidth": 200}', requests.TopologyRequirement(min_bandwidth_gbps=200.0)),
        (
            '{"RequireNVLink": true, "MinGPUBandwidth": 31.5}',
            requests.TopologyRequirement(require_nvlink=True, min_bandwidth_gbps=31.5),
        ),
        ("{}", None),
        ('{"RequireNVLink": false, "MinGPUBandwidth": 0}', None),
        ("  ", None),
    ],
)
def test_values(value: str, want: requests.TopologyRequirement | None) -> None:
    assert parse(value) == want


def test_absent_is_no_requirement() -> None:
    assert linkreq.requirement({}) is None


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("{", "json"),
        ("[true]", "json"),
        ('{"RequireNVLink": "true"}', "RequireNVLink"),
        ('{"RequireNVLink": 1}', "RequireNVLink"),
        ('{"MinGPUBandwidth": "200"}', "MinGPUBandwidth"),
        ('{"MinGPUBandwidth": true}', "MinGPUBandwidth"),
        ('{"MinGPUBandwidth": -1}', "MinGPUBandwidth"),
        ('{"MinGPUBandwidth": 1e999}', "MinGPUBandwidth"),
        ('{"requireNVLink": true}', "requireNVLink"),
    ],
)
def test_invalid_values_name_the_field(value: str, field: str) -> None:
    with pytest.raises(errors.DecodeError) as exc:
        parse(value)
    assert exc.value.annotation == keys.GPU_TOPOLOGY_REQUIREMENT and exc.value.field == field


@given(st.booleans(), st.floats(0, 1e6, allow_nan=False))
def test_round_trip(nvlink: bool, gbps: float) -> None:
    req = requests.TopologyRequirement(require_nvlink=nvlink, min_bandwidth_gbps=gbps)
    assert parse(linkreq.encode(req)) == (req if req.active else None)


def _pod(annotations: dict[str, str], **meta: object) -> dict[str, object]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "annotations": annotations, **meta},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
    }


def test_parse_pod_reads_the_requirement_owner_and_labels() -> None:
    pod = _pod(
        {keys.GPU_TOPOLOGY_REQUIREMENT: '{"RequireNVLink": true}'},
        labels={"job": "train", "app": "x"},
        ownerReferences=[
            {"kind": "Foo", "uid": "u-other"},
            {"kind": "Job", "uid": "u-job", "controller": True},
        ],
    )
    req = resources.parse_pod(pod)
    assert req.topology == requests.TopologyRequirement(require_nvlink=True)
    assert req.owner == "u-job" and req.labels == (("app", "x"), ("job", "train"))
    assert (
        req.job() == "owner:u-job" and req.job("job") == "label:train" and req.job("missing") == "owner:u-job"
    )


def test_parse_pod_refuses_a_bad_requirement() -> None:
    with pytest.raises(errors.DecodeError, match="MinGPUBandwidth"):
        resources.parse_pod(_pod({keys.GPU_TOPOLOGY_REQUIREMENT: '{"MinGPUBandwidth": -5}'}))


def test_a_pod_without_owner_or_label_has_no_job() -> None:
    assert resources.parse_pod(_pod({})).job("job") == ""
