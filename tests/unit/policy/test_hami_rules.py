"""HAMi's card rules: policy chains and mutex, scoring weights, the exclusive rule, quota per card."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.cache import cache as caches
from gpuslice.codec import errors, keys, resources
from gpuslice.framework import nominations, registry
from gpuslice.model import allocations, nodes, requests, status, topology
from gpuslice.policy import api, chains, fit, quota
from tests.unit.builders import alloc, node, pod, uuid
from tests.unit.policy import strategies

pytestmark = pytest.mark.unit

U = status.Code.UNSCHEDULABLE


def chosen(p: fit.Placement, container: int = 0) -> list[str]:
    assert p.allocation is not None, p.status
    return [g.uuid for g in p.allocation.containers[container]]


# ----- parsing a card-policy value


@pytest.mark.parametrize(
    ("value", "name", "idle_only"),
    [
        ("binpack,numa", "binpack,numa", False),
        ("numa,spread", "numa,spread", False),
        ("mutex", "mutex", True),
        ("numa", "numa", False),
        ("mutex, spread, numa", "mutex,spread,numa", True),
        ("mutex,topology-aware", "mutex,topology-aware", True),
        ("binpack,binpack,numa", "binpack,numa", False),
    ],
)
def test_chains_are_card_policies(value: str, name: str, idle_only: bool) -> None:
    got = registry.card_policy(value)
    assert got.name == name
    assert got.idle_only is idle_only


@pytest.mark.parametrize("value", ["binpack", " spread ", "topology-aware", "fgd", "binpack,binpack"])
def test_a_single_registered_name_is_that_policy(value: str) -> None:
    got = registry.card_policy(value)
    assert got.name == value.split(",")[0].strip()
    assert not isinstance(got, chains.Chain)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("fgd,numa", "cannot be chained"),
        ("binpack,bogus", "is not a card policy"),
        ("bogus", "not supported"),
        (" , ", "has an empty item"),
        ("binpack,", "has an empty item"),
    ],
)
def test_invalid_card_policies_are_refused_with_the_item_named(value: str, says: str) -> None:
    with pytest.raises(api.UnknownPolicyError, match=says):
        registry.card_policy(value)


# ----- what the chains choose


def test_mutex_takes_only_idle_cards() -> None:
    state = node("n").gpus(3).used(0, memory=1000).used(2, memory=1000).state()
    got = fit.place(state, pod().gpu(1, memory=1000).obj(), registry.card_policy("mutex"))
    assert chosen(got) == [uuid("n", 1)]


def test_mutex_on_a_busy_node_names_the_exclusive_conflict() -> None:
    state = node("n").gpus(2).used(0, memory=1000).used(1, memory=1000).state()
    got = fit.place(state, pod().gpu(1, memory=1000).obj(), registry.card_policy("mutex,spread"))
    assert got.status == status.Status(U, (status.EXCLUSIVE_CONFLICT,))
    assert got.card_reasons == ((status.EXCLUSIVE_CONFLICT, 2),)


def test_binpack_then_numa_breaks_usage_ties_by_numa_node() -> None:
    # cards 0,1 on NUMA 1 and 2,3 on NUMA 0; equal usage on 1 and 2 (the fullest)
    state = (
        node("n")
        .gpus(2, numa=1, memory=10000)
        .gpus(2, numa=0, memory=10000)
        .used(1, memory=4000)
        .used(2, memory=4000)
        .state()
    )
    req = pod().gpu(1, memory=1000).obj()
    assert chosen(fit.place(state, req, registry.card_policy("binpack,numa"))) == [uuid("n", 2)]
    assert chosen(fit.place(state, req, registry.card_policy("binpack"))) == [uuid("n", 1)]


def test_numa_first_then_spread() -> None:
    # NUMA 0 holds the fuller cards; numa first keeps the pod there, on its emptier card
    state = (
        node("n")
        .gpus(2, numa=1, memory=10000)
        .gpus(2, numa=0, memory=10000)
        .used(2, memory=6000)
        .used(3, memory=3000)
        .state()
    )
    req = pod().gpu(1, memory=1000).obj()
    assert chosen(fit.place(state, req, registry.card_policy("numa,spread"))) == [uuid("n", 3)]
    assert chosen(fit.place(state, req, registry.card_policy("spread"))) == [uuid("n", 0)]


def test_a_chain_without_sort_key_sorts_like_spread() -> None:
    # idle cards of 10, 40 and 20 GB: spread takes the one left emptiest, binpack the fullest
    state = node("n").card(memory=10000).card(memory=40000).card(memory=20000).state()
    req = pod().gpu(1, memory=5000).obj()
    assert chosen(fit.place(state, req, registry.card_policy("mutex"))) == [uuid("n", 1)]
    assert chosen(fit.place(state, req, registry.card_policy("mutex,binpack"))) == [uuid("n", 0)]


def test_numa_bind_puts_numa_first_whatever_the_chain() -> None:
    # binpack alone would take the two fullest cards, one on each NUMA node
    state = (
        node("n")
        .gpus(2, numa=0, memory=10000)
        .gpus(2, numa=1, memory=10000)
        .used(0, memory=5000)
        .used(2, memory=5000)
        .state()
    )
    req = pod().gpu(2, memory=1000).numa_bind().obj()
    got = chosen(fit.place(state, req, registry.card_policy("binpack,numa")))
    assert sorted(got) == [uuid("n", 0), uuid("n", 1)]


def test_mutex_with_topology_aware_picks_the_best_connected_idle_cards() -> None:
    # NVLink pairs 0-1 (4 links) and 2-3 (2 links), everything else across CPUs
    n = 4
    links = {(0, 1): 4, (2, 3): 2}
    nv = tuple(tuple(links.get((min(i, j), max(i, j)), 0) for j in range(n)) for i in range(n))
    topo = topology.Topology(
        uuids=tuple(uuid("n", i) for i in range(n)),
        nvlinks=nv,
        pcie=tuple(
            tuple(topology.PcieLevel.INTERNAL if i == j else topology.PcieLevel.SYSTEM for j in range(n))
            for i in range(n)
        ),
        p2p=tuple(tuple(nv[i][j] > 0 for j in range(n)) for i in range(n)),
    )
    state = node("n").gpus(n, memory=10000).topo(topo).used(0, memory=1000).state()
    req = pod().gpu(2, memory=1000).obj()
    # 0-1 is the best pair, but card 0 is busy: mutex leaves 1, 2, 3, and 2-3 is the best of those
    got = chosen(fit.place(state, req, registry.card_policy("mutex,topology-aware")))
    assert sorted(got) == [uuid("n", 2), uuid("n", 3)]
    got = chosen(fit.place(state, req, registry.card_policy("topology-aware")))
    assert sorted(got) == [uuid("n", 0), uuid("n", 1)]


# ----- scoring weights


def _pod_dict(annotations: dict[str, str]) -> dict[str, object]:
    return {
        "metadata": {"name": "p", "namespace": "default", "annotations": annotations},
        "spec": {
            "containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}}}
            ]
        },
    }


def test_scoring_weights_reach_the_card_choice() -> None:
    # card 0: 3 of 10 slots, no memory; card 1: 1 slot, 6000 of 10000 MiB
    # slot=5,core=0,memory=1: card 0 scores 5*4/10 + 1000/10000 = 2.1, card 1 5*2/10 + 7000/10000 = 1.7
    state = node("n").gpus(2, memory=10000).used(0, slots=3).used(1, memory=6000).state()
    weighted = resources.parse_pod(_pod_dict({keys.DEVICE_SCORING_WEIGHTS: "slot=5,core=0,memory=1"}))
    plain = resources.parse_pod(_pod_dict({}))
    assert weighted.scoring_weights == requests.ScoringWeights(slot=5, core=0, memory=1)
    binpack = registry.get("binpack")
    assert chosen(fit.place(state, weighted, binpack)) == [uuid("n", 0)]
    assert chosen(fit.place(state, plain, binpack)) == [uuid("n", 1)]
    assert chosen(fit.place(state, weighted, registry.card_policy("binpack,numa"))) == [uuid("n", 0)]


@pytest.mark.parametrize("value", ["slot=1,core=1", "slot=0,core=0,memory=0", "slot=-1,core=1,memory=1", "x"])
def test_invalid_scoring_weights_are_an_error_naming_the_annotation(value: str) -> None:
    with pytest.raises(errors.DecodeError) as err:
        resources.parse_pod(_pod_dict({keys.DEVICE_SCORING_WEIGHTS: value}))
    assert err.value.annotation == keys.DEVICE_SCORING_WEIGHTS


# ----- the exclusive rule (devcore == 100 && cores == 100), after memory and cores


def test_core_scaled_card_co_locates_two_100_core_pods() -> None:
    state = node("n").gpus(1, cores=200).used(0, memory=1000, cores=100).state()
    got = fit.place(state, pod().gpu(1, memory=1000, cores=100).obj(), registry.get("spread"))
    assert got.status.ok
    c = caches.ClusterCache(nominator=nominations.Nominator())
    c.upsert_node(node("n").gpus(1, cores=200).inventory())
    first = alloc("n", ((uuid("n", 0), 1000, 100),))
    second = alloc("n", ((uuid("n", 0), 1000, 100),))
    assert c.assume("default/a", "a", first, 0.0).ok
    assert c.assume("default/b", "b", second, 0.0).ok
    third = alloc("n", ((uuid("n", 0), 1000, 100),))
    assert c.assume("default/c", "c", third, 0.0).reasons == (status.INSUFFICIENT_GPU_CORES,)


def test_unscaled_card_keeps_100_cores_exclusive_in_fit_and_cache() -> None:
    state = node("n").gpus(1).used(0, memory=1000, cores=0).state()
    got = fit.place(state, pod().gpu(1, memory=1000, cores=100).obj(), registry.get("spread"))
    assert got.status == status.Status(U, (status.EXCLUSIVE_CONFLICT,))
    c = caches.ClusterCache(nominator=nominations.Nominator())
    c.upsert_node(node("n").gpus(1).inventory())
    assert c.assume("default/a", "a", alloc("n", ((uuid("n", 0), 1000, 0),)), 0.0).ok
    verdict = c.assume("default/b", "b", alloc("n", ((uuid("n", 0), 1000, 100),)), 0.0)
    assert verdict.reasons == (status.EXCLUSIVE_CONFLICT,)


@pytest.mark.parametrize(
    ("req", "reason"),
    [
        # a 100-core task holds the card: memory is checked first, then cores, then the rule
        (pod().gpu(1, memory=81000).obj(), status.INSUFFICIENT_GPU_MEMORY),
        (pod().gpu(1, memory=1000, cores=10).obj(), status.INSUFFICIENT_GPU_CORES),
        (pod().gpu(1, memory=1000).obj(), status.EXCLUSIVE_CONFLICT),
    ],
)
def test_held_card_reasons_follow_hamis_order(req: requests.PodRequest, reason: str) -> None:
    state = node("n").gpus(1).used(0, memory=1000, cores=100).state()
    got = fit.place(state, req, registry.get("binpack"))
    assert got.status == status.Status(U, (reason,))


# ----- quota per card, with what the cache charges


def _charge(a: allocations.PodAllocation) -> tuple[int, int, int]:
    r = allocations.card_reservation(a)
    return (
        sum(u.slots for u in r.values()),
        sum(u.memory_mib for u in r.values()),
        sum(u.cores for u in r.values()),
    )


def test_init_and_app_container_share_a_card_to_stay_within_quota() -> None:
    # binpack: card 0 has 2920 MiB free, so the init container (5000) goes to card 1 and the app
    # container (1500) would go to the fuller card 0 - a charge of 6500 on a 6000 MiB quota
    state = node("n").gpus(2).used(0, memory=79000).state()
    req = pod().init_gpu(1, memory=5000).gpu(1, memory=1500).obj()
    free = fit.place(state, req, registry.get("binpack"))
    assert chosen(free, 0) == [uuid("n", 1)] and chosen(free, 1) == [uuid("n", 0)]
    got = fit.place(
        state, req, registry.get("binpack"), api.EMPTY_CONTEXT, quota.QuotaView(memory_limit=6000)
    )
    assert got.allocation is not None, got.status
    assert chosen(got, 0) == chosen(got, 1) == [uuid("n", 1)]
    assert _charge(got.allocation) == (1, 5000, 0)


def test_init_and_app_containers_that_need_two_cards_exceed_the_quota() -> None:
    state = node("n").gpus(2, memory=24000).state()
    qv = quota.QuotaView(memory_limit=6000)
    req = pod().init_gpu(1, memory=5000).gpu(2, memory=1500).obj()
    got = fit.place(state, req, registry.get("spread"), api.EMPTY_CONTEXT, qv)
    # however the namespace's other pods end, 6500 MiB never fits a 6000 MiB quota
    assert got.status == status.Status(status.Code.UNRESOLVABLE, (status.QUOTA_EXCEEDED,))
    assert fit.place(
        state, req, registry.get("spread"), api.EMPTY_CONTEXT, quota.QuotaView(memory_limit=6500)
    ).status.ok


@settings(max_examples=300, deadline=None)
@given(
    state=strategies.node_states(),
    req=strategies.pods(),
    limits=st.tuples(
        st.sampled_from((None, 1, 2, 4)),
        st.sampled_from((None, 2000, 8000, 30000)),
        st.sampled_from((None, 50, 100, 300)),
    ),
    used=st.tuples(st.integers(0, 2), st.sampled_from((0, 1000, 6000)), st.sampled_from((0, 30))),
    card_value=st.sampled_from(("spread", "binpack", "mutex,binpack", "numa,spread")),
)
def test_a_placed_pod_never_takes_its_namespace_past_the_quota(
    state: nodes.NodeState,
    req: requests.PodRequest,
    limits: tuple[int | None, int | None, int | None],
    used: tuple[int, int, int],
    card_value: str,
) -> None:
    qv = quota.QuotaView(
        count_limit=limits[0],
        memory_limit=limits[1],
        cores_limit=limits[2],
        used_count=used[0],
        used_memory=used[1],
        used_cores=used[2],
    )
    got = fit.place(state, req, registry.card_policy(card_value), api.EMPTY_CONTEXT, qv)
    if got.allocation is not None and req.wants_gpu:
        assert qv.admits(*_charge(got.allocation))


# ----- native sidecars (init containers with restartPolicy: Always) run beside the app


def _sidecar_pod(init_mib: int, app_mib: int) -> requests.PodRequest:
    base = pod().init_gpu(1, memory=init_mib).gpu(1, memory=app_mib).obj()
    return msgspec.structs.replace(base, sidecars=(0,))


def test_a_sidecar_and_an_app_container_do_not_share_memory_they_both_hold() -> None:
    state = node("n").gpus(1, memory=10000).state()
    plain_init = pod().init_gpu(1, memory=6000).gpu(1, memory=6000).obj()
    assert fit.place(state, plain_init, registry.get("spread")).status.ok
    got = fit.place(state, _sidecar_pod(6000, 6000), registry.get("spread"))
    assert got.status == status.Status(status.Code.UNRESOLVABLE, (status.INSUFFICIENT_GPU_MEMORY,))
    two = node("n").gpus(2, memory=10000).state()
    placed = fit.place(two, _sidecar_pod(6000, 6000), registry.get("spread"))
    assert placed.allocation is not None and placed.allocation.sidecars == (0,)
    assert chosen(placed, 0) != chosen(placed, 1)


def test_sidecars_are_charged_on_top_of_both_phases_and_stay_after_the_inits() -> None:
    a = uuid("n", 0)
    got = alloc("n", ((a, 2000, 10),), ((a, 5000, 0),), ((a, 1000, 0),), init_count=2)
    with_sidecar = msgspec.structs.replace(got, sidecars=(0,))
    assert allocations.card_reservation(got)[a] == nodes.CardUsage(slots=1, memory_mib=5000, cores=10)
    assert allocations.card_reservation(with_sidecar)[a] == nodes.CardUsage(
        slots=2, memory_mib=7000, cores=10
    )
    done = allocations.card_reservation(with_sidecar, inits_done=True)[a]
    assert done == nodes.CardUsage(slots=2, memory_mib=3000, cores=10)


def test_parse_pod_marks_native_sidecars() -> None:
    def c(name: str, mib: int, **extra: str) -> dict[str, object]:
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mib)}
        return {"name": name, "resources": {"limits": limits}, **extra}

    spec = {
        "initContainers": [c("setup", 1000), c("proxy", 2000, restartPolicy="Always")],
        "containers": [c("main", 3000)],
    }
    got = resources.parse_pod({"metadata": {"name": "p"}, "spec": spec})
    assert got.sidecars == (1,) and got.init_count == 2
