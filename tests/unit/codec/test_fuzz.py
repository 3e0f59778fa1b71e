"""Fuzz-style properties: whatever text reaches a decoder, the only failure is a DecodeError naming
the annotation (or resource) that was wrong."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslice.codec import (
    errors,
    handshake,
    keys,
    locks,
    node_inventory,
    pod_devices,
    pod_selectors,
    quantity,
    registrations,
    resources,
    telemetry,
    topology,
)
from gpuslice.model import config
from tests.unit.codec import strategies

pytestmark = pytest.mark.unit

NOW = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
# Raw text, JSON documents, and text built from the formats' own separators and words.
format_words = st.sampled_from(
    [
        "GPU-a",
        "NVIDIA",
        ",",
        ":",
        ";",
        "[",
        "]",
        "{",
        "}",
        '"',
        "true",
        "10",
        "-1",
        "1e3",
        "Gi",
        "Requesting_",
        "_",
        " ",
    ]
)
texts = st.one_of(
    st.text(max_size=60),
    json_values.map(json.dumps),
    st.lists(format_words, max_size=20).map("".join),
)

DECODERS: dict[str, tuple[str, Callable[[str], object]]] = {
    "registration": (keys.NODE_REGISTER, registrations.decode),
    "registration-json": (keys.NODE_REGISTER, registrations.decode_json),
    "registration-legacy": (keys.NODE_REGISTER, registrations.decode_legacy),
    "pair-scores": (keys.NODE_PAIR_SCORE, topology.decode_pair_scores),
    "topology": (keys.GPU_TOPOLOGY, topology.decode_topology),
    "telemetry": (keys.GPU_TELEMETRY, telemetry.decode),
    "pod-devices": (keys.DEVICES_ALLOCATED, pod_devices.decode),
    "pod-devices-aligned": (keys.DEVICES_ALLOCATED, lambda v: pod_devices.decode_for_containers(v, 2)),
    "lock": (keys.NODE_LOCK, locks.decode),
    "quantity": ("nvidia.com/gpumem", lambda v: quantity.parse(v, "nvidia.com/gpumem")),
    "numa-hint": (keys.NUMA_HINT, lambda v: pod_selectors.selectors({keys.NUMA_HINT: v})),
    "scoring-weights": (
        keys.DEVICE_SCORING_WEIGHTS,
        lambda v: pod_selectors.scoring_weights({keys.DEVICE_SCORING_WEIGHTS: v}),
    ),
    "quota": ("limits.nvidia.com/gpumem", lambda v: resources.parse_quota({"limits.nvidia.com/gpumem": v})),
    "gpu-count": (
        "nvidia.com/gpu",
        lambda v: resources.generate_request({"nvidia.com/gpu": v}, {}, config.RequestConfig()),
    ),
    "gpumem": (
        "nvidia.com/gpumem",
        lambda v: resources.webhook_request(
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": v}, {}, config.RequestConfig()
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(DECODERS))
@strategies.RELAXED
@given(value=texts)
def test_decoders_raise_only_decode_error(name: str, value: str) -> None:
    annotation, decoder = DECODERS[name]
    try:
        decoder(value)
    except errors.DecodeError as err:
        assert err.annotation == annotation
        assert err.detail and err.field


NODE_KEYS = [
    keys.NODE_REGISTER,
    keys.NODE_PAIR_SCORE,
    keys.GPU_TOPOLOGY,
    keys.GPU_TELEMETRY,
    keys.DEVICE_CORDON,
]
VALID_REGISTER = '[{"id":"GPU-a","count":10,"devmem":1000,"devcore":100,"type":"NVIDIA-T4","health":true}]'


@strategies.RELAXED
@given(st.dictionaries(st.sampled_from(NODE_KEYS), texts, max_size=5), st.booleans())
def test_node_decode_raises_only_decode_error(annotations: dict[str, str], valid_register: bool) -> None:
    if valid_register:
        annotations[keys.NODE_REGISTER] = VALID_REGISTER
    try:
        inv = node_inventory.decode_node("n", annotations)
    except errors.DecodeError as err:
        assert err.annotation in (keys.NODE_REGISTER, keys.NODE_PAIR_SCORE, keys.GPU_TOPOLOGY)
    else:
        assert inv.devices


@strategies.RELAXED
@given(st.text(max_size=40), st.integers(0, 16), st.integers(0, 16))
def test_health_checks_never_raise(value: str, allocatable: int, reported: int) -> None:
    handshake.handshake_health(value, allocatable, NOW)
    handshake.nvidia_health(allocatable, reported, value, value, None, NOW)


@strategies.RELAXED
@given(st.text(max_size=40), st.text(max_size=10), st.text(max_size=10))
def test_lock_assessment_never_raises(value: str, namespace: str, name: str) -> None:
    state = locks.assess(value, namespace, name, NOW)
    assert (state.lock is None) == (state.verdict is locks.Verdict.MALFORMED)
    assert isinstance(locks.is_owner(value, namespace, name), bool)


resource_names = st.sampled_from(
    [
        "nvidia.com/gpu",
        "nvidia.com/gpumem",
        "nvidia.com/gpumem-percentage",
        "nvidia.com/gpucores",
        "cpu",
        "memory",
    ]
)
pod_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6) | resource_names,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "metadata",
                    "spec",
                    "annotations",
                    "containers",
                    "initContainers",
                    "resources",
                    "limits",
                    "requests",
                ]
            )
            | resource_names
            | st.sampled_from([keys.NUMA_HINT, keys.USE_GPU_TYPE, keys.NUMA_BIND]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=25,
)


@strategies.RELAXED
@given(st.dictionaries(st.sampled_from(["metadata", "spec"]), pod_like, max_size=2))
def test_parse_pod_raises_only_decode_error(pod: dict[str, Any]) -> None:
    try:
        resources.parse_pod(pod)
    except errors.DecodeError as err:
        assert err.detail
    try:
        pod_devices.allocation_from_pod(pod)
    except errors.DecodeError as err:
        assert err.detail
