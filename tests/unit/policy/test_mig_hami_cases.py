"""HAMi v2.10's MIG test cases, run through gpuslice's own code.

Each test ports one case of HAMi's ``pkg/device/nvidia/mig_topology_test.go``,
``mig_profiles_test.go``, ``mig_capability_test.go``, ``pkg/scheduler/mig_allocation_test.go`` or the
MIG cases of ``pkg/device/nvidia/device_test.go`` (named in its docstring), with HAMi's inputs and
HAMi's expected outcome. Where gpuslice's way of saying it differs (a card treated as full rather
than marked unhealthy, a reason code's name) the test checks the same decision and docs/mig.md
lists the divergence.
"""

from __future__ import annotations

import msgspec
import pytest

from gpuslice.codec import errors, keys, mig_allocations, pod_devices, registrations
from gpuslice.framework import registry
from gpuslice.model import allocations, devices, mig, nodes, requests, status
from gpuslice.policy import api, cards, fit
from gpuslice.policy import mig as migs

P = mig.Placement
FIRST_FIT = api.Context(mig_rule=migs.FIRST_FIT)
SPREAD = registry.card_policy("spread")


def _a100_profiles() -> tuple[mig.Profile, ...]:
    """HAMi's ``a100MigProfiles()`` (``mig_capability_test.go``)."""
    return (
        mig.Profile(
            name="1g.5gb",
            memory_mib=5120,
            cores=14,
            slice_count=1,
            placements=tuple(P(s, 1) for s in range(7)),
        ),
        mig.Profile(
            name="2g.10gb", memory_mib=10240, cores=28, slice_count=2, placements=(P(0, 2), P(2, 2), P(4, 2))
        ),
        mig.Profile(name="3g.20gb", memory_mib=20480, cores=42, slice_count=3, placements=(P(0, 4), P(4, 4))),
    )


def _card(
    uuid: str = "GPU-a",
    profiles: tuple[mig.Profile, ...] | None = None,
    mode: str = devices.MODE_MIG,
    memory: int = 40960,
    count: int = 7,
) -> devices.GpuDevice:
    return devices.GpuDevice(
        uuid=uuid,
        type="NVIDIA A100-SXM4-40GB",
        memory_mib=memory,
        split_count=count,
        mode=mode,
        mig_profiles=_a100_profiles() if profiles is None else profiles,
    )


def _held(*slices: mig.Slice, profiles: tuple[mig.Profile, ...] | None = None) -> nodes.CardUsage:
    out = nodes.EMPTY_CARD
    for s in slices:
        prof = mig.find(profiles or _a100_profiles(), s.profile)
        assert prof is not None
        out = out.plus(nodes.CardUsage(1, prof.memory_mib, prof.cores, (s,)))
    return out


def _state(*cards_and_usage: tuple[devices.GpuDevice, nodes.CardUsage]) -> nodes.NodeState:
    inv = nodes.NodeInventory(name="n1", devices=tuple(c for c, _ in cards_and_usage))
    return nodes.NodeState(inventory=inv, usage=tuple(u for _, u in cards_and_usage))


def _pod(*containers: requests.ContainerRequest, mode: str | None = None) -> requests.PodRequest:
    sel = requests.NO_SELECTORS if mode is None else requests.Selectors(mode=mode)
    return requests.PodRequest(name="p", namespace="default", containers=containers, selectors=sel)


def _ctr(
    count: int = 1, memory: int = 0, pct: int = requests.MEMORY_PERCENTAGE_UNSET
) -> requests.ContainerRequest:
    return requests.ContainerRequest(count=count, memory_mib=memory, memory_percentage=pct)


def _slices(p: fit.Placement) -> list[tuple[str, mig.Slice | None]]:
    assert p.allocation is not None
    return [(g.uuid, g.mig) for c in p.allocation.containers for g in c]


# --- mig_topology_test.go -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("occupied", "requested", "feasible"),
    [
        ((), ("3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"), True),  # all-balanced geometry
        ((P(4, 4),), ("2g.10gb", "1g.5gb", "1g.5gb"), True),  # remaining balanced placements
        ((P(0, 4), P(4, 4)), ("1g.5gb",), False),  # nothing overlaps two active 3g
        ((P(0, 2), P(2, 2), P(4, 2)), ("2g.10gb",), False),  # no fourth 2g
    ],
)
def test_can_place_mig_profiles_a100(
    occupied: tuple[mig.Placement, ...], requested: tuple[str, ...], feasible: bool
) -> None:
    """``TestCanPlaceMigProfilesA100``: one container per requested profile, on one card."""
    profs = _a100_profiles()
    held = tuple(
        mig.Slice(p.start, p.size, next(x.name for x in profs if p in x.placements)) for p in occupied
    )
    state = _state((_card(), _held(*held)))
    by_name = {p.name: p for p in profs}
    pod = _pod(*(_ctr(memory=by_name[n].memory_mib) for n in requested), mode=devices.MODE_MIG)
    for ctx in (FIRST_FIT, api.EMPTY_CONTEXT):
        placed = fit.place(state, pod, SPREAD, ctx)
        assert placed.status.ok is feasible, ctx.mig_rule
        if feasible:
            got = [s for _, s in _slices(placed)]
            assert [s.profile for s in got if s] == list(requested)
            assert not mig.overlapping([*held, *(s for s in got if s)])


def test_select_mig_placement_uses_balanced_packing() -> None:
    """``TestSelectMigPlacementUsesBalancedPacking``: 3g at 4, 2g at 0, then 1g at 3 and 2."""
    dev = _card()
    taken = 0
    for profile, start in (("3g.20gb", 4), ("2g.10gb", 0), ("1g.5gb", 3), ("1g.5gb", 2)):
        s = migs.placement_for(dev, taken, profile)
        assert s is not None and s.start == start, profile
        taken |= migs.mask_of((s,))


def test_first_fit_is_hamis_sequence_through_fit() -> None:
    """The same sequence through ``fit.place`` with HAMi's rule (memory picks the profile)."""
    state = _state((_card(), nodes.EMPTY_CARD))
    for memory, want in (
        (20000, (4, "3g.20gb")),
        (10000, (0, "2g.10gb")),
        (5000, (3, "1g.5gb")),
        (5000, (2, "1g.5gb")),
    ):
        placed = fit.place(state, _pod(_ctr(memory=memory)), SPREAD, FIRST_FIT)
        ((_, s),) = _slices(placed)
        assert s is not None and (s.start, s.profile) == want
        assert placed.allocation is not None
        state = allocations.apply(state, placed.allocation)


# --- mig_profiles_test.go -------------------------------------------------------------------


def test_encode_decode_mig_allocations() -> None:
    """``TestEncodeDecodeMigAllocations``, and the bytes Go's ``json.Marshal`` writes."""
    grant = allocations.DeviceGrant("GPU-a", 5120, 14, mig=mig.Slice(6, 1, "1g.5gb"))
    alloc = allocations.PodAllocation(node="n1", containers=((grant,),))
    raw = mig_allocations.encode_allocation(alloc)
    assert raw == (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",'
        '"placement":{"start":6,"size":1}}]'
    )
    (r,) = mig_allocations.decode(raw)
    assert (r.container, r.device, r.gpu_uuid, r.profile, r.slice) == (
        0,
        0,
        "GPU-a",
        "1g.5gb",
        mig.Slice(6, 1, "1g.5gb"),
    )


def test_decode_mig_allocations_rejects_duplicate_device_index() -> None:
    """``TestDecodeMigAllocationsRejectsDuplicateDeviceIndex``."""
    raw = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1}},'
        '{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":5,"size":1}}]'
    )
    with pytest.raises(errors.DecodeError, match="duplicate MIG allocation for container 0 device 0"):
        mig_allocations.decode(raw)


def test_decode_mig_allocations_preserves_zero_runtime_instance_ids() -> None:
    """``TestDecodeMigAllocationsPreservesZeroRuntimeInstanceIDs``, and re-encoding keeps the zero."""
    raw = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb","placement":{"start":0,"size":2},'
        '"migUUID":"MIG-a","gpuInstanceID":4,"computeInstanceID":0}]'
    )
    (r,) = mig_allocations.decode(raw)
    assert (r.gpu_instance, r.compute_instance, r.mig_uuid, r.realised) == (4, 0, "MIG-a", True)
    assert mig_allocations.encode([r]) == raw


def test_decode_mig_allocations_rejects_partial_runtime_identity() -> None:
    """``TestDecodeMigAllocationsRejectsPartialRuntimeIdentity``."""
    raw = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb",'
        '"placement":{"start":0,"size":2},"migUUID":"MIG-a"}]'
    )
    with pytest.raises(errors.DecodeError, match="partial runtime identity"):
        mig_allocations.decode(raw)


# --- mig_capability_test.go -----------------------------------------------------------------


def test_add_resource_usage_uses_reported_profile_and_placement() -> None:
    """``TestAddResourceUsageUsesReportedProfileAndPlacement``: 10000 MiB -> 2g.10gb at 0, 10240/28."""
    placed = fit.place(_state((_card(), nodes.EMPTY_CARD)), _pod(_ctr(memory=10000)), SPREAD, FIRST_FIT)
    assert placed.allocation is not None
    ((g,),) = placed.allocation.containers
    assert (g.uuid, g.memory_mib, g.cores, g.mig) == ("GPU-a", 10240, 28, mig.Slice(0, 2, "2g.10gb"))


def _three_2g() -> nodes.CardUsage:
    return _held(mig.Slice(0, 2, "2g.10gb"), mig.Slice(2, 2, "2g.10gb"), mig.Slice(4, 2, "2g.10gb"))


def test_custom_filter_uses_reported_placement_capacity() -> None:
    """``TestCustomFilterUsesReportedPlacementCapacity``: no fourth 2g; a 1g still fits (slice 6)."""
    dev, used = _card(), _three_2g()
    assert cards.mig_reason(dev, used, 10000, 0) == status.MIG_PLACEMENT_INFEASIBLE
    assert cards.mig_reason(dev, used, 5000, 0) is None
    assert migs.first_fit(dev, migs.occupied(dev, used), 5000) == mig.Slice(6, 1, "1g.5gb")


def test_custom_filter_ignores_queued_allocations_for_other_gpus() -> None:
    """``TestCustomFilterIgnoresQueuedAllocationsForOtherGPUs``.

    HAMi's queued allocation is an earlier instance of the same container. Two instances of
    5000 MiB on a node where GPU-a has one free placement: one there and one on GPU-b fits;
    without GPU-b the second has nowhere to go.
    """
    pod = _pod(_ctr(count=2, memory=5000))
    both = _state((_card("GPU-a"), _three_2g()), (_card("GPU-b"), nodes.EMPTY_CARD))
    for ctx in (FIRST_FIT, api.EMPTY_CONTEXT):
        placed = fit.place(both, pod, SPREAD, ctx)
        assert placed.status.ok
        got = _slices(placed)
        assert sum(1 for u, _ in got if u == "GPU-a") <= 1
    alone = _state((_card("GPU-a"), _three_2g()))
    placed = fit.place(alone, pod, SPREAD, FIRST_FIT)
    assert not placed.status.ok and placed.status.reasons == (status.MIG_PLACEMENT_INFEASIBLE,)


def test_fit_uses_effective_percentage_memory_for_mig_placement() -> None:
    """``TestFitUsesEffectivePercentageMemoryForMigPlacement``: 25 % of 40960 needs a 2g; a 1g is left."""
    placed = fit.place(_state((_card(), _three_2g())), _pod(_ctr(pct=25)), SPREAD, FIRST_FIT)
    assert not placed.status.ok
    assert placed.status.reasons == (status.MIG_PLACEMENT_INFEASIBLE,)


# --- pkg/scheduler/mig_allocation_test.go ---------------------------------------------------


def _single_1g_card(*starts: int) -> devices.GpuDevice:
    prof = mig.Profile(name="1g.5gb", memory_mib=5120, cores=14, placements=tuple(P(s, 1) for s in starts))
    return _card(profiles=(prof,))


def _rebuilt(annotations: dict[str, str], card: devices.GpuDevice) -> nodes.CardUsage:
    base = {"hami.io/vgpu-node": "n1", "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,5120,14:;"}
    alloc = pod_devices.allocation_from_annotations({**base, **annotations}, container_count=1)
    assert alloc is not None
    state = allocations.apply(nodes.empty_state(nodes.NodeInventory(name="n1", devices=(card,))), alloc)
    return state.usage[0]


def test_get_nodes_usage_restores_mig_allocation_by_profile_and_placement() -> None:
    """``TestGetNodesUsageRestoresMigAllocationByProfileAndPlacement`` (runtime identity included)."""
    raw = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1},'
        '"migUUID":"MIG-a","gpuInstanceID":7,"computeInstanceID":0}]'
    )
    card = _single_1g_card(6)
    used = _rebuilt({keys.MIG_ALLOCATIONS: raw}, card)
    assert used.mig == (mig.Slice(6, 1, "1g.5gb"),)
    (r,) = mig_allocations.decode(raw)
    assert (r.mig_uuid, r.gpu_instance, r.compute_instance, r.realised) == ("MIG-a", 7, 0, True)
    assert not migs.fits(card, used, 1)  # its only placement is held


def test_get_nodes_usage_fails_closed_without_mig_allocation() -> None:
    """``TestGetNodesUsageFailsClosedWithoutMigAllocation``.

    HAMi marks the card unhealthy; gpuslice treats it as full (documented divergence): no new
    instance is handed out on it either way.
    """
    card = _single_1g_card(0, 1, 2, 3, 4, 5, 6)
    used = _rebuilt({}, card)
    assert used.slots == 1 and used.mig == ()
    assert migs.occupied(card, used) == migs.mask_of((mig.Slice(0, 8, "?"),)) >> 1 or not migs.fits(
        card, used, 1
    )
    assert cards.mig_reason(card, used, 1000, 0) == status.MIG_PLACEMENT_INFEASIBLE


def test_get_nodes_usage_restores_unconsumed_mig_reservations() -> None:
    """``TestGetNodesUsageRestoresUnconsumedMigReservations``: two records, one device entry."""
    raw = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1}},'
        '{"containerIndex":0,"deviceIndex":1,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":5,"size":1}}]'
    )
    card = _single_1g_card(5, 6)
    used = _rebuilt({keys.MIG_ALLOCATIONS: raw}, card)
    assert used.mig == (mig.Slice(5, 1, "1g.5gb"), mig.Slice(6, 1, "1g.5gb"))
    assert migs.occupied(card, used) == migs.mask_of(used.mig)  # known placements: not failed closed


@pytest.mark.parametrize(
    ("mode", "card_modes", "pod_mode", "want_count_check"),
    [
        ("explicit HAMi-core mode", (devices.MODE_MIG,), devices.MODE_HAMI_CORE, True),
        ("MIG mode without annotation", (devices.MODE_MIG,), None, False),
        ("MIG mode annotation", (devices.MODE_MIG,), devices.MODE_MIG, False),
        ("no MIG device", (devices.MODE_HAMI_CORE,), None, True),
    ],
)
def test_is_mig_request(
    mode: str, card_modes: tuple[str, ...], pod_mode: str | None, want_count_check: bool
) -> None:
    """``TestIsMIGRequest``: when a request for more cards than the node has may still fit.

    (Its "non-NVIDIA request" case has no counterpart: gpuslice schedules NVIDIA cards only.)
    """
    state = _state(*((_card(f"GPU-{k}", mode=m), nodes.EMPTY_CARD) for k, m in enumerate(card_modes)))
    placed = fit.place(state, _pod(_ctr(count=2, memory=4000), mode=pod_mode), SPREAD, FIRST_FIT)
    if want_count_check:
        assert placed.status.reasons == (status.INSUFFICIENT_GPU_COUNT,), mode
    else:
        assert placed.status.ok, mode


def test_fit_in_devices_allows_multiple_mig_placements_on_single_gpu() -> None:
    """``TestFitInDevicesAllowsMultipleMigPlacementsOnSingleGPU``."""
    state = _state((_single_1g_card(*range(7)), nodes.EMPTY_CARD))
    for ctx in (FIRST_FIT, api.EMPTY_CONTEXT):
        placed = fit.place(state, _pod(_ctr(count=2, memory=4000), mode=devices.MODE_MIG), SPREAD, ctx)
        got = _slices(placed)
        assert [u for u, _ in got] == ["GPU-a", "GPU-a"]
        assert got[0][1] != got[1][1]


def test_fit_in_devices_rejects_insufficient_mig_placements_on_single_gpu() -> None:
    """``TestFitInDevicesRejectsInsufficientMigPlacementsOnSingleGPU``: one placement, two asked."""
    state = _state((_single_1g_card(6), nodes.EMPTY_CARD))
    placed = fit.place(state, _pod(_ctr(count=2, memory=4000), mode=devices.MODE_MIG), SPREAD, FIRST_FIT)
    assert not placed.status.ok
    assert placed.card_reasons == ((status.MIG_PLACEMENT_INFEASIBLE, 1),)


def test_fit_in_devices_retains_physical_count_check_for_non_mig_gpu() -> None:
    """``TestFitInDevicesRetainsPhysicalCountCheckForNonMigGPU``."""
    state = _state((_card(mode=devices.MODE_HAMI_CORE, profiles=()), nodes.EMPTY_CARD))
    placed = fit.place(
        state, _pod(_ctr(count=2, memory=4000), mode=devices.MODE_HAMI_CORE), SPREAD, FIRST_FIT
    )
    assert placed.status.reasons == (status.INSUFFICIENT_GPU_COUNT,)


# --- device_test.go (MIG cases) -------------------------------------------------------------


def test_get_node_devices_mig_profiles_from_node() -> None:
    """``TestGetNodeDevices_MigProfilesFromNode`` (extra keys such as ``instanceCount`` ignored)."""
    raw = (
        '[{"id":"GPU-0","count":7,"devmem":40960,"devcore":100,"type":"NVIDIA-A100-SXM4-40GB","numa":0,"health":true,'
        '"mode":"mig","migProfiles":[{"name":"1g.5gb","memoryMB":5120,"core":14,"sliceCount":1,"instanceCount":7,'
        '"multiprocessorCount":14,"placements":[{"start":6,"size":1}]}]}]'
    )
    (card,) = registrations.decode(raw)
    assert card.is_mig and len(card.mig_profiles) == 1
    assert card.mig_profiles[0].name == "1g.5gb" and card.mig_profiles[0].placements == (P(6, 1),)


def test_fit_mig_percentage_request_rejects_undersized_template() -> None:
    """``TestFit_MigPercentageRequestRejectsUndersizedTemplate``.

    HAMi's card carries only a deprecated template and no profiles: nothing serves 50 % of it.
    """
    card = _card(profiles=(), memory=8192, count=1)
    pod = _pod(requests.ContainerRequest(count=1, memory_percentage=50, cores=10))
    placed = fit.place(_state((card, nodes.EMPTY_CARD)), pod, SPREAD, FIRST_FIT)
    assert not placed.status.ok and placed.status.reasons == (status.MIG_PLACEMENT_INFEASIBLE,)


def test_check_type_allocate_mode() -> None:
    """``TestCheckType_AllocateMode``: the annotation must contain the card's mode."""
    assert not cards.mode_matches(devices.MODE_HAMI_CORE, "mps")
    assert cards.mode_matches(devices.MODE_HAMI_CORE, "hami-core")


def test_custom_filter_rule_non_mig() -> None:
    """``TestCustomFilterRule_NonMig``: a card not in MIG mode never meets the MIG rule."""
    card = _card(mode="", profiles=())
    placed = fit.place(_state((card, nodes.EMPTY_CARD)), _pod(_ctr(memory=1000)), SPREAD, FIRST_FIT)
    assert placed.status.ok and _slices(placed) == [("GPU-a", None)]


def test_registration_round_trip_keeps_profiles() -> None:
    """What the agent publishes decodes to the same cards (HAMi's key order, null placements kept)."""
    card = _card()
    again = registrations.decode(registrations.encode_json([card]))
    assert again == (msgspec.structs.replace(card, index=0),)
