from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.codec import errors, resources
from gpuslice.model import config as model_config
from gpuslice.webhook import mutate, review
from tests.unit.webhook.builders import CORES, GPU, MEM, PCT, apply_patch, ctr, defaulted, pod

pytestmark = pytest.mark.unit

OPTS = mutate.Options(scheduler_name="gpuslice-scheduler")
SCHED = {"op": "add", "path": "/spec/schedulerName", "value": "gpuslice-scheduler"}


def lim(key: str, value: str, field: str = "containers", i: int = 0, where: str = "limits") -> dict[str, Any]:
    return {
        "op": "add",
        "path": f"/spec/{field}/{i}/resources/{where}/{key.replace('/', '~1')}",
        "value": value,
    }


def both(key: str, value: str, field: str = "containers", i: int = 0) -> list[dict[str, Any]]:
    return [lim(key, value, field, i), lim(key, value, field, i, "requests")]


def ops(decision: review.Decision) -> list[dict[str, Any]]:
    return [msgspec.to_builtins(op) for op in decision.patch]


# (id, container as created by the user, expected patch after the schedulerName operation)
CONTAINER_CASES: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = [
    ("bare-gpu-is-exclusive", ctr(limits={GPU: "1"}), both(CORES, "100")),
    ("two-bare-gpus", ctr(limits={GPU: "2"}), both(CORES, "100")),
    ("gpumem-only-gets-count", ctr(limits={MEM: "3000"}), both(GPU, "1")),
    ("percentage-only-gets-count", ctr(limits={PCT: "50"}), both(GPU, "1")),
    (
        "percentage-100-only-gets-count-and-cores",
        ctr(limits={PCT: "100"}),
        [
            lim(GPU, "1"),
            lim(CORES, "100"),
            lim(GPU, "1", where="requests"),
            lim(CORES, "100", where="requests"),
        ],
    ),
    ("cores-only-gets-count", ctr(limits={CORES: "30"}), both(GPU, "1")),
    ("gpu-and-gpumem-unchanged", ctr(limits={GPU: "1", MEM: "3000"}), []),
    ("gpu-and-cores-unchanged", ctr(limits={GPU: "1", CORES: "0"}), []),
    ("gpu-and-percentage-50-unchanged", ctr(limits={GPU: "1", PCT: "50"}), []),
    ("gpu-and-percentage-100-exclusive", ctr(limits={GPU: "2", PCT: "100"}), both(CORES, "100")),
    ("zero-gpus-no-defaults", ctr(limits={GPU: "0"}), []),
    # HAMi's "unset" percentage and a literal gpumem 0 name a memory amount: no exclusive card.
    ("gpu-and-percentage-0-not-exclusive", ctr(limits={GPU: "1", PCT: "0"}), []),
    ("gpu-and-gpumem-0-not-exclusive", ctr(limits={GPU: "1", MEM: "0"}), []),
]


@pytest.mark.parametrize(
    ("case", "container", "expected"), CONTAINER_CASES, ids=[c[0] for c in CONTAINER_CASES]
)
def test_defaults_follow_hami_rules(
    case: str, container: dict[str, Any], expected: list[dict[str, Any]]
) -> None:
    decision = mutate.mutate_pod(pod(defaulted(container)), OPTS)
    assert decision.allowed
    assert ops(decision) == [SCHED, *expected]


@pytest.mark.parametrize(
    ("case", "container", "expected"), CONTAINER_CASES, ids=[c[0] for c in CONTAINER_CASES]
)
def test_patched_pod_parses_like_the_unpatched_pod(
    case: str, container: dict[str, Any], expected: list[dict[str, Any]]
) -> None:
    for c in (container, defaulted(container)):
        before = pod(c, init=(ctr("init", limits={MEM: "1000"}),))
        after = apply_patch(before, ops(mutate.mutate_pod(before, OPTS)))
        assert resources.parse_pod(after) == resources.parse_pod(before)


def test_without_requests_only_limits_are_patched() -> None:
    # A container not defaulted by the apiserver (no requests): only limits change.
    decision = mutate.mutate_pod(pod(ctr(limits={MEM: "3000"})), OPTS)
    assert ops(decision) == [SCHED, lim(GPU, "1")]


def test_requests_keep_their_own_values() -> None:
    # The count is in requests but not in limits: HAMi adds the default count to limits only;
    # the requests' value is not overwritten.
    c = ctr(limits={MEM: "3000"}, requests={MEM: "3000", GPU: "2"})
    assert ops(mutate.mutate_pod(pod(c), OPTS)) == [SCHED, lim(GPU, "1")]


def test_gpu_in_requests_only_is_defaulted_in_requests() -> None:
    # The scheduler reads limits first and adds the default count when limits name a GPU
    # resource: cores added to limits alone would turn "2 cards" into 1.
    c = ctr(requests={GPU: "2"})
    assert ops(mutate.mutate_pod(pod(c), OPTS)) == [SCHED, lim(CORES, "100", where="requests")]


def test_init_containers_are_defaulted_too() -> None:
    p = pod(ctr("app", limits={GPU: "1", MEM: "10"}), init=(ctr("init", limits={PCT: "20"}),))
    assert ops(mutate.mutate_pod(p, OPTS)) == [SCHED, lim(GPU, "1", "initContainers", 0)]


def test_second_container_index_in_path() -> None:
    p = pod(ctr("cpu"), ctr("gpu", limits={GPU: "1"}))
    assert ops(mutate.mutate_pod(p, OPTS)) == [SCHED, lim(CORES, "100", i=1)]


@pytest.mark.parametrize(
    ("scheduler", "expected"),
    [
        (None, [SCHED]),
        ("", [SCHED]),
        ("default-scheduler", [SCHED]),
        ("gpuslice-scheduler", []),
    ],
)
def test_scheduler_name_is_set_unless_already_ours(
    scheduler: str | None, expected: list[dict[str, Any]]
) -> None:
    decision = mutate.mutate_pod(pod(ctr(limits={GPU: "1", MEM: "100"}), scheduler=scheduler), OPTS)
    assert decision.allowed
    assert ops(decision) == expected


def test_pod_naming_another_scheduler_is_left_alone() -> None:
    decision = mutate.mutate_pod(pod(ctr(limits={MEM: "100"}), scheduler="volcano"), OPTS)
    assert decision.allowed and decision.patch == ()
    assert "volcano" in decision.message


def test_configured_scheduler_name_is_used() -> None:
    decision = mutate.mutate_pod(pod(ctr(limits={GPU: "1", MEM: "1"})), mutate.Options(scheduler_name="mine"))
    assert ops(decision) == [{"op": "add", "path": "/spec/schedulerName", "value": "mine"}]


@pytest.mark.parametrize(
    "p",
    [
        pod(ctr(limits={"cpu": "1", "memory": "1Gi"})),
        pod(ctr()),
        pod(ctr(limits={"example.com/gpu": "1"})),
        pod(ctr(limits={GPU: "1"}), labels={"hami.io/webhook": "ignore"}),
    ],
    ids=["cpu-only", "no-resources", "other-vendor", "opted-out"],
)
def test_non_gpu_or_opted_out_pods_are_not_patched(p: dict[str, Any]) -> None:
    decision = mutate.mutate_pod(p, OPTS)
    assert decision.allowed and decision.patch == ()


def test_gpu_key_in_requests_only_counts_as_gpu_pod() -> None:
    decision = mutate.mutate_pod(pod(ctr(requests={MEM: "100"})), OPTS)
    assert ops(decision)[0] == SCHED


def test_undecodable_pod_is_refused_as_error() -> None:
    p = pod(ctr(limits={GPU: "1"}))
    p["spec"]["containers"] = "nope"
    decision = mutate.mutate_pod(p, OPTS)
    assert not decision.allowed and decision.error
    assert "cannot decode the pod" in decision.message and "spec.containers" in decision.message


def test_custom_default_gpu_num() -> None:
    config = model_config.RequestConfig(default_gpu_num=2)
    decision = mutate.mutate_pod(pod(ctr(limits={MEM: "10"})), mutate.Options(request_config=config))
    assert ops(decision) == [SCHED, lim(GPU, "2")]


RESOURCE = st.sampled_from([GPU, MEM, PCT, CORES])
VALUE = st.sampled_from(["0", "1", "2", "50", "100", "3000", "0.5", 3, "1k"])
LIMITS = st.dictionaries(RESOURCE, VALUE, max_size=4)
CONTAINER = st.tuples(LIMITS, LIMITS, st.booleans())


def _build(spec: tuple[dict[str, Any], dict[str, Any], bool], i: int) -> dict[str, Any]:
    limits, extra_requests, apiserver = spec
    c = ctr(f"c{i}", limits=limits or None, requests=extra_requests or None)
    return defaulted(c) if apiserver else c


def _parsed(p: dict[str, Any]) -> object:
    """The scheduler's reading of a pod, or its refusal (a percentage outside 0..100 is one)."""
    try:
        return resources.parse_pod(p)
    except errors.DecodeError as err:
        return str(err)


@settings(max_examples=300, deadline=None)
@given(st.lists(CONTAINER, min_size=1, max_size=3), st.lists(CONTAINER, max_size=2))
def test_property_patch_preserves_parse_and_is_idempotent(
    app: list[tuple[dict[str, Any], dict[str, Any], bool]],
    init: list[tuple[dict[str, Any], dict[str, Any], bool]],
) -> None:
    before = pod(
        *(_build(c, i) for i, c in enumerate(app)), init=tuple(_build(c, 9 + i) for i, c in enumerate(init))
    )
    decision = mutate.mutate_pod(before, OPTS)
    assert decision.allowed
    after = apply_patch(before, ops(decision))
    assert _parsed(after) == _parsed(before)
    again = mutate.mutate_pod(after, OPTS)
    assert again.allowed and again.patch == ()
    # What the webhook adds is added to requests too whenever the container's requests name a GPU
    # resource, so a container whose requests mirrored its limits still does.
    for old, new in zip(
        before["spec"].get("initContainers", []) + before["spec"]["containers"],
        after["spec"].get("initContainers", []) + after["spec"]["containers"],
        strict=True,
    ):
        res_old, res_new = old.get("resources") or {}, new.get("resources") or {}
        if res_old.get("requests") and res_old.get("limits") == res_old.get("requests"):
            assert res_new["limits"] == res_new["requests"]


def test_renamed_resources_get_the_defaults_under_their_names() -> None:
    names = model_config.ResourceNames(
        count="example.com/vgpu", memory="example.com/vmem", cores="example.com/vcores"
    )
    opts = mutate.Options(request_config=model_config.RequestConfig(names=names))
    bare = mutate.mutate_pod(pod(ctr(limits={"example.com/vgpu": "1"})), opts)
    assert ops(bare) == [SCHED, lim("example.com/vcores", "100")]
    share = mutate.mutate_pod(pod(ctr(limits={"example.com/vmem": "3000"})), opts)
    assert ops(share) == [SCHED, lim("example.com/vgpu", "1")]
    # The default names are not GPU resources under this configuration: the pod is left alone.
    assert mutate.mutate_pod(pod(ctr(limits={GPU: "1"})), opts).patch == ()
