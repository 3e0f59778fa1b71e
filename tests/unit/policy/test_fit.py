"""fit.place: every reason code, the code (unschedulable vs unresolvable), init/app containers."""

from __future__ import annotations

import pytest

from gpuslice.framework import registry
from gpuslice.model import allocations, devices, nodes, requests, status
from gpuslice.policy import api, fit, quota
from tests.unit.builders import V100, node, pod, uuid

pytestmark = pytest.mark.unit

BINPACK = registry.get("binpack")
U = status.Code.UNSCHEDULABLE
R = status.Code.UNRESOLVABLE


def two_cards() -> nodes.NodeState:
    return node("n").gpus(2, memory=24000).state()


FAILS = [
    # (id, state, pod, quota, expected code, expected reasons, expected card_reasons)
    ("unregistered", node("n").state(), pod().gpu(1).obj(), None, R, (status.NODE_UNREGISTERED,), ()),
    ("count-over-cards", two_cards(), pod().gpu(3).obj(), None, R, (status.INSUFFICIENT_GPU_COUNT,), ()),
    (
        "unhealthy",
        node("n").gpus(2).unhealthy(0).unhealthy(1).state(),
        pod().gpu(1).obj(),
        None,
        R,
        (status.DEVICE_UNHEALTHY,),
        ((status.DEVICE_UNHEALTHY, 2),),
    ),
    (
        "cordoned",
        node("n").gpus(1).cordon(0).state(),
        pod().gpu(1).obj(),
        None,
        R,
        (status.DEVICE_CORDONED,),
        ((status.DEVICE_CORDONED, 1),),
    ),
    (
        "type-use",
        two_cards(),
        pod().gpu(1).types("h100").obj(),
        None,
        R,
        (status.DEVICE_TYPE_MISMATCH,),
        None,
    ),
    (
        "type-nouse",
        two_cards(),
        pod().gpu(1).nouse_types("a100").obj(),
        None,
        R,
        (status.DEVICE_TYPE_MISMATCH,),
        None,
    ),
    (
        "mode",
        two_cards(),
        pod().gpu(1).mode(devices.MODE_MIG).obj(),
        None,
        R,
        (status.DEVICE_TYPE_MISMATCH,),
        None,
    ),
    ("uuid-use", two_cards(), pod().gpu(1).uuids("GPU-x").obj(), None, R, (status.UUID_FILTERED,), None),
    (
        "uuid-nouse",
        two_cards(),
        pod().gpu(1).nouse_uuids(uuid("n", 0), uuid("n", 1)).obj(),
        None,
        R,
        (status.UUID_FILTERED,),
        None,
    ),
    ("numa-hint", two_cards(), pod().gpu(1).numa(1).obj(), None, R, (status.NUMA_UNSATISFIED,), None),
    (
        # 2 cards on NUMA 0 and 2 on NUMA 1: 2 free per group, the pod asks 3 on one NUMA node.
        "numa-bind",
        node("n").gpus(4, per_numa=2).state(),
        pod().gpu(3).numa_bind().obj(),
        None,
        R,
        (status.NUMA_UNSATISFIED,),
        (),
    ),
    (
        # slots 2 per card, both taken on both cards
        "slots",
        node("n").gpus(2, slots=2).used(0, slots=2).used(1, slots=2).state(),
        pod().gpu(1, memory=1).obj(),
        None,
        U,
        (status.GPU_SLOTS_EXHAUSTED,),
        ((status.GPU_SLOTS_EXHAUSTED, 2),),
    ),
    (
        # HAMi checks cores before the exclusive rule: 100 - 10 free < 100 asked
        "exclusive-request-on-card-with-cores-used",
        node("n").gpus(1).used(0, memory=10, cores=10).state(),
        pod().gpu(1, memory=10, cores=100).obj(),
        None,
        U,
        (status.INSUFFICIENT_GPU_CORES,),
        None,
    ),
    (
        # all 100 cores free, but the card is in use: the exclusive rule refuses it
        "exclusive-request-on-used-card",
        node("n").gpus(1).used(0, memory=10, cores=0).state(),
        pod().gpu(1, memory=10, cores=100).obj(),
        None,
        U,
        (status.EXCLUSIVE_CONFLICT,),
        None,
    ),
    (
        # one task holds all 100 cores: even a 0-core, 1 MiB request may not join
        "held-exclusively",
        node("n").gpus(1).used(0, memory=10, cores=100).state(),
        pod().gpu(1, memory=1, cores=0).obj(),
        None,
        U,
        (status.EXCLUSIVE_CONFLICT,),
        None,
    ),
    (
        # 24000 - 20000 = 4000 free < 8000 asked
        "memory",
        node("n").gpus(1, memory=24000).used(0, memory=20000).state(),
        pod().gpu(1, memory=8000).obj(),
        None,
        U,
        (status.INSUFFICIENT_GPU_MEMORY,),
        None,
    ),
    (
        # percentage: 50 % of 24000 = 12000 > 24000 - 16000 = 8000 free
        "memory-percentage",
        node("n").gpus(1, memory=24000).used(0, memory=16000).state(),
        pod().gpu(1, pct=50).obj(),
        None,
        U,
        (status.INSUFFICIENT_GPU_MEMORY,),
        None,
    ),
    (
        "memory-over-card",
        two_cards(),
        pod().gpu(1, memory=30000).obj(),
        None,
        R,
        (status.INSUFFICIENT_GPU_MEMORY,),
        None,
    ),
    (
        # 100 - 80 = 20 free < 30
        "cores",
        node("n").gpus(1).used(0, cores=80).state(),
        pod().gpu(1, cores=30).obj(),
        None,
        U,
        (status.INSUFFICIENT_GPU_CORES,),
        None,
    ),
    (
        # used 10000 + 2 cards x 8000 = 26000 > 20000
        "quota-memory",
        two_cards(),
        pod().gpu(2, memory=8000).obj(),
        quota.QuotaView(memory_limit=20000, used_memory=10000),
        U,
        (status.QUOTA_EXCEEDED,),
        ((status.QUOTA_EXCEEDED, 2),),
    ),
    (
        "quota-zero-blocks",
        two_cards(),
        pod().gpu(1, memory=1).obj(),
        quota.QuotaView(cores_limit=0),
        R,
        (status.QUOTA_EXCEEDED,),
        None,
    ),
    (
        "cpu",
        node("n").gpus(1).host(4000, 0, cpu_used=3000).state(),
        pod().gpu(1, memory=1).host(2000).obj(),
        None,
        U,
        (status.INSUFFICIENT_CPU,),
        (),
    ),
    (
        "cpu-over-node",
        node("n").gpus(1).host(4000, 0).state(),
        pod().no_gpu().host(5000).obj(),
        None,
        R,
        (status.INSUFFICIENT_CPU,),
        (),
    ),
    (
        "host-memory",
        node("n").gpus(1).host(4000, 1000, memory_used=900).state(),
        pod().gpu(1, memory=1).host(100, 200).obj(),
        None,
        U,
        (status.INSUFFICIENT_HOST_MEMORY,),
        (),
    ),
    (
        # card 0 out of memory, card 1 unhealthy, card 2 out of memory: memory dominates 2:1
        "dominant",
        node("n").gpus(3, memory=1000).used(0, memory=900).unhealthy(1).used(2, memory=950).state(),
        pod().gpu(1, memory=200).obj(),
        None,
        U,
        (status.INSUFFICIENT_GPU_MEMORY,),
        ((status.INSUFFICIENT_GPU_MEMORY, 2), (status.DEVICE_UNHEALTHY, 1)),
    ),
    (
        # tie 1:1 keeps both, in ALL_REASONS order
        "tie",
        node("n").gpus(2, memory=1000).used(0, memory=900).used(1, cores=90).state(),
        pod().gpu(1, memory=200, cores=20).obj(),
        None,
        U,
        (status.INSUFFICIENT_GPU_MEMORY, status.INSUFFICIENT_GPU_CORES),
        ((status.INSUFFICIENT_GPU_MEMORY, 1), (status.INSUFFICIENT_GPU_CORES, 1)),
    ),
]


@pytest.mark.parametrize(
    ("state", "req", "qv", "code", "reasons", "card_reasons"),
    [f[1:] for f in FAILS],
    ids=[f[0] for f in FAILS],
)
def test_failure_reasons(
    state: nodes.NodeState,
    req: requests.PodRequest,
    qv: quota.QuotaView | None,
    code: status.Code,
    reasons: tuple[str, ...],
    card_reasons: fit.CardReasons | None,
) -> None:
    got = fit.place(state, req, BINPACK, api.EMPTY_CONTEXT, qv)
    assert got.allocation is None
    assert got.status == status.Status(code, reasons)
    if card_reasons is not None:
        assert got.card_reasons == card_reasons


def test_success_grants_memory_and_clamped_cores() -> None:
    state = node("n").gpus(2, memory=24000).state()
    # 25 % of 24000 = 6000 MiB; cores 150 clamped to 100
    got = fit.place(state, pod().gpu(2, pct=25, cores=150).obj(), BINPACK)
    assert got.status.ok
    assert got.allocation is not None
    assert got.allocation.containers == (
        (allocations.DeviceGrant(uuid("n", 0), 6000, 100), allocations.DeviceGrant(uuid("n", 1), 6000, 100)),
    )


def test_app_containers_are_cumulative_and_distinct_cards_per_container() -> None:
    # one card of 10000: two app containers of 6000 make 12000 > 10000 even on an empty node
    state = node("n").gpus(1, memory=10000).state()
    got = fit.place(state, pod().gpu(1, memory=6000).gpu(1, memory=6000).obj(), BINPACK)
    assert got.status == status.Status(R, (status.INSUFFICIENT_GPU_MEMORY,))
    # two cards: the second container takes the other card
    state = node("n").gpus(2, memory=10000).state()
    got = fit.place(state, pod().gpu(1, memory=6000).gpu(1, memory=6000).obj(), BINPACK)
    assert got.allocation is not None
    assert got.allocation.containers[0][0].uuid != got.allocation.containers[1][0].uuid


def test_init_containers_each_fit_on_a_fresh_copy() -> None:
    # two init containers of 8000 and an app container of 8000 on one 10000 card: all fit
    state = node("n").gpus(1, memory=10000).state()
    req = pod().init_gpu(1, memory=8000).init_gpu(1, memory=8000).gpu(1, memory=8000).obj()
    got = fit.place(state, req, BINPACK)
    assert got.status.ok
    assert got.allocation is not None
    assert got.allocation.init_count == 2
    assert [len(c) for c in got.allocation.containers] == [1, 1, 1]


def test_no_gpu_pod_fits_node_without_gpus() -> None:
    got = fit.place(node("n").state(), pod().no_gpu().obj(), BINPACK)
    assert got.status.ok
    assert got.allocation is not None
    assert got.allocation.containers == ((),)


def test_numa_bind_picks_one_numa_node() -> None:
    # NUMA 0 has cards 0,1 (card 0 full), NUMA 1 has cards 2,3: only NUMA 1 has two free
    state = node("n").gpus(4, per_numa=2, memory=1000).used(0, memory=1000).state()
    got = fit.place(state, pod().gpu(2, memory=500).numa_bind().obj(), BINPACK)
    assert got.allocation is not None
    assert {g.uuid for g in got.allocation.containers[0]} == {uuid("n", 2), uuid("n", 3)}


def test_type_selectors_are_case_insensitive_substrings() -> None:
    state = node("n").card(model=V100).card().state()
    got = fit.place(state, pod().gpu(1, memory=1).types("v100").obj(), BINPACK)
    assert got.allocation is not None
    assert got.allocation.containers[0][0].uuid == uuid("n", 0)


def test_quota_counts_earlier_app_containers() -> None:
    # limit 10000: first container 6000 fits, the second would make 12000 > 10000 even with no usage
    state = node("n").gpus(2, memory=20000).state()
    got = fit.place(
        state,
        pod().gpu(1, memory=6000).gpu(1, memory=6000).obj(),
        BINPACK,
        quota=quota.QuotaView(memory_limit=10000),
    )
    assert got.status == status.Status(R, (status.QUOTA_EXCEEDED,))


class _Refuse:
    name = "refuse"
    idle_only = False
    learns_workload = False

    def score_node(self, state: nodes.NodeState, pod: requests.PodRequest, ctx: api.Context) -> api.Scored:
        return api.Scored(0)

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: api.Context,
    ) -> tuple[int, ...] | None:
        return None


def test_policy_refusal_is_unresolvable_when_it_refuses_everywhere() -> None:
    got = fit.place(two_cards(), pod().gpu(1).obj(), _Refuse())
    assert got.status == status.Status(R, (status.INSUFFICIENT_GPU_COUNT,))
