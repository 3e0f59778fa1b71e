"""The memory percentage as gpuslice reads it: 0..100 only, 0 is HAMi's unset, never exclusive."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.codec import errors, resources
from gpuslice.model import config, requests

pytestmark = pytest.mark.unit

UNSET = requests.MEMORY_PERCENTAGE_UNSET
GPU, MEM, PCT, CORES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
)
WEBHOOK = config.RequestConfig()
NO_WEBHOOK = config.RequestConfig(exclusive_whole_card=False)
HUGE = "99999999999999999999"  # beyond int64: Go's AsInt64 fails


def req(count: int, memory: int = 0, pct: int = UNSET, cores: int = 0) -> requests.ContainerRequest:
    return requests.ContainerRequest(count=count, memory_mib=memory, memory_percentage=pct, cores=cores)


def container(limits: dict[str, Any], requests_: dict[str, Any] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {"limits": limits}
    if requests_ is not None:
        res["requests"] = requests_
    return {"name": "c", "resources": res}


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": list(containers), "initContainers": list(init)},
    }


# (percentage, with gpumem 3000, exclusive rule on) -> request, or None for an error
ACCEPTED: list[tuple[str, bool, bool, requests.ContainerRequest]] = [
    # 0 is HAMi's unset: whole-card memory (or gpumem), and never an exclusive card.
    ("0", False, True, req(1, pct=100, cores=0)),
    ("0", False, False, req(1, pct=100, cores=0)),
    ("0", True, True, req(1, memory=3000)),
    ("0", True, False, req(1, memory=3000)),
    ("1", False, True, req(1, pct=1)),
    ("1", False, False, req(1, pct=1)),
    ("1", True, True, req(1, memory=3000, pct=1)),
    ("1", True, False, req(1, memory=3000, pct=1)),
    # A literal 100 is the whole card: exclusive with the webhook's rule, shared without.
    ("100", False, True, req(1, pct=100, cores=100)),
    ("100", False, False, req(1, pct=100, cores=0)),
    # gpumem wins the memory, so the request is not the whole card: no exclusive card.
    ("100", True, True, req(1, memory=3000, pct=100)),
    ("100", True, False, req(1, memory=3000, pct=100)),
]


@pytest.mark.parametrize(
    ("pct", "gpumem", "exclusive", "want"),
    ACCEPTED,
    ids=[f"{a[0]}-{'gpumem' if a[1] else 'nomem'}-{'webhook' if a[2] else 'plain'}" for a in ACCEPTED],
)
def test_percentage_in_range(
    pct: str, gpumem: bool, exclusive: bool, want: requests.ContainerRequest
) -> None:
    limits = {GPU: "1", PCT: pct, **({MEM: "3000"} if gpumem else {})}
    cfg = WEBHOOK if exclusive else NO_WEBHOOK
    assert resources.parse_pod(pod(container(limits)), cfg).containers == (want,)


REFUSED = ["-1", "101", "150", HUGE, "1e3", "50.5", "500m", "-0.5"]


@pytest.mark.parametrize("exclusive", [True, False], ids=["webhook", "plain"])
@pytest.mark.parametrize("gpumem", [False, True], ids=["nomem", "gpumem"])
@pytest.mark.parametrize("pct", REFUSED)
def test_percentage_out_of_range_is_an_error_naming_resource_and_container(
    pct: str, gpumem: bool, exclusive: bool
) -> None:
    limits = {GPU: "1", PCT: pct, **({MEM: "3000"} if gpumem else {})}
    p = pod(container({GPU: "1"}), container(limits))
    with pytest.raises(errors.DecodeError) as caught:
        resources.parse_pod(p, WEBHOOK if exclusive else NO_WEBHOOK)
    err = caught.value
    assert (err.annotation, err.field) == (PCT, "spec.containers[1]")
    assert str(err) == (
        f"{PCT} must be an integer in 0..100 (0 = unset), got {pct} [{PCT}, spec.containers[1]]"
    )


def test_the_check_covers_requests_init_containers_and_containers_without_a_count() -> None:
    # In requests only (limits name the count).
    with pytest.raises(errors.DecodeError, match=r"got 150 \[.*, spec.containers\[0\]\]"):
        resources.parse_pod(pod(container({GPU: "1"}, {GPU: "1", PCT: "150"})))
    # An init container is named by its own path.
    with pytest.raises(errors.DecodeError, match=r"spec.initContainers\[0\]"):
        resources.parse_pod(pod(container({GPU: "1"}), init=(container({PCT: "101"}),)))
    # No count and no default count: not a GPU container to HAMi, still an invalid value.
    no_default = config.RequestConfig(default_gpu_num=0, exclusive_whole_card=False)
    with pytest.raises(errors.DecodeError):
        resources.parse_pod(pod(container({PCT: "150"})), no_default)
    assert resources.parse_pod(pod(container({PCT: "50"})), no_default).containers == (None,)


def test_generate_request_keeps_hamis_clamp() -> None:
    # HAMi's GenerateResourceRequests (its own conformance cases): 150 -> 100, 0 and -1 unset.
    cfg = config.DEFAULT_REQUEST_CONFIG
    assert resources.generate_request({GPU: "1", PCT: "150"}, {}, cfg) == req(1, pct=100)
    assert resources.generate_request({GPU: "1", PCT: "0"}, {}, cfg) == req(1, pct=100)
    assert resources.generate_request({GPU: "1", PCT: "-1", MEM: "10"}, {}, cfg) == req(1, memory=10)


@pytest.mark.parametrize(
    ("limits", "cores"),
    [
        ({GPU: "1"}, 100),  # nothing named: the whole card, exclusive
        ({GPU: "1", PCT: "100"}, 100),  # a literal 100
        ({GPU: "1", PCT: "0"}, 0),  # HAMi's unset names a percentage: no cores added
        ({GPU: "1", MEM: "0"}, 0),  # a literal gpumem 0 names memory: no cores added
        ({GPU: "1", PCT: "0", MEM: "0"}, 0),
        ({GPU: "1", PCT: "100", CORES: "30"}, 30),  # cores given: kept
        ({PCT: "100"}, 100),  # the default count is added first
    ],
)
def test_webhook_rule_fires_only_on_a_literal_whole_card_ask(limits: dict[str, str], cores: int) -> None:
    got = resources.webhook_request(limits, {}, config.DEFAULT_REQUEST_CONFIG)
    assert got is not None and got.cores == cores
    assert got.memory_on(1000) == 1000  # every one of them takes the whole card's memory
