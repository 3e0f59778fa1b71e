from __future__ import annotations

from typing import Any

import pytest

from gpuslice.codec import errors, resources
from gpuslice.framework import registry
from gpuslice.model import config as model_config
from gpuslice.policy import api
from gpuslice.webhook import validate
from tests.unit.webhook.builders import CORES, GPU, MEM, PCT, ctr, defaulted, pod

pytestmark = pytest.mark.unit

OPTS = validate.Options()


def _chain_error(value: str) -> str:
    """The extender's own refusal of a card-policy chain (``policy.chains``)."""
    try:
        registry.card_policy(value)
    except api.UnknownPolicyError as err:
        return str(err)
    raise AssertionError(f"{value!r} is a valid chain")


# (id, pod, max_cards, expected message (exact), expected code)
REFUSED: list[tuple[str, dict[str, Any], int | None, str, int]] = [
    (
        "percentage-above-100",
        pod(defaulted(ctr("train", limits={GPU: "1", PCT: "150"}))),
        None,
        'container "train": nvidia.com/gpumem-percentage must be in 1..100, got 150',
        400,
    ),
    (
        "percentage-zero",
        pod(ctr("train", limits={GPU: "1", PCT: "0"})),
        None,
        'container "train": nvidia.com/gpumem-percentage must be in 1..100, got 0',
        400,
    ),
    (
        "cores-above-100",
        pod(ctr("a", limits={GPU: "1", CORES: "101"})),
        None,
        'container "a": nvidia.com/gpucores must be in 0..100, got 101',
        400,
    ),
    (
        "negative-gpumem",
        pod(ctr("a", limits={GPU: "1", MEM: "-5"})),
        None,
        'container "a": nvidia.com/gpumem must be a non-negative integer, got -5',
        400,
    ),
    (
        "fractional-count",
        pod(ctr("a", limits={GPU: "500m"})),
        None,
        'container "a": nvidia.com/gpu must be a non-negative integer, got 500m',
        400,
    ),
    (
        "not-a-quantity",
        pod(ctr("a", limits={GPU: "1", MEM: "lots"})),
        None,
        'container "a": nvidia.com/gpumem quantity "lots" is not valid',
        400,
    ),
    (
        "bad-value-in-requests-only",
        pod(ctr("a", limits={GPU: "1"}, requests={GPU: "1", CORES: "200"})),
        None,
        'container "a": nvidia.com/gpucores must be in 0..100, got 200',
        400,
    ),
    (
        "init-container-named",
        pod(ctr("app", limits={GPU: "1"}), init=(ctr("prep", limits={PCT: "101"}),)),
        None,
        'container "prep": nvidia.com/gpumem-percentage must be in 1..100, got 101',
        400,
    ),
    (
        "more-cards-than-any-node",
        pod(ctr("big", limits={GPU: "9"})),
        8,
        'container "big": nvidia.com/gpu is 9, more cards than any node registers (largest: 8)',
        400,
    ),
    (
        "unknown-node-policy",
        pod(ctr(limits={GPU: "1"}), annotations={"hami.io/node-scheduler-policy": "densest"}),
        None,
        f"hami.io/node-scheduler-policy: unknown policy 'densest'; known: {', '.join(registry.names())}",
        400,
    ),
    (
        "gpu-policy-bad-chain",
        pod(ctr(limits={GPU: "1"}), annotations={"hami.io/gpu-scheduler-policy": "binpack,nope"}),
        None,
        f"hami.io/gpu-scheduler-policy: {_chain_error('binpack,nope')}",
        400,
    ),
    (
        "percentage-negative",
        pod(ctr("train", limits={GPU: "1", PCT: "-1"})),
        None,
        'container "train": nvidia.com/gpumem-percentage must be a non-negative integer, got -1',
        400,
    ),
    (
        "percentage-fractional",
        pod(ctr("train", limits={GPU: "1", PCT: "50.5"})),
        None,
        'container "train": nvidia.com/gpumem-percentage must be a non-negative integer, got 50.5',
        400,
    ),
    (
        "malformed-scoring-weights",
        pod(ctr(limits={GPU: "1"}), annotations={"hami.io/device-scoring-weights": "slot=1,core=1"}),
        None,
        "hami.io/device-scoring-weights: missing weights memory",
        400,
    ),
    (
        "malformed-numa-hint",
        pod(ctr(limits={GPU: "1"}), annotations={"hami.io/numa-hint": "-1"}),
        None,
        "hami.io/numa-hint: NUMA hint must not be negative: -1",
        400,
    ),
    (
        "node-name-preset",
        pod(ctr(limits={GPU: "1"}), node_name="n1"),
        None,
        "pod has node assigned",
        403,
    ),
    (
        "several-problems-in-one-message",
        pod(ctr("a", limits={PCT: "0", CORES: "300"}), node_name="n1"),
        None,
        'container "a": nvidia.com/gpumem-percentage must be in 1..100, got 0; '
        'container "a": nvidia.com/gpucores must be in 0..100, got 300; pod has node assigned',
        400,
    ),
]


@pytest.mark.parametrize(("case", "p", "max_cards", "message", "code"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refusals_name_container_and_field(
    case: str, p: dict[str, Any], max_cards: int | None, message: str, code: int
) -> None:
    decision = validate.validate_pod(p, OPTS, max_cards)
    assert not decision.allowed
    assert not decision.error
    assert decision.message == message
    assert decision.code == code
    assert decision.result == "denied"


ALLOWED: list[tuple[str, dict[str, Any], int | None]] = [
    ("whole-card", pod(defaulted(ctr(limits={GPU: "1"}))), 8),
    ("webhook-defaulted", pod(defaulted(ctr(limits={GPU: "1", CORES: "100"}))), 1),
    ("count-equals-largest-node", pod(ctr(limits={GPU: "8"})), 8),
    ("capacity-unknown-fails-open", pod(ctr(limits={GPU: "64"})), None),
    ("percentage-1-and-cores-0", pod(ctr(limits={GPU: "1", PCT: "1", CORES: "0"})), None),
    ("percentage-100", pod(defaulted(ctr(limits={GPU: "1", PCT: "100"}))), None),
    (
        "gpu-policy-chain",
        pod(ctr(limits={GPU: "1"}), annotations={"hami.io/gpu-scheduler-policy": "binpack,numa"}),
        None,
    ),
    ("zero-count", pod(ctr(limits={GPU: "0"})), 8),
    ("large-gpumem-in-Mi-suffix-is-integer", pod(ctr(limits={GPU: "1", MEM: "1Ki"})), None),
    (
        "known-policies",
        pod(
            ctr(limits={GPU: "1"}),
            annotations={
                "hami.io/node-scheduler-policy": "spread",
                "hami.io/gpu-scheduler-policy": " topology-aware ",
                "hami.io/device-scoring-weights": "slot=1,core=0,memory=3",
            },
        ),
        None,
    ),
    (
        "empty-policy-annotation-is-no-override",
        pod(ctr(limits={GPU: "1"}), annotations={"hami.io/gpu-scheduler-policy": ""}),
        None,
    ),
    ("non-gpu-pod-with-node-name", pod(ctr(limits={"cpu": "1"}), node_name="n1"), None),
    ("non-gpu-pod-with-bad-policy", pod(ctr(), annotations={"hami.io/node-scheduler-policy": "nope"}), None),
    ("opted-out", pod(ctr(limits={GPU: "1", PCT: "500"}), labels={"hami.io/webhook": "ignore"}), None),
    (
        "privileged-allowed-by-default",
        pod(ctr(limits={GPU: "1"}, securityContext={"privileged": True})),
        None,
    ),
]


@pytest.mark.parametrize(("case", "p", "max_cards"), ALLOWED, ids=[c[0] for c in ALLOWED])
def test_allowed(case: str, p: dict[str, Any], max_cards: int | None) -> None:
    decision = validate.validate_pod(p, OPTS, max_cards)
    assert decision.allowed, decision.message
    assert decision.patch == ()


def test_privileged_refused_when_asked() -> None:
    opts = validate.Options(deny_privileged=True)
    p = pod(ctr("ok", limits={GPU: "1"}), ctr("x", securityContext={"privileged": True}))
    decision = validate.validate_pod(p, opts, None)
    assert (decision.allowed, decision.message, decision.code) == (False, 'container "x" is privileged', 403)
    # Not privileged, or not a GPU pod: allowed.
    assert validate.validate_pod(
        pod(ctr(limits={GPU: "1"}, securityContext={"privileged": False})), opts, None
    ).allowed
    assert validate.validate_pod(pod(ctr(securityContext={"privileged": True})), opts, None).allowed


def test_undecodable_pod_is_an_error_decision() -> None:
    p = pod(ctr(limits={GPU: "1"}))
    p["metadata"]["annotations"] = {"hami.io/numa-hint": 3}
    decision = validate.validate_pod(p, OPTS, None)
    assert not decision.allowed and decision.error and decision.result == "error"
    assert decision.message.startswith("cannot decode the pod: ")


@pytest.mark.parametrize("pct", ["-1", "0", "101", "150", "99999999999999999999", "50.5", "500m"])
def test_every_percentage_the_scheduler_refuses_is_refused_here_too(pct: str) -> None:
    """The webhook's range (1..100) lies inside the reader's (0..100): what passes here, parses."""
    p = pod(defaulted(ctr("train", limits={GPU: "1", PCT: pct})))
    decision = validate.validate_pod(p, OPTS, None)
    assert not decision.allowed and decision.code == 400
    assert decision.message.startswith('container "train": nvidia.com/gpumem-percentage must be')
    try:
        resources.parse_pod(p)
    except errors.DecodeError:
        return
    assert pct == "0"  # the one value only the webhook refuses: HAMi's "unset", a likely mistake


RENAMED = model_config.ResourceNames(
    count="example.com/vgpu", memory="example.com/vmem", memory_percentage="example.com/vpct"
)


def test_renamed_resources_are_validated_under_their_names() -> None:
    opts = validate.Options(request_config=model_config.RequestConfig(names=RENAMED))
    bad = pod(ctr("t", limits={"example.com/vgpu": "1", "example.com/vpct": "150"}))
    decision = validate.validate_pod(bad, opts, None)
    assert decision.message == 'container "t": example.com/vpct must be in 1..100, got 150'
    too_many = pod(ctr("t", limits={"example.com/vgpu": "9"}))
    assert validate.validate_pod(too_many, opts, 8).message == (
        'container "t": example.com/vgpu is 9, more cards than any node registers (largest: 8)'
    )
    # The default names are ordinary resources now: not a GPU pod, nothing checked.
    assert validate.validate_pod(pod(ctr(limits={GPU: "1", PCT: "150"})), opts, None).allowed
    assert validate.validate_pod(pod(ctr(limits={"example.com/vmem": "10"})), opts, None).allowed
