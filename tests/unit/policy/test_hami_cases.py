"""HAMi's own unit-test cases, run through gpuslice's real code.

Each case names the HAMi test (file, function, case name) it ports, the input in gpuslice's terms
and the outcome HAMi's test asserts, with HAMi's reasons mapped to gpuslice's:
CardInsufficientMemory -> InsufficientGPUMemory, CardInsufficientCore -> InsufficientGPUCores,
CardTimeSlicingExhausted -> GPUSlotsExhausted, ExclusiveDeviceAllocateConflict and
CardComputeUnitsExhausted -> ExclusiveConflict, CardTypeMismatch -> DeviceTypeMismatch,
CardUuidMismatch -> UUIDFiltered, CardCordoned -> DeviceCordoned, NumaNotFit -> NUMAUnsatisfied,
ResourceQuotaNotFit -> QuotaExceeded, CardNotHealth -> DeviceUnhealthy, node unregistered ->
NodeUnregistered, NodeInsufficientDevice (and AllocatedCardsInsufficientRequest, which HAMi's
``fitInDevices`` never reaches for a count above the node's cards) -> InsufficientGPUCount.

HAMi's ``Fit`` reports ``n/m Reason`` per card; gpuslice's ``Placement.card_reasons`` holds the
same counts, and they are compared where HAMi's test spells them out.

``differs`` marks a case where gpuslice deliberately behaves otherwise (the reason says how); the
case then asserts gpuslice's documented behaviour. ``xfail`` marks a case where gpuslice disagrees
for any other reason: it runs with HAMi's expectation under ``xfail(strict=True)``, so the file
passes while the disagreement stays visible (and turns into a failure once the code agrees).

HAMi sources (github.com/Project-HAMi/HAMi): ``pkg/device/nvidia/device_test.go``,
``pkg/device/quota_test.go``, ``pkg/device/initcontainer_test.go``,
``pkg/device/initcontainer_usage_test.go``, ``pkg/scheduler/policy/gpu_policy_test.go``,
``pkg/scheduler/policy/node_policy_test.go``, ``pkg/scheduler/numa_refit_test.go``,
``pkg/scheduler/*placement*_test.go``, ``pkg/util/*_test.go`` and ``test/e2e/policy``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from gpuslice.cache import cache as caches
from gpuslice.codec import errors, keys, resources
from gpuslice.framework import nominations, profile, registry
from gpuslice.kube import objects
from gpuslice.model import allocations, devices, nodes, requests, status, topology
from gpuslice.model import config as model_config
from gpuslice.policy import api, fit, usage
from gpuslice.policy import quota as quotas
from tests.unit.builders import A100, alloc, node, pod

pytestmark = pytest.mark.unit

U, R = status.Code.UNSCHEDULABLE, status.Code.UNRESOLVABLE
IGM, IGC, COUNT = status.INSUFFICIENT_GPU_MEMORY, status.INSUFFICIENT_GPU_CORES, status.INSUFFICIENT_GPU_COUNT
SLOTS, EXCL, TYPE = status.GPU_SLOTS_EXHAUSTED, status.EXCLUSIVE_CONFLICT, status.DEVICE_TYPE_MISMATCH
UUIDF, SICK, CORDON = status.UUID_FILTERED, status.DEVICE_UNHEALTHY, status.DEVICE_CORDONED
NUMA, QUOTA, UNREG = status.NUMA_UNSATISFIED, status.QUOTA_EXCEEDED, status.NODE_UNREGISTERED

REFUSED = "refused"
"""Expected outcome: the input is refused (``DecodeError`` / ``UnknownPolicyError``)."""

DEVICE_TEST = "pkg/device/nvidia/device_test.go"
REFIT_TEST = "pkg/scheduler/numa_refit_test.go"
E2E_POLICY = "test/e2e/policy (policy e2e)"

TIE_BREAK = (
    "tie between equal cards: HAMi's Fit scans the sorted card list from its end, so the last "
    "equal card wins; gpuslice takes the lowest index, as HAMi's v2.10 documentation describes"
)
REFUSE_PCT = "gpuslice refuses a percentage outside 0..100 at parse time (InvalidRequest) instead"
REFUSE_AMOUNT = (
    "gpuslice refuses the pod at parse time (InvalidRequest naming gpumem) instead of reading the "
    "container as asking for no GPU"
)


def pytest_param(case: Any) -> Any:
    """A case as a pytest parameter, ``xfail(strict=True)`` when it names a disagreement."""
    marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
    return pytest.param(case, id=case.source, marks=marks)


# ----- node and pod builders in HAMi's terms


@dataclasses.dataclass(frozen=True)
class Dev:
    """HAMi's ``DeviceUsage`` fields (``Count`` = slots, ``Totalmem``/``Totalcore`` = capacity)."""

    id: str
    used: int = 0
    count: int = 10
    usedmem: int = 0
    totalmem: int = 8192
    totalcore: int = 100
    usedcores: int = 0
    numa: int = 0
    health: bool = True
    type: str = A100


def hnode(
    *devs: Dev, name: str = "n", cordon: Sequence[str] = (), topo: topology.Topology | None = None
) -> nodes.NodeState:
    b = node(name)
    for i, d in enumerate(devs):
        b.card(
            model=d.type,
            memory=d.totalmem,
            cores=d.totalcore,
            slots=d.count,
            numa=d.numa,
            health=d.health,
            uuid_=d.id,
        )
        if d.used or d.usedmem or d.usedcores:
            b.used(i, memory=d.usedmem, cores=d.usedcores, slots=d.used)
    for uuid in cordon:
        b.cordon([d.id for d in devs].index(uuid))
    if topo is not None:
        b.topo(topo)
    return b.state()


def links(
    uuids: Sequence[str], pairs: Mapping[tuple[int, int], tuple[topology.PcieLevel, int]]
) -> topology.Topology:
    """A topology from ``(i, j) -> (PCIe level, NVLinks)``; HAMi's pair score is level + 100 per link."""
    n = len(uuids)

    def rel(i: int, j: int) -> tuple[topology.PcieLevel, int]:
        if i == j:
            return topology.PcieLevel.INTERNAL, 0
        return pairs[(min(i, j), max(i, j))]

    return topology.Topology(
        uuids=tuple(uuids),
        nvlinks=tuple(tuple(rel(i, j)[1] for j in range(n)) for i in range(n)),
        pcie=tuple(tuple(rel(i, j)[0] for j in range(n)) for i in range(n)),
        p2p=tuple(tuple(i != j for j in range(n)) for i in range(n)),
    )


def container(
    limits: Mapping[str, object] | None = None, reqs: Mapping[str, object] | None = None
) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if limits:
        res["limits"] = dict(limits)
    if reqs:
        res["requests"] = dict(reqs)
    return {"name": "c", "resources": res}


def pod_dict(
    *app: dict[str, Any],
    init: Sequence[dict[str, Any]] = (),
    annotations: Mapping[str, str] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{**c, "name": f"app{i}"} for i, c in enumerate(app)] or [{"name": "app0"}]
    }
    if init:
        spec["initContainers"] = [{**c, "name": f"init{i}"} for i, c in enumerate(init)]
    return {
        "metadata": {"name": "p", "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": spec,
    }


def gpu(
    count: int = 1, *, mem: int | None = None, pct: object = None, cores: int | None = None
) -> dict[str, Any]:
    limits: dict[str, object] = {"nvidia.com/gpu": str(count)}
    if mem is not None:
        limits["nvidia.com/gpumem"] = str(mem)
    if pct is not None:
        limits["nvidia.com/gpumem-percentage"] = str(pct)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    return container(limits)


def parsed(*app: dict[str, Any], **kw: Any) -> requests.PodRequest:
    return resources.parse_pod(pod_dict(*app, **kw))


def picked(p: fit.Placement) -> list[list[str]]:
    assert p.allocation is not None, p.status
    return [sorted(g.uuid for g in c) for c in p.allocation.containers if c]


# ----- per-card fit, exclusivity, selectors, topology, NUMA, quota: fit.place


@dataclasses.dataclass(frozen=True)
class FitCase:
    source: str
    state: nodes.NodeState
    pod: requests.PodRequest
    policy: str = "spread"
    quota: quotas.QuotaView | None = None
    cards: tuple[tuple[str, ...], ...] | None = None
    """On success, the cards per GPU container (compared as sets) where HAMi's test asserts them."""
    reasons: tuple[str, ...] = ()
    """Empty: the pod fits. Else the node's reasons, exactly."""
    card_reasons: fit.CardReasons | None = None
    grants: tuple[tuple[int, int], ...] | None = None
    """(memory, cores) of the first GPU container's grants."""
    code: status.Code | None = None
    differs: str | None = None
    xfail: str | None = None


def _one(n: int, **kw: Any) -> tuple[Dev, ...]:
    return tuple(Dev(f"dev-{i}", **kw) for i in range(n))


_F = "TestDevices_Fit"
_FIT_DEV: dict[str, Any] = {"count": 100, "totalmem": 1280}


def fdev(id_: str, **kw: Any) -> Dev:
    """A card of HAMi's TestDevices_Fit: 100 slots, 1280 MiB."""
    return Dev(id_, **{**_FIT_DEV, **kw})


FIT_CASES = [
    FitCase(
        f"{DEVICE_TEST} {_F}/fit success",
        hnode(*_one(2, count=100, totalmem=128)),
        pod().gpu(1, memory=64, cores=50).obj(),
        cards=(("dev-0",),),
        differs=TIE_BREAK,
    ),
    FitCase(
        f"{DEVICE_TEST} {_F}/fit fail: memory not enough",
        hnode(Dev("dev-0", count=100, totalmem=128)),
        pod().gpu(1, memory=512, cores=50).obj(),
        reasons=(IGM,),
        card_reasons=((IGM, 1),),
        code=R,
    ),
    FitCase(
        f"{DEVICE_TEST} {_F}/fit fail: core not enough",
        hnode(Dev("dev-0", count=100, totalmem=1024, usedcores=100)),
        pod().gpu(1, memory=512, cores=50).obj(),
        reasons=(IGC,),
        card_reasons=((IGC, 1),),
        code=U,
    ),
    FitCase(
        f"{DEVICE_TEST} {_F}/fit fail: type mismatch (request type OtherType, as use-gputype)",
        hnode(Dev("dev-0", count=100, totalmem=128)),
        pod().gpu(1, memory=64, cores=50).types("OtherType").obj(),
        reasons=(TYPE,),
        card_reasons=((TYPE, 1),),
        code=R,
    ),
    FitCase(
        f"{DEVICE_TEST} {_F}/fit fail: user assign use uuid mismatch (2 cards asked of 1: fitInDevices)",
        hnode(fdev("dev-1")),
        pod().gpu(2, memory=512, cores=50).uuids("dev-0").obj(),
        reasons=(COUNT,),
        code=R,
    ),
    FitCase(
        f"{DEVICE_TEST} {_F}/fit fail: user assign use uuid mismatch (1 card)",
        hnode(fdev("dev-1")),
        pod().gpu(1, memory=512, cores=50).uuids("dev-0").obj(),
        reasons=(UUIDF,),
        card_reasons=((UUIDF, 1),),
        code=R,
    ),
    FitCase(
        f"{DEVICE_TEST} {_F}/fit fail: user assign no use uuid match (1 card)",
        hnode(fdev("dev-0")),
        pod().gpu(1, memory=512, cores=50).nouse_uuids("dev-0").obj(),
        reasons=(UUIDF,),
        card_reasons=((UUIDF, 1),),
        code=R,
    ),
    FitCase(
        f"{DEVICE_TEST} {_F}/fit fail: card overused",
        hnode(fdev("dev-0", used=100)),
        pod().gpu(1, memory=512, cores=50).obj(),
        reasons=(SLOTS,),
        card_reasons=((SLOTS, 1),),
        code=U,
    ),
    FitCase(
        f"{DEVICE_TEST} {_F}/fit success: but core limit can't exceed 100",
        hnode(fdev("dev-0")),
        pod().gpu(1, memory=512, cores=120).obj(),
        cards=(("dev-0",),),
        grants=((512, 100),),
    ),
    FitCase(
        f"{DEVICE_TEST} {_F}/fit fail:  card exclusively",
        hnode(fdev("dev-0", used=20)),
        pod().gpu(1, memory=512, cores=100).obj(),
        reasons=(EXCL,),
        card_reasons=((EXCL, 1),),
        code=U,
    ),
    FitCase(
        f"{DEVICE_TEST} {_F}/fit fail:  CardComputeUnitsExhausted",
        hnode(fdev("dev-0", used=20, usedcores=100)),
        pod().gpu(1, memory=512, cores=0).obj(),
        reasons=(EXCL,),
        card_reasons=((EXCL, 1),),
        code=U,
    ),
    FitCase(
        f"{DEVICE_TEST} {_F}/fit fail:  AllocatedCardsInsufficientRequest"
        " (fitInDevices: NodeInsufficientDevice)",
        hnode(fdev("dev-0", used=20, usedcores=10)),
        pod().gpu(2, memory=512, cores=20).obj(),
        reasons=(COUNT,),
        code=R,
    ),
    FitCase(
        f"{DEVICE_TEST} {_F}/fit fail: partial allocation AllocatedCardsInsufficientRequest"
        " for multiple cards",
        hnode(*_one(2, **_FIT_DEV)),
        pod().gpu(3, memory=512, cores=20).obj(),
        reasons=(COUNT,),
        code=R,
    ),
    FitCase(
        f"{DEVICE_TEST} {_F}/fit success:  memory percentage",
        hnode(fdev("dev-0", used=20, usedcores=10)),
        pod().gpu(1, pct=10, cores=20).obj(),
        cards=(("dev-0",),),
        grants=((128, 20),),
    ),
    FitCase(
        f"{DEVICE_TEST} {_F}/fit fail:  CardNotHealth",
        hnode(fdev("dev-0", used=20, usedcores=10, health=False)),
        pod().gpu(1, pct=10, cores=20).obj(),
        reasons=(SICK,),
        card_reasons=((SICK, 1),),
        code=R,
    ),
    # ----- TestFit_DeviceCordon
    FitCase(
        f"{DEVICE_TEST} TestFit_DeviceCordon/cordoned device is skipped, healthy sibling still fits",
        hnode(*_one(2, count=100, totalmem=128), cordon=("dev-1",)),
        pod().gpu(1, memory=64, cores=50).obj(),
        cards=(("dev-0",),),
    ),
    FitCase(
        f"{DEVICE_TEST} TestFit_DeviceCordon/cordoned device is skipped (mirrored: dev-0 cordoned)",
        hnode(*_one(2, count=100, totalmem=128), cordon=("dev-0",)),
        pod().gpu(1, memory=64, cores=50).obj(),
        cards=(("dev-1",),),
    ),
    FitCase(
        f"{DEVICE_TEST} TestFit_DeviceCordon/all devices cordoned fails with CardCordoned reason",
        hnode(*_one(2, count=100, totalmem=128), cordon=("dev-0", "dev-1")),
        pod().gpu(1, memory=64, cores=50).obj(),
        reasons=(CORDON,),
        card_reasons=((CORDON, 2),),
        code=R,
    ),
    FitCase(
        f"{DEVICE_TEST} TestFit_DeviceCordon/running pods on a cordoned device are unaffected",
        hnode(
            Dev("dev-0", count=100, totalmem=128),
            Dev("dev-1", count=100, totalmem=128, used=1, usedcores=50, usedmem=64),
            cordon=("dev-1",),
        ),
        pod().gpu(1, memory=64, cores=50).obj(),
        cards=(("dev-0",),),
    ),
    FitCase(
        f"{DEVICE_TEST} TestFit_DeviceCordon/no annotation or no node info means nothing cordoned",
        hnode(*_one(2, count=100, totalmem=128)),
        pod().gpu(1, memory=64, cores=50).obj(),
    ),
    # ----- TestZeroMemoryPercentageIsAccountedAsWholeCard (parsed from the container)
    FitCase(
        f"{DEVICE_TEST} TestZeroMemoryPercentageIsAccountedAsWholeCard/empty card books the whole card",
        hnode(Dev("dev-0", totalmem=11264)),
        parsed(gpu(1, pct=0)),
        cards=(("dev-0",),),
        grants=((11264, 0),),
    ),
    FitCase(
        f"{DEVICE_TEST} TestZeroMemoryPercentageIsAccountedAsWholeCard/an almost full card must not fit",
        hnode(Dev("dev-0", totalmem=11264, usedmem=11260)),
        parsed(gpu(1, pct=0)),
        reasons=(IGM,),
    ),
    # ----- TestFit_MemoryPercentageValidation (valid values; the invalid ones are PARSE_CASES)
    *[
        FitCase(
            f"{DEVICE_TEST} TestFit_MemoryPercentageValidation/{name}",
            hnode(Dev("GPU-0")),
            parsed(gpu(1, pct=raw)),
            grants=((want, cores),),
        )
        # 100 % without gpucores is a whole card: the webhook rule adds 100 cores (HAMi's webhook too)
        for name, raw, want, cores in (
            ("50% memory fits", 50, 4096, 0),
            ("100% memory fits", 100, 8192, 100),
            ("0% memory defaults to 100%", 0, 8192, 0),
        )
    ],
    # ----- TestFit_NumaSwitching, TestFit_MutexPolicy
    FitCase(
        f"{DEVICE_TEST} TestFit_NumaSwitching",
        hnode(Dev("dev-0", numa=1), Dev("dev-1", numa=1), Dev("dev-2", numa=0)),
        pod().gpu(2, memory=100, cores=10).numa_bind().obj(),
        cards=(("dev-0", "dev-1"),),
    ),
    FitCase(
        f"{DEVICE_TEST} TestFit_MutexPolicy/mutex skips the used device",
        hnode(Dev("used", used=1), Dev("idle")),
        pod().gpu(1, memory=100, cores=10).obj(),
        policy="mutex",
        cards=(("idle",),),
    ),
    FitCase(
        f"{DEVICE_TEST} TestFit_MutexPolicy/mutex cannot satisfy 2 cards when only one is idle",
        hnode(Dev("used", used=1), Dev("idle")),
        pod().gpu(2, memory=100, cores=10).obj(),
        policy="mutex",
        reasons=(EXCL,),
        card_reasons=((EXCL, 1),),
    ),
    # ----- topology-aware (pair scores: 0-1 lowest, 1-2 middle, 0-2 highest, as in HAMi's tests)
    FitCase(
        f"{DEVICE_TEST} TestFit_TopologyExactMatch",
        hnode(*_one(2)),
        pod().gpu(2, memory=100, cores=10).obj(),
        policy="topology-aware",
        cards=(("dev-0", "dev-1"),),
    ),
    *[
        FitCase(
            f"{DEVICE_TEST} {name}",
            hnode(
                *_one(3),
                topo=links(
                    ("dev-0", "dev-1", "dev-2"),
                    {
                        (0, 1): (topology.PcieLevel.SYSTEM, 0),  # 10
                        (1, 2): (topology.PcieLevel.SINGLE, 0),  # 50
                        (0, 2): (topology.PcieLevel.SINGLE, 1),  # 150
                    },
                ),
            ),
            pod().gpu(count, memory=100, cores=10).obj(),
            policy="topology-aware",
            cards=(want,),
        )
        for name, count, want in (
            ("TestFit_TopologyWorstSingleCard", 1, ("dev-1",)),
            ("TestFit_TopologyBestCombination", 2, ("dev-0", "dev-2")),
        )
    ],
    FitCase(
        f"{DEVICE_TEST} TestFit_TopologyBestCombinationZeroScores (no pair scores)",
        hnode(*_one(3)),
        pod().gpu(2, memory=100, cores=10).obj(),
        policy="topology-aware",
    ),
    # ----- pkg/scheduler/numa_refit_test.go (the allowed set as nvidia.com/use-gpuuuid)
    FitCase(
        f"{REFIT_TEST} TestFitInRestrictedDevicesHonorsPolicyOrdering/unrestricted binpack",
        hnode(
            Dev("GPU-a", used=3, totalmem=40000, usedmem=30000, usedcores=30),
            Dev("GPU-b", used=2, totalmem=40000, usedmem=20000, usedcores=20),
            Dev("GPU-c", used=1, totalmem=40000, usedmem=10000, usedcores=10, numa=1),
        ),
        pod().gpu(1, memory=4096, cores=10).obj(),
        policy="binpack",
        cards=(("GPU-a",),),
    ),
    FitCase(
        f"{REFIT_TEST} TestFitInRestrictedDevicesHonorsPolicyOrdering/restricted binpack",
        hnode(
            Dev("GPU-a", used=3, totalmem=40000, usedmem=30000, usedcores=30),
            Dev("GPU-b", used=2, totalmem=40000, usedmem=20000, usedcores=20),
            Dev("GPU-c", used=1, totalmem=40000, usedmem=10000, usedcores=10, numa=1),
        ),
        pod().gpu(1, memory=4096, cores=10).uuids("GPU-b", "GPU-c").obj(),
        policy="binpack",
        cards=(("GPU-b",),),
    ),
    FitCase(
        f"{REFIT_TEST} TestFitInRestrictedDevicesMultiGPUWithoutNumaBind",
        hnode(
            Dev("GPU-a", used=3, totalmem=40000, usedmem=30000, usedcores=30),
            Dev("GPU-b", used=2, totalmem=40000, usedmem=20000, usedcores=20),
            Dev("GPU-c", used=1, totalmem=40000, usedmem=10000, usedcores=10, numa=1),
        ),
        pod().gpu(2, memory=4096, cores=10).uuids("GPU-b", "GPU-c").obj(),
        policy="binpack",
        cards=(("GPU-b", "GPU-c"),),
    ),
    FitCase(
        f"{REFIT_TEST} TestFitInRestrictedDevicesEnforcesCapacity",
        hnode(Dev("GPU-a", totalmem=40000), Dev("GPU-b", used=9, totalmem=8192, usedmem=8000, usedcores=20)),
        pod().gpu(1, memory=4096, cores=10).uuids("GPU-b").obj(),
        policy="binpack",
        reasons=(IGM, UUIDF),  # HAMi's refit sees GPU-b alone: 1/1 CardInsufficientMemory
        card_reasons=((IGM, 1), (UUIDF, 1)),
    ),
    FitCase(
        f"{REFIT_TEST} TestFitInRestrictedDevicesMutexPolicy/idle allowed device",
        hnode(
            Dev("GPU-a", used=1, totalmem=40000, usedmem=10000, usedcores=10),
            Dev("GPU-b", totalmem=40000),
            Dev("GPU-c", used=2, totalmem=40000, usedmem=20000, usedcores=20, numa=1),
        ),
        pod().gpu(1, memory=4096, cores=10).uuids("GPU-a", "GPU-b").obj(),
        policy="mutex",
        cards=(("GPU-b",),),
    ),
    FitCase(
        f"{REFIT_TEST} TestFitInRestrictedDevicesMutexPolicy/every allowed device busy",
        hnode(
            Dev("GPU-a", used=1, totalmem=40000, usedmem=10000, usedcores=10),
            Dev("GPU-b", totalmem=40000),
            Dev("GPU-c", used=2, totalmem=40000, usedmem=20000, usedcores=20, numa=1),
        ),
        pod().gpu(1, memory=4096, cores=10).uuids("GPU-a", "GPU-c").obj(),
        policy="mutex",
        reasons=(EXCL,),
        card_reasons=((EXCL, 2), (UUIDF, 1)),
    ),
    *[
        FitCase(
            f"{REFIT_TEST} TestFitInRestrictedDevicesKeepsNumaBind/{name}",
            hnode(
                Dev("GPU-a0", totalmem=40000),
                Dev("GPU-b0", totalmem=40000),
                Dev("GPU-c1", totalmem=40000, numa=1),
                Dev("GPU-d1", totalmem=40000, numa=1),
            ),
            pod().gpu(2, memory=4096, cores=10).uuids(*allowed).numa_bind().obj(),
            policy="binpack",
            cards=None if fails else (allowed,),
            reasons=(NUMA,) if fails else (),
        )
        for name, allowed, fails in (
            ("both allowed devices share NUMA node 0", ("GPU-a0", "GPU-b0"), False),
            ("one allowed device per NUMA node", ("GPU-a0", "GPU-c1"), True),
        )
    ],
    *[
        FitCase(
            f"{REFIT_TEST} TestFitInRestrictedDevicesUsesPodPolicyAnnotation/{value}",
            hnode(
                Dev("GPU-a", used=3, totalmem=40000, usedmem=30000, usedcores=30),
                Dev("GPU-b", used=2, totalmem=40000, usedmem=20000, usedcores=20),
                Dev("GPU-c", used=1, totalmem=40000, usedmem=10000, usedcores=10, numa=1),
            ),
            parsed(
                gpu(1, mem=4096, cores=10),
                annotations={keys.GPU_SCHEDULER_POLICY: value, keys.USE_GPU_UUID: "GPU-b,GPU-c"},
            ),
            policy=value,
            cards=(want,),
        )
        for value, want in (("binpack", ("GPU-b",)), ("spread", ("GPU-c",)))
    ],
    # ----- placement tests in pkg/scheduler
    FitCase(
        "pkg/scheduler TestBinpackPacksSmallerCardOnMixedCapacityNode",
        hnode(
            Dev("gpu-40g", totalmem=40960, type="NVIDIA A100-SXM4-40GB"),
            Dev("gpu-80g", used=1, usedcores=5, usedmem=4096, totalmem=81920, type="NVIDIA A100-SXM4-80GB"),
        ),
        pod().gpu(1, memory=20480, cores=30).obj(),
        policy="binpack",
        cards=(("gpu-40g",),),
    ),
    *[
        FitCase(
            f"pkg/scheduler TestPlacementUnderUnrecognizedPolicy/{value}",
            hnode(
                Dev("gpu-idle"),
                Dev("gpu-mid", used=2, usedcores=50, usedmem=4096),
                Dev("gpu-busy", used=3, usedcores=75, usedmem=6144),
            ),
            pod().gpu(1, memory=1024, cores=10).obj(),
            policy=value,
            cards=(want,),
        )
        for value, want in (("binpack", ("gpu-busy",)), ("spread", ("gpu-idle",)))
    ],
    # ----- policy e2e (test/e2e/policy): the card choices, as unit cases
    *[
        FitCase(
            f"{E2E_POLICY} places workloads according to GPU binpack and spread policies/{name}",
            state,
            parsed(gpu(1, pct=10, cores=10)),
            policy=value,
            cards=(want,),
        )
        for name, state, value, want in (
            (
                "GPU binpack selects the busier GPU",
                hnode(Dev("g0", used=1, usedcores=60, usedmem=3276), Dev("g1")),
                "binpack",
                ("g0",),
            ),
            (
                "a comma-separated mutex policy excludes the busy GPU",
                hnode(Dev("g0", used=2, usedcores=70, usedmem=4095), Dev("g1")),
                "binpack,mutex",
                ("g1",),
            ),
            (
                "GPU spread selects the less utilized GPU",
                hnode(Dev("g0", used=2, usedcores=70, usedmem=4095), Dev("g1")),
                "spread",
                ("g1",),
            ),
        )
    ],
    *[
        FitCase(
            f"{E2E_POLICY} applies per-Pod device scoring weight overrides/{name}",
            hnode(Dev("g0", used=1, usedcores=60, usedmem=819), Dev("g1", used=1, usedcores=1, usedmem=3276)),
            parsed(gpu(1, pct=10), annotations=annotations),
            policy="binpack",
            cards=(want,),
        )
        for name, annotations, want in (
            ("default weights prefer the core-heavy GPU", {}, ("g0",)),
            (
                "memory-heavy weights prefer the memory-heavy GPU",
                {keys.DEVICE_SCORING_WEIGHTS: "slot=1,core=1,memory=3"},
                ("g1",),
            ),
        )
    ],
    # ----- differences gpuslice keeps on purpose
    FitCase(
        "pkg/scheduler/policy/gpu_policy.go ComputeScore default weights slot=1,core=1,memory=1",
        hnode(
            Dev("c0", used=9, usedmem=1000, totalmem=10000),
            Dev("c1", used=1, usedmem=3000, usedcores=20, totalmem=10000),
        ),
        pod().gpu(1, memory=1000).obj(),
        policy="binpack",
        # HAMi: c0 1.2 (9 of 10 slots) beats c1 0.8; gpuslice's default key (0.6 memory + 0.4 cores
        # after placement) ignores slots: c0 0.12, c1 0.32
        cards=(("c1",),),
        differs=(
            "without hami.io/device-scoring-weights gpuslice ranks by 0.6*memory + 0.4*cores,"
            " not slots+cores+memory"
        ),
    ),
    FitCase(
        "pkg/scheduler/policy/gpu_policy.go ComputeScore slot=1,core=1,memory=1 given as annotation",
        hnode(
            Dev("c0", used=9, usedmem=1000, totalmem=10000),
            Dev("c1", used=1, usedmem=3000, usedcores=20, totalmem=10000),
        ),
        parsed(
            gpu(1, mem=1000, cores=0), annotations={keys.DEVICE_SCORING_WEIGHTS: "slot=1,core=1,memory=1"}
        ),
        policy="binpack",
        cards=(("c0",),),
    ),
    # ----- NUMA bind as the annotation reads (TestAssertNuma)
    *[
        FitCase(
            f"{DEVICE_TEST} TestAssertNuma/{name}",
            hnode(Dev("n0", numa=0), Dev("n1", numa=1)),
            parsed(gpu(2, mem=100, cores=10), annotations=annotations),
            reasons=(NUMA,) if enforced else (),
        )
        for name, annotations, enforced in (
            ("NumaBind=true enforces numa", {keys.NUMA_BIND: "true"}, True),
            ("NumaBind=false does not enforce", {keys.NUMA_BIND: "false"}, False),
            ("NumaBind invalid value", {keys.NUMA_BIND: "notabool"}, False),
            ("NumaBind key absent", {}, False),
        )
    ],
    # ----- type, mode and UUID selectors (Test_checkType, TestCheckGPUtype_*, TestCheckType_AllocateMode)
    *[
        FitCase(
            f"{DEVICE_TEST} {name}",
            hnode(Dev("g", type=card_type)),
            parsed(gpu(1, mem=100, cores=10), annotations=annotations),
            reasons=() if ok else (TYPE,),
        )
        for name, card_type, annotations, ok in (
            ("Test_checkType/use A10, device NVIDIA A100", "NVIDIA A100", {keys.USE_GPU_TYPE: "A10"}, True),
            (
                "Test_checkType/use A10, nouse A100, device NVIDIA A100",
                "NVIDIA A100",
                {keys.USE_GPU_TYPE: "A10", keys.NOUSE_GPU_TYPE: "A100"},
                False,
            ),
            (
                "Test_checkType/use A10, nouse A100, device NVIDIA A10",
                "NVIDIA A10",
                {keys.USE_GPU_TYPE: "A10", keys.NOUSE_GPU_TYPE: "A100"},
                True,
            ),
            ("TestCheckGPUtype_NoUse/NVIDIA-A100", "NVIDIA-A100", {keys.NOUSE_GPU_TYPE: "A100"}, False),
            ("TestCheckGPUtype_NoUse/NVIDIA-V100", "NVIDIA-V100", {keys.NOUSE_GPU_TYPE: "A100"}, True),
            ("TestCheckGPUtype_InUseMismatch", "NVIDIA-V100", {keys.USE_GPU_TYPE: "A100"}, False),
            ("TestCheckGPUtype_EmptyAnnotation/use empty", "NVIDIA-A100", {keys.USE_GPU_TYPE: ""}, True),
            ("TestCheckGPUtype_EmptyAnnotation/use blank", "NVIDIA-A100", {keys.USE_GPU_TYPE: "   "}, True),
            ("TestCheckGPUtype_EmptyAnnotation/nouse empty", "NVIDIA-A100", {keys.NOUSE_GPU_TYPE: ""}, True),
            (
                "TestCheckGPUtype_EmptyAnnotation/nouse blank",
                "NVIDIA-A100",
                {keys.NOUSE_GPU_TYPE: "   "},
                True,
            ),
            (
                "TestCheckType_AllocateMode/mps on a hami-core card",
                "NVIDIA-A100",
                {keys.VGPU_MODE: "mps"},
                False,
            ),
            (
                "TestCheckType_AllocateMode/hami-core on a hami-core card",
                "NVIDIA-A100",
                {keys.VGPU_MODE: "hami-core"},
                True,
            ),
        )
    ],
    # ----- a node without cards ("node unregistered" in HAMi's scheduler.go)
    FitCase(
        "pkg/scheduler/scheduler.go getNodesUsage: node unregistered",
        node("empty").state(),
        pod().gpu(1, memory=100).obj(),
        reasons=(UNREG,),
        code=R,
    ),
]

# pkg/device/nvidia/fit_checks_test.go: one card check at a time, here through the whole of
# fit.place on a one-card node (so a check HAMi's test passes in isolation can still fail a later
# one; those cases say which). (name, card, request memory, request cores, reason or None)
_CK = "pkg/device/nvidia/fit_checks_test.go"
_CHECKS: list[tuple[str, Dev, int, int, str | None]] = [
    ("TestCheckCardTimeSlicing/plenty of slots", Dev("d", count=100), 100, 10, None),
    ("TestCheckCardTimeSlicing/one slot remaining", Dev("d", count=10, used=9), 100, 10, None),
    ("TestCheckCardTimeSlicing/exactly exhausted", Dev("d", count=10, used=10), 100, 10, SLOTS),
    ("TestCheckCardTimeSlicing/over-committed", Dev("d", count=10, used=15), 100, 10, SLOTS),
    ("TestCheckCardMemory/plenty of memory", Dev("d"), 100, 10, None),
    ("TestCheckCardMemory/exact fit", Dev("d", totalmem=1024, usedmem=512), 512, 10, None),
    ("TestCheckCardMemory/one byte short", Dev("d", totalmem=1024, usedmem=512), 513, 10, IGM),
    ("TestCheckCardMemory/all used", Dev("d", totalmem=1024, usedmem=1024), 1, 10, IGM),
    ("TestCheckCardMemory/zero request fits", Dev("d", totalmem=1024, usedmem=1024), 0, 10, None),
    ("TestCheckCardCore/plenty of cores", Dev("d"), 100, 10, None),
    ("TestCheckCardCore/exact fit", Dev("d", usedcores=50), 100, 50, None),
    ("TestCheckCardCore/one short", Dev("d", usedcores=50), 100, 51, IGC),
    ("TestCheckCardCore/all used with request", Dev("d", usedcores=100), 100, 1, IGC),
    (
        "TestCheckCardCore/zero request with cores used (then CardComputeUnitsExhausted)",
        Dev("d", usedcores=100),
        100,
        0,
        EXCL,
    ),
    ("TestCheckCardCore/zero totalcore with non-zero request fails", Dev("d", totalcore=0), 100, 50, IGC),
    ("TestCheckCardCore/zero totalcore with zero request passes", Dev("d", totalcore=0), 100, 0, None),
    ("TestCheckCardExclusive/non-exclusive passes even when shared", Dev("d", used=5), 100, 50, None),
    ("TestCheckCardExclusive/exclusive request on free card passes", Dev("d"), 100, 100, None),
    ("TestCheckCardExclusive/exclusive request on shared card fails", Dev("d", used=1), 100, 100, EXCL),
    (
        "TestCheckCardExclusive/exclusive request on heavily shared card fails",
        Dev("d", used=10, count=20),
        100,
        100,
        EXCL,
    ),
    (
        "TestCheckCardExclusive/exclusive request on non-100 totalcore passes",
        Dev("d", used=5, totalcore=200),
        100,
        100,
        None,
    ),
    ("TestCheckCardExclusive/coresreq below 100 never exclusive", Dev("d", used=10, count=20), 100, 99, None),
    (
        "TestCheckCardComputeExhausted/cores available, request zero passes",
        Dev("d", usedcores=50),
        100,
        0,
        None,
    ),
    ("TestCheckCardComputeExhausted/cores full, request zero fails", Dev("d", usedcores=100), 100, 0, EXCL),
    (
        "TestCheckCardComputeExhausted/cores full but request non-zero (handled by core check)",
        Dev("d", usedcores=100),
        100,
        10,
        IGC,
    ),
    ("TestCheckCardComputeExhausted/zero totalcore passes", Dev("d", totalcore=0), 100, 0, None),
    (
        "TestCheckCardComputeExhausted/cores partial, request zero passes",
        Dev("d", usedcores=30),
        100,
        0,
        None,
    ),
    (
        "TestRunCardChecks_ShortCircuit/timeslicing fails before memory",
        Dev("d", count=5, used=5, totalmem=100, usedmem=100),
        50,
        0,
        SLOTS,
    ),
    (
        "TestRunCardChecks_ShortCircuit/memory fails before core",
        Dev("d", totalmem=100, usedmem=80, usedcores=95),
        50,
        50,
        IGM,
    ),
    (
        "TestRunCardChecks_ShortCircuit/core fails before exclusive",
        Dev("d", used=5, usedcores=95),
        100,
        100,
        IGC,
    ),
    ("TestRunCardChecks_ShortCircuit/all pass returns empty reason", Dev("d"), 100, 10, None),
]

FIT_CASES += [
    FitCase(
        f"{_CK} {name}",
        hnode(dev),
        pod().gpu(1, memory=memory, cores=cores).obj(),
        reasons=() if reason is None else (reason,),
        card_reasons=None if reason is None else ((reason, 1),),
    )
    for name, dev, memory, cores, reason in _CHECKS
]

_FX = "pkg/device/nvidia/fit_extra_test.go"
FIT_CASES += [
    FitCase(
        f"{_CK} TestRunCardChecks_ShortCircuit/uuid fails before timeslicing",
        hnode(Dev("GPU-other", count=0, used=5)),
        pod().gpu(1, memory=0).uuids("GPU-aaa").obj(),
        reasons=(UUIDF,),
        card_reasons=((UUIDF, 1),),
    ),
    *[
        FitCase(
            f"{_CK} TestCheckCardUUID/{name}",
            hnode(Dev(dev_id)),
            parsed(gpu(1, mem=100, cores=10), annotations=annotations),
            reasons=() if ok else (UUIDF,),
        )
        for name, dev_id, annotations, ok in (
            ("no annotation constraint passes", "GPU-aaa", {}, True),
            ("use-gpuuuid matches passes", "GPU-aaa", {keys.USE_GPU_UUID: "GPU-aaa,GPU-bbb"}, True),
            ("use-gpuuuid mismatch fails", "GPU-ccc", {keys.USE_GPU_UUID: "GPU-aaa,GPU-bbb"}, False),
            ("nouse-gpuuuid match fails", "GPU-aaa", {keys.NOUSE_GPU_UUID: "GPU-aaa,GPU-bbb"}, False),
            ("nouse-gpuuuid mismatch passes", "GPU-ccc", {keys.NOUSE_GPU_UUID: "GPU-aaa,GPU-bbb"}, True),
            ("empty use-gpuuuid is no constraint", "GPU-aaa", {keys.USE_GPU_UUID: ""}, True),
        )
    ],
    FitCase(
        f"{_FX} TestFit_NumaNotFitReason",
        hnode(Dev("dev-0", numa=1), Dev("dev-1", numa=0), Dev("dev-2", numa=0)),
        pod().gpu(3, memory=100, cores=10).numa_bind().obj(),
        reasons=(NUMA,),
        code=R,
    ),
    FitCase(
        f"{_FX} TestFit_ResourceQuotaNotFitReason",
        hnode(Dev("dev-0")),
        pod().gpu(1, memory=500, cores=10).obj(),
        quota=quotas.QuotaView(memory_limit=100),
        reasons=(QUOTA,),
        card_reasons=((QUOTA, 1),),
        code=R,
    ),
    FitCase(
        f"{_FX} TestFit_CoresreqOver100IsClamped",
        hnode(Dev("dev-0")),
        pod().gpu(1, memory=100, cores=200).obj(),
        grants=((100, 100),),
    ),
    FitCase(
        f"{_FX} TestFit_MultiCardFailureReasonCount",
        hnode(*_one(3, totalmem=100, usedmem=80)),
        pod().gpu(1, memory=50, cores=10).obj(),
        reasons=(IGM,),
        card_reasons=((IGM, 3),),
    ),
    FitCase(
        # HAMi: 1 AllocatedCardsInsufficientRequest and 1 CardNotHealth; gpuslice names the card reason
        f"{_FX} TestFit_TopologyModeWithPartialSelection",
        hnode(*_one(3), Dev("dev-3", health=False)),
        pod().gpu(4, memory=100, cores=10).obj(),
        policy="topology-aware",
        reasons=(SICK,),
        card_reasons=((SICK, 1),),
        code=R,
    ),
    FitCase(
        f"{_FX} TestFit_ZeroNumRequest",
        hnode(Dev("dev-0")),
        pod().gpu(0, memory=100, cores=10).obj(),
    ),
    FitCase(
        f"{_FX} TestFit_HealthPrecedenceOverTypeMismatch",
        hnode(Dev("dev-0", type="WrongType", health=False)),
        parsed(gpu(1, mem=100, cores=10), annotations={keys.USE_GPU_TYPE: "NonMatchingModel"}),
        reasons=(SICK,),
        card_reasons=((SICK, 1),),
    ),
]


@pytest.mark.parametrize(
    ("source", "memory", "pct", "card", "want"),
    [
        ("explicit memreq wins", 2048, 50, 8192, 2048),
        ("percentage applied when memreq zero", 0, 50, 8192, 4096),
        ("percentage 101 (unset) with memreq zero gives zero", 0, requests.MEMORY_PERCENTAGE_UNSET, 8192, 0),
        ("percentage 100 of 16GB", 0, 100, 16384, 16384),
        ("percentage 25 of 8GB", 0, 25, 8192, 2048),
    ],
)
def test_compute_memreq(source: str, memory: int, pct: int, card: int, want: int) -> None:
    # fit_checks_test.go TestComputeMemreq
    del source
    assert cr(1, memory, pct).memory_on(card) == want


@pytest.mark.parametrize(("given", "want"), [(0, 0), (50, 50), (100, 100), (101, 100), (200, 100)])
def test_normalize_coresreq(given: int, want: int) -> None:
    # fit_checks_test.go TestNormalizeCoresreq
    assert cr(1, cores=given).cores_clamped == want


@pytest.mark.parametrize("case", [pytest_param(c) for c in FIT_CASES])
def test_fit(case: FitCase) -> None:
    got = fit.place(case.state, case.pod, registry.card_policy(case.policy), api.EMPTY_CONTEXT, case.quota)
    if not case.reasons:
        assert got.status.ok, (got.status, got.card_reasons)
        if case.cards is not None:
            assert picked(got) == [sorted(c) for c in case.cards]
    else:
        assert got.status.reasons == case.reasons, got.card_reasons
        if case.card_reasons is not None:
            assert got.card_reasons == case.card_reasons
        if case.code is not None:
            assert got.status.code is case.code
    if case.grants is not None:
        assert got.allocation is not None
        first = next(c for c in got.allocation.containers if c)
        assert tuple((g.memory_mib, g.cores) for g in first) == case.grants


def test_restricting_cards_is_choosing_on_a_smaller_node() -> None:
    # numa_refit_test.go TestFitInRestrictedDevicesMatchesFitOnSmallerNode: allowing GPU-b and GPU-c
    # picks what a node holding only those two picks, for every policy
    devs = (
        Dev("GPU-a", used=3, totalmem=40000, usedmem=30000, usedcores=30),
        Dev("GPU-b", used=2, totalmem=40000, usedmem=20000, usedcores=20),
        Dev("GPU-c", used=1, totalmem=40000, usedmem=10000, usedcores=10, numa=1),
    )
    restricted = pod().gpu(1, memory=4096, cores=10).uuids("GPU-b", "GPU-c").obj()
    plain = pod().gpu(1, memory=4096, cores=10).obj()
    for value, want in (
        ("binpack", "GPU-b"),
        ("spread", "GPU-c"),
        ("binpack,numa", "GPU-b"),
        ("spread,numa", "GPU-c"),
    ):
        policy = registry.card_policy(value)
        a = picked(fit.place(hnode(*devs), restricted, policy))
        b = picked(fit.place(hnode(*devs[1:]), plain, policy))
        assert a == b == [[want]], value


# ----- quota: device_test.go TestFitQuota, through fit.place with the namespace's QuotaView


def _memory_quota(limit: str, *, key: str = "limits.nvidia.com/gpumem", factor: int = 1) -> quotas.QuotaView:
    q = resources.parse_quota({key: limit}, model_config.RequestConfig(memory_factor=factor))
    return quotas.QuotaView(count_limit=q.count, memory_limit=q.memory_mib, cores_limit=q.cores)


_Q = _memory_quota("2048")  # TestFitQuota's ResourceQuota: limits.nvidia.com/gpumem: 2048
_QF = f"{DEVICE_TEST} TestFitQuota"
_TWO = hnode(Dev("gpu-0"), Dev("gpu-1"))
_UNEVEN = hnode(Dev("big", totalmem=10240), Dev("small", totalmem=1000))
_UNEVEN_BIG = hnode(Dev("big", totalmem=10240), Dev("large", totalmem=20000))

QUOTA_CASES = [
    FitCase(f"{_QF}/no tmp and no allocated", _TWO, pod().gpu(1, memory=100, cores=1).obj(), quota=_Q),
    FitCase(
        f"{_QF}/request exceed quota",
        _TWO,
        pod().gpu(1, memory=3000, cores=1).obj(),
        quota=_Q,
        reasons=(QUOTA,),
        code=R,
    ),
    # tmpDevs (cards this container already took) as one container on two cards of different
    # size: 10 % is 1024 MiB on one and 100 (or 2000) MiB on the other
    FitCase(f"{_QF}/tmpdev", _UNEVEN, pod().gpu(2, pct=10, cores=1).obj(), quota=_Q),
    FitCase(
        f"{_QF}/tmpdev exceed quota",
        _UNEVEN_BIG,
        pod().gpu(2, pct=10, cores=1).obj(),
        quota=_Q,
        reasons=(QUOTA,),
    ),
    FitCase(
        f"{_QF}/allocated devs",
        _TWO,
        pod().gpu(1, memory=1024, cores=2).gpu(1, memory=100, cores=1).obj(),
        quota=_Q,
    ),
    FitCase(
        f"{_QF}/allocated devs exceed quota",
        _TWO,
        pod().gpu(1, memory=1024, cores=2).gpu(1, memory=2000, cores=1).obj(),
        quota=_Q,
        reasons=(QUOTA,),
    ),
    FitCase(
        f"{_QF}/exceed quota (1024 + 1024 + 100)",
        hnode(*_one(3)),
        pod().gpu(1, memory=1024, cores=2).gpu(1, memory=1024, cores=5).gpu(1, memory=100, cores=1).obj(),
        quota=_Q,
        reasons=(QUOTA,),
    ),
    FitCase(
        f"{_QF}/fit (100 + 100 + 100)",
        hnode(*_one(3)),
        pod().gpu(1, memory=100, cores=2).gpu(1, memory=100, cores=1).gpu(1, memory=100, cores=1).obj(),
        quota=_Q,
    ),
    FitCase(
        f"{_QF}/fitting second init container maxes against first",
        hnode(Dev("gpu-0")),
        pod().init_gpu(1, memory=1500, cores=2).init_gpu(1, memory=1500, cores=1).no_gpu().obj(),
        quota=_Q,
    ),
    FitCase(
        f"{_QF}/sequential init containers counted as peak not sum",
        hnode(Dev("gpu-0")),
        pod()
        .init_gpu(1, memory=1024, cores=2)
        .init_gpu(1, memory=1024, cores=2)
        .gpu(1, memory=500, cores=1)
        .obj(),
        quota=_Q,
    ),
    FitCase(
        f"{_QF}/collapsed init peak still enforces quota",
        _TWO,
        pod().init_gpu(1, memory=2100, cores=2).gpu(1, memory=100, cores=1).obj(),
        quota=_Q,
        reasons=(QUOTA,),
        code=R,
    ),
    # ----- quota keys gpuslice reads and HAMi does not (HAMi reads only limits.<gpumem|gpucores>)
    FitCase(
        "pkg/device/quota.go AddQuota: requests.nvidia.com/gpumem is ignored",
        _TWO,
        pod().gpu(1, memory=2000).obj(),
        quota=_memory_quota("1000", key="requests.nvidia.com/gpumem"),
        reasons=(QUOTA,),
        differs="gpuslice honours every form of quota key (bare, requests., limits.); HAMi only limits.",
    ),
    FitCase(
        "pkg/device/quota.go IsManagedQuota: nvidia.com/gpu is left to the native quota",
        _TWO,
        pod().gpu(2, memory=100).obj(),
        quota=_memory_quota("1", key="limits.nvidia.com/gpu"),
        reasons=(QUOTA,),
        differs="gpuslice also enforces the card count key at filter time; HAMi leaves it to Kubernetes",
    ),
    FitCase(
        "pkg/device/quota.go FitQuota: `limit != 0 &&` (a limit of 0 does not restrict)",
        _TWO,
        pod().gpu(1, memory=100).obj(),
        quota=_memory_quota("0"),
        reasons=(status.QUOTA_EXCEEDED,),
        differs=(
            "gpuslice reads a quota limit of 0 as Kubernetes does (nothing allowed);"
            " the stored FitQuota skips a limit of 0"
        ),
    ),
]


@pytest.mark.parametrize("case", [pytest_param(c) for c in QUOTA_CASES])
def test_quota(case: FitCase) -> None:
    test_fit(case)


@pytest.mark.parametrize(
    ("source", "view", "add", "ok"),
    [
        # pkg/device/quota_test.go TestFitQuota: memory used 1000 of 2000, cores 200 of 400
        ("within limits", None, (1, 500, 100), True),
        ("memory exceeds limit", None, (1, 1500, 100), False),
        ("core exceeds limit", None, (1, 500, 300), False),
        ("memory with factor 2", 2, (1, 1000, 100), True),
        ("memory with factor 2 exceeds", 2, (1, 5000, 100), False),
    ],
)
def test_quota_manager_fit_quota(source: str, view: int | None, add: tuple[int, int, int], ok: bool) -> None:
    del source
    q = resources.parse_quota(
        {"limits.nvidia.com/gpumem": "2000", "limits.nvidia.com/gpucores": "400"},
        model_config.RequestConfig(memory_factor=view or 1),
    )
    v = quotas.QuotaView(memory_limit=q.memory_mib, cores_limit=q.cores, used_memory=1000, used_cores=200)
    assert v.admits(*add) is ok


def test_quota_add_and_delete() -> None:
    # quota_test.go TestAddQuotaAndDelQuota, and TestFitQuota "Should fit if namespace not present"
    q = resources.parse_quota({"limits.nvidia.com/gpumem": "100", "limits.nvidia.com/gpucores": "10"})
    assert (q.memory_mib, q.cores, q.count) == (100, 10, None)
    c = caches.ClusterCache(nominator=nominations.Nominator())
    c.upsert_node(node("n").gpus(1).inventory())
    c.set_quota("testns", quotas.QuotaView(memory_limit=q.memory_mib, cores_limit=q.cores))
    view = c.snapshot().quota("testns")
    assert view is not None and (view.memory_limit, view.cores_limit) == (100, 10)
    assert c.snapshot().quota("otherns") is None
    c.set_quota("testns", None)
    assert c.snapshot().quota("testns") is None


def test_quota_usage_add_remove_never_underflows() -> None:
    # quota_test.go TestAddUsageAndRmUsage and TestRmUsageDoesNotUnderflow
    c = caches.ClusterCache(nominator=nominations.Nominator())
    c.upsert_node(node("n").card(uuid_="GPU0").inventory())
    c.set_quota("testns", quotas.QuotaView(memory_limit=10**6))
    c.add_pod("testns/p", "u", alloc("n", (("GPU0", 1000, 100),)))
    view = c.snapshot().quota("testns")
    assert view is not None and (view.used_memory, view.used_cores) == (1000, 100)
    c.remove_pod("testns/p")
    c.remove_pod("testns/p")  # a duplicate delete
    view = c.snapshot().quota("testns")
    assert view is not None and (view.used_count, view.used_memory, view.used_cores) == (0, 0, 0)


# ----- init containers: initcontainer_test.go, initcontainer_usage_test.go


@dataclasses.dataclass(frozen=True)
class UsageCase:
    source: str
    alloc: allocations.PodAllocation
    want: Mapping[str, tuple[int, int, int]]
    """Per UUID: (slots, memory, cores)."""
    inits_done: bool = False
    differs: str | None = None
    xfail: str | None = None


_IC = "pkg/device/initcontainer_test.go TestCollapseInitContainerUsage"

USAGE_CASES = [
    UsageCase(
        f"{_IC}/no init containers - app sum unchanged",
        alloc("n", (("gpu-0", 10, 30),), (("gpu-0", 4, 20),)),
        {"gpu-0": (2, 14, 50)},
    ),
    UsageCase(
        f"{_IC}/init smaller than app - app wins",
        alloc("n", (("gpu-0", 10, 0),), (("gpu-0", 20, 0),), init_count=1),
        {"gpu-0": (1, 20, 0)},
    ),
    UsageCase(
        f"{_IC}/init larger than app - init wins (Case 2)",
        alloc("n", (("gpu-0", 20, 0),), (("gpu-0", 10, 0),), init_count=1),
        {"gpu-0": (1, 20, 0)},
    ),
    UsageCase(
        f"{_IC}/multi init - max across init containers",
        alloc("n", (("gpu-0", 12, 0),), (("gpu-0", 20, 0),), (("gpu-0", 10, 0),), init_count=2),
        {"gpu-0": (1, 20, 0)},
    ),
    UsageCase(
        f"{_IC}/multi app sum beats single init",
        alloc("n", (("gpu-0", 15, 0),), (("gpu-0", 10, 0),), (("gpu-0", 10, 0),), init_count=1),
        {"gpu-0": (2, 20, 0)},
    ),
    UsageCase(
        f"{_IC}/distinct UUIDs never merged",
        alloc("n", (("gpu-0", 20, 0),), (("gpu-1", 10, 0),), init_count=1),
        {"gpu-0": (1, 20, 0), "gpu-1": (1, 10, 0)},
    ),
    UsageCase(
        f"{_IC}/app only view drops init",
        alloc("n", (("gpu-0", 20, 0),), (("gpu-0", 10, 0),), init_count=1),
        {"gpu-0": (1, 10, 0)},
        inits_done=True,
    ),
]


@pytest.mark.parametrize("case", [pytest_param(c) for c in USAGE_CASES])
def test_card_reservation(case: UsageCase) -> None:
    got = allocations.card_reservation(case.alloc, case.inits_done)
    assert {u: (r.slots, r.memory_mib, r.cores) for u, r in got.items()} == dict(case.want)


def test_init_container_usage_lifecycle() -> None:
    # initcontainer_usage_test.go TestInitContainerUsageLifecycle: init 20 and app 10 on uuid1
    c = caches.ClusterCache(nominator=nominations.Nominator())
    c.upsert_node(node("node1").card(uuid_="uuid1").inventory())
    c.set_quota("default", quotas.QuotaView(memory_limit=24))
    a = alloc("node1", (("uuid1", 20, 0),), (("uuid1", 10, 0),), init_count=1)

    def used() -> int:
        view = c.snapshot().quota("default")
        assert view is not None
        return view.used_memory

    c.add_pod("default/p", "uid-1", a)
    assert used() == 20  # Case 3: max(app 10, init 20)
    c.add_pod("default/p", "uid-1", a, inits_done=True)
    assert used() == 10  # Case 4: app only
    c.add_pod("default/p", "uid-1", a, inits_done=True)  # shrink is idempotent
    assert used() == 10
    assert c.snapshot().nodes["node1"].usage[0] == nodes.CardUsage(1, 10, 0)
    c.remove_pod("default/p")
    assert used() == 0  # no drift


def _status(state: str, code: int = 0) -> dict[str, Any]:
    return {"terminated": {"exitCode": code}} if state == "terminated" else {state: {}}


@pytest.mark.parametrize(
    ("source", "inits", "statuses", "done"),
    [
        ("no init containers", 0, [], False),
        ("init still running", 1, [_status("running")], False),
        ("status not yet populated", 2, [_status("terminated")], False),
        ("all terminated exit 0", 2, [_status("terminated"), _status("terminated")], True),
        ("terminated non-zero", 1, [_status("terminated", 1)], False),
    ],
)
def test_init_containers_all_succeeded(
    source: str, inits: int, statuses: list[dict[str, Any]], done: bool
) -> None:
    # initcontainer_test.go TestInitContainersAllTerminated: InitContainersAllSucceeded
    del source
    body = {
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {
            "initContainers": [{"name": f"i{k}"} for k in range(inits)],
            "containers": [{"name": "app"}],
        },
        "status": {"initContainerStatuses": [{"name": f"i{k}", "state": s} for k, s in enumerate(statuses)]},
    }
    assert objects.decode_pod(json.dumps(body).encode()).inits_done is done


def test_cordoned_card_keeps_its_running_pods() -> None:
    # device_test.go TestFit_DeviceCordon "running pods on a cordoned device are unaffected"
    c = caches.ClusterCache(nominator=nominations.Nominator())
    c.upsert_node(node("n").card(uuid_="dev-0").card(uuid_="dev-1").cordon(1).inventory())
    c.add_pod("default/p", "u", alloc("n", (("dev-1", 64, 50),)))
    assert c.snapshot().nodes["n"].usage[1] == nodes.CardUsage(1, 64, 50)


def test_shared_card_capacity_is_released_on_delete() -> None:
    # policy e2e "shares one GPU across pods and releases capacity on delete", on a card with room
    # for two 30 % / 30-core pods at a time (memory 60 of 100)
    c = caches.ClusterCache(nominator=nominations.Nominator())
    c.upsert_node(node("n").card(uuid_="g0", memory=10000, cores=60).inventory())
    req = parsed(gpu(1, pct=30, cores=30))
    policy = registry.card_policy("binpack")
    for key in ("default/first", "default/second"):
        got = fit.place(c.snapshot().nodes["n"], req, policy)
        assert got.allocation is not None and picked(got) == [["g0"]]
        assert c.assume(key, key, got.allocation, 0.0).ok
    assert fit.place(c.snapshot().nodes["n"], req, policy).status.reasons == (IGC,)
    c.remove_pod("default/first")
    assert picked(fit.place(c.snapshot().nodes["n"], req, policy)) == [["g0"]]


# ----- request parsing: GenerateResourceRequests (no webhook rules) and MutateAdmission


@dataclasses.dataclass(frozen=True)
class ParseCase:
    source: str
    limits: Mapping[str, object]
    want: requests.ContainerRequest | None | str
    """The container's request, None for no GPU, or ``REFUSED``."""
    reqs: Mapping[str, object] = dataclasses.field(default_factory=dict)
    config: model_config.RequestConfig = model_config.RequestConfig(exclusive_whole_card=False)
    differs: str | None = None
    xfail: str | None = None


def cr(
    count: int, memory: int = 0, pct: int = requests.MEMORY_PERCENTAGE_UNSET, cores: int = 0
) -> requests.ContainerRequest:
    return requests.ContainerRequest(count=count, memory_mib=memory, memory_percentage=pct, cores=cores)


_G = f"{DEVICE_TEST} TestGenerateResourceRequests"
_M = f"{DEVICE_TEST} TestMutateAdmissionDefaultsExclusiveCore"
_V = f"{DEVICE_TEST} Test_MutateAdmission_MemoryPercentageValidation"
_WEBHOOK = model_config.DEFAULT_REQUEST_CONFIG
_GPU, _MEM, _PCT, _CORES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
)

PARSE_CASES = [
    ParseCase(f"{_G}/gpu count only — defaults to 100% memory", {_GPU: "1"}, cr(1, pct=100)),
    ParseCase(f"{_G}/gpu count + explicit memory", {_GPU: "2", _MEM: "4096"}, cr(2, 4096)),
    ParseCase(f"{_G}/gpu count + memory percentage", {_GPU: "1", _PCT: "50"}, cr(1, pct=50)),
    ParseCase(f"{_G}/gpu count + explicit cores", {_GPU: "1", _CORES: "50"}, cr(1, pct=100, cores=50)),
    ParseCase(f"{_G}/no gpu resource — returns empty request", {}, None),
    ParseCase(
        f"{_G}/gpu in Requests (not Limits) — falls back to Requests", {}, cr(1, pct=100), reqs={_GPU: "1"}
    ),
    ParseCase(
        f"{_G}/gpu count + memory percentage of 0 — treated as unset", {_GPU: "1", _PCT: "0"}, cr(1, pct=100)
    ),
    ParseCase(
        f"{_G}/memory percentage of 0 in Requests — treated as unset",
        {},
        cr(1, pct=100),
        reqs={_GPU: "1", _PCT: "0"},
    ),
    ParseCase(
        f"{_G}/memory percentage of 0 + explicit memory — explicit memory wins",
        {_GPU: "1", _MEM: "2000", _PCT: "0"},
        cr(1, 2000),
    ),
    ParseCase(
        f"{_G}/byte-scale memory quantity that overflows int32 is rejected",
        {_GPU: "1", _MEM: "16Gi"},
        REFUSED,
        differs=REFUSE_AMOUNT + " (HAMi: no request)",
    ),
    ParseCase(
        f"{_G}/decimal-form memory request is rejected, not treated as zero",
        {_GPU: "1", _MEM: "16.0Gi"},
        REFUSED,
        differs=REFUSE_AMOUNT + " (HAMi: no request)",
    ),
    *[
        ParseCase(
            f"{_G}/{name}",
            {_GPU: "1", _PCT: raw},
            REFUSED,
            differs=REFUSE_PCT + f" (HAMi: MemPercentagereq {hami})",
        )
        for name, raw, hami in (
            ("gpu count + memory percentage above 100 — rejected", "150", "150, no card fits"),
            ("gpu count + memory percentage beyond int32 range — rejected", str((1 << 32) + 50), "MaxInt32"),
            ("gpu count + memory percentage equal to sentinel 101 — rejected", "101", "102"),
            ("negative memory percentage — rejected", "-1", "-1"),
        )
    ],
    ParseCase(
        f"{DEVICE_TEST} TestGenerateResourceRequests_MemoryFactor/1024 x 2",
        {_GPU: "1", _MEM: "1024"},
        cr(1, 2048),
        config=model_config.RequestConfig(exclusive_whole_card=False, memory_factor=2),
    ),
    ParseCase(
        f"{DEVICE_TEST} TestGenerateResourceRequests_MemoryFactor/1Gi x 2 overflows",
        {_GPU: "1", _MEM: "1Gi"},
        REFUSED,
        config=model_config.RequestConfig(exclusive_whole_card=False, memory_factor=2),
        differs=REFUSE_AMOUNT + " (HAMi: no request)",
    ),
    *[
        ParseCase(
            f"{DEVICE_TEST} TestGenerateResourceRequests_DefaultMemory/{name}",
            {_GPU: "1", **extra},
            cr(1, 512),
            config=model_config.RequestConfig(exclusive_whole_card=False, default_memory=512),
        )
        for name, extra in (("count only", {}), ("percentage 0", {_PCT: "0"}), ("gpumem 0", {_MEM: "0"}))
    ],
    # the webhook's rule (gpuslice applies it while parsing): 100 cores for a whole card
    ParseCase(
        f"{_M}/exclusive via percentage", {_GPU: "1", _PCT: "100"}, cr(1, pct=100, cores=100), config=_WEBHOOK
    ),
    ParseCase(
        f"{_M}/exclusive via percentage in requests only",
        {},
        cr(1, pct=100, cores=100),
        reqs={_GPU: "1", _PCT: "100"},
        config=_WEBHOOK,
    ),
    ParseCase(f"{_M}/non-exclusive percentage", {_GPU: "1", _PCT: "50"}, cr(1, pct=50), config=_WEBHOOK),
    ParseCase(
        f"{_M}/fractional percentage 99.1 treated as non-exclusive",
        {_GPU: "1", _PCT: "99.1"},
        REFUSED,
        config=_WEBHOOK,
        differs=REFUSE_PCT + " (HAMi's MutateAdmission adds no cores; its validation rejects 99.1 too)",
    ),
    ParseCase(
        f"{_M}/no memory fields defaults to exclusive",
        {_GPU: "1"},
        cr(1, pct=100, cores=100),
        config=_WEBHOOK,
    ),
    ParseCase(
        f"{_M}/explicit cores remains unchanged",
        {_GPU: "1", _CORES: "70"},
        cr(1, pct=100, cores=70),
        config=_WEBHOOK,
    ),
    ParseCase(
        f"{_M}/explicit cores in requests remains unchanged",
        {},
        cr(1, pct=100, cores=55),
        reqs={_GPU: "1", _CORES: "55"},
        config=_WEBHOOK,
    ),
    ParseCase(
        f"{_M}/memory size present treated as shareable",
        {_GPU: "1", _MEM: "8192"},
        cr(1, 8192),
        config=_WEBHOOK,
    ),
    ParseCase(
        f"{_M}/custom resource names",
        {"hami.io/gpu": "1", "hami.io/gpumem-percentage": "100"},
        cr(1, pct=100, cores=100),
        config=model_config.RequestConfig(
            names=model_config.ResourceNames(
                count="hami.io/gpu",
                memory="hami.io/gpumem",
                memory_percentage="hami.io/gpumem-percentage",
                cores="hami.io/gpucores",
            )
        ),
    ),
    # Test_MutateAdmission_MemoryPercentageValidation: HAMi's webhook refuses the same values
    *[
        ParseCase(f"{_V}/{name} ({where})", limits, want, reqs=reqs, config=_WEBHOOK)
        for raw, want, name in (
            ("0", cr(1, pct=100), "percentage of 0 is accepted"),
            ("50", cr(1, pct=50), "percentage of 50 is accepted"),
            ("100", cr(1, pct=100, cores=100), "percentage of 100 is accepted"),
            ("50m", REFUSED, "fractional percentage 50m is rejected"),
            ("50.5", REFUSED, "fractional percentage 50.5 is rejected"),
            ("99.1", REFUSED, "fractional percentage 99.1 is rejected"),
            ("101", REFUSED, "percentage of 101 is rejected"),
            ("150", REFUSED, "percentage above 100 is rejected"),
            ("-1", REFUSED, "negative percentage is rejected"),
        )
        for where, limits, reqs in (
            ("limits", {_GPU: "1", _PCT: raw}, {}),
            ("requests", {_GPU: "1"}, {_PCT: raw}),
        )
    ],
]


@pytest.mark.parametrize("case", [pytest_param(c) for c in PARSE_CASES])
def test_parse(case: ParseCase) -> None:
    body = pod_dict(container(case.limits, case.reqs))
    if case.want == REFUSED:
        with pytest.raises(errors.DecodeError):
            resources.parse_pod(body, case.config)
        return
    assert resources.parse_pod(body, case.config).containers == (case.want,)


# ----- card-policy values: pkg/util tests of GetGPUSchedulerPolicyByPod / IsValid*SchedulerPolicy


@dataclasses.dataclass(frozen=True)
class PolicyCase:
    source: str
    value: str
    want: str
    """The policy's name, or ``REFUSED``."""
    differs: str | None = None
    xfail: str | None = None


_U = "pkg/util"
POLICY_CASES = [
    *[
        PolicyCase(f"{_U} TestIsValidGPUSchedulerPolicy/{v!r}", v, want)
        for v, want in (
            ("binpack", "binpack"),
            ("spread", "spread"),
            ("numa", "numa"),
            ("mutex", "mutex"),
            ("topology-aware", "topology-aware"),
            ("binpack,numa", "binpack,numa"),
            ("binpack, numa", "binpack,numa"),
            ("mutex,topology-aware", "mutex,topology-aware"),
            ("", REFUSED),
            ("   ", REFUSED),
            ("binpakc", REFUSED),
            ("Binpack", REFUSED),
            ("binpack,nmua", REFUSED),
        )
    ],
    PolicyCase(
        f"{_U} TestIsValidGPUSchedulerPolicy/'binpack,'",
        "binpack,",
        REFUSED,
    ),
    *[
        PolicyCase(f"{_U} TestGetGPUSchedulerPolicyByPodNormalizesAcceptedValues/{v!r}", v, want)
        for v, want in (
            (" binpack ", "binpack"),
            ("binpack, numa", "binpack,numa"),
            (" spread ,  mutex ", "spread,mutex"),
        )
    ],
]


@pytest.mark.parametrize("case", [pytest_param(c) for c in POLICY_CASES])
def test_card_policy_value(case: PolicyCase) -> None:
    if case.want == REFUSED:
        with pytest.raises(api.UnknownPolicyError):
            registry.card_policy(case.value)
        return
    assert registry.card_policy(case.value).name == case.want


@dataclasses.dataclass(frozen=True)
class DefaultCase:
    source: str
    annotation: str
    card_default: str = "spread"
    node_default: str = "binpack"
    which: str = "card"
    want: str = ""
    """The policy the pod gets (its name)."""
    differs: str | None = None
    xfail: str | None = None


_GU = f"{_U} TestGetGPUSchedulerPolicyByPodUnrecognizedValue"
_RN = "pkg/scheduler TestResolveNodeSchedulerPolicy"
DEFAULT_CASES = [
    DefaultCase(
        f"{_GU}/valid value overrides the configured policy", "spread", card_default="binpack", want="spread"
    ),
    DefaultCase(f"{_GU}/chain form is honoured", "binpack,numa", want="binpack,numa"),
    DefaultCase(f"{_GU}/filter-only form is honoured", "topology-aware", want="topology-aware"),
    DefaultCase(f"{_GU}/empty value keeps the configured policy", "", card_default="binpack", want="binpack"),
    DefaultCase(f"{_GU}/empty value keeps a spread default", "", want="spread"),
    *[
        DefaultCase(f"{_GU}/{name}", value, card_default=default, want=default)
        for name, value, default in (
            ("unrecognized value keeps the configured policy", "binpakc", "binpack"),
            ("chain with an unknown entry keeps the configured policy", "binpack,nmua", "binpack"),
            ("unrecognized value keeps a spread default", "binpakc", "spread"),
            ("chain with an unknown entry keeps a spread default", "binpack,nmua", "spread"),
        )
    ],
    *[
        DefaultCase(
            f"{_RN}/configured {default}/valid value overrides",
            other,
            node_default=default,
            which="node",
            want=other,
        )
        for default, other in (("binpack", "spread"), ("spread", "binpack"))
    ],
    *[
        DefaultCase(
            f"{_RN}/configured {default}/empty value keeps the configured policy",
            "",
            node_default=default,
            which="node",
            want=default,
        )
        for default in ("binpack", "spread")
    ],
    *[
        DefaultCase(f"{_RN}/configured binpack/{name}", value, which="node", want="binpack")
        for name, value in (
            ("unrecognized value keeps the configured policy", "spraed"),
            ("chain form is not a node policy", "binpack,spread"),
            ("gpu-only policy is not a node policy", "numa"),
        )
    ],
]


@pytest.mark.parametrize("case", [pytest_param(c) for c in DEFAULT_CASES])
def test_policy_annotation_against_the_configured_default(case: DefaultCase) -> None:
    policies = profile.Profile.build(case.node_default, case.card_default)
    key = keys.GPU_SCHEDULER_POLICY if case.which == "card" else keys.NODE_SCHEDULER_POLICY
    p = parsed(gpu(1, mem=100), annotations={key: case.annotation})
    got = policies.card(p, trusted=True) if case.which == "card" else policies.node(p, trusted=True)
    assert got is not None, "the pod's policy is unknown: InvalidRequest on every node"
    assert got.name == case.want


@pytest.mark.parametrize(
    ("source", "value", "want"),
    [
        (
            "valid ordered weights",
            "slot=1,core=2,memory=3",
            requests.ScoringWeights(slot=1, core=2, memory=3),
        ),
        (
            "valid reordered weights and whitespace",
            " memory = 3, slot = 1, core = 0 ",
            requests.ScoringWeights(slot=1, core=0, memory=3),
        ),
        ("missing dimension", "slot=1,memory=3", REFUSED),
        ("malformed entry", "slot=1,core,memory=3", REFUSED),
        ("non-integer", "slot=1,core=high,memory=3", REFUSED),
        ("negative", "slot=1,core=-1,memory=3", REFUSED),
        ("unknown key", "slot=1,bandwidth=2,memory=3", REFUSED),
        ("duplicate key", "slot=1,slot=2,memory=3", REFUSED),
        ("all zero", "slot=0,core=0,memory=0", REFUSED),
    ],
)
def test_scoring_weights_annotation(source: str, value: str, want: object) -> None:
    # pkg/util TestParseDeviceScoringWeights / TestGetDeviceScoringWeightsByPod
    del source
    body = pod_dict(gpu(1, mem=100), annotations={keys.DEVICE_SCORING_WEIGHTS: value})
    if want == REFUSED:
        with pytest.raises(errors.DecodeError):
            resources.parse_pod(body)
        return
    assert resources.parse_pod(body).scoring_weights == want


def test_missing_scoring_weights_use_hamis_defaults_only_when_given() -> None:
    # TestGetDeviceScoringWeightsByPod "missing annotation uses defaults": gpuslice keeps None and
    # ranks by its own usage key (see the differs case in FIT_CASES)
    assert parsed(gpu(1, mem=100)).scoring_weights is None
    assert requests.ScoringWeights() == requests.ScoringWeights(slot=1, core=1, memory=1)


def test_card_score_counts_the_request() -> None:
    # gpu_policy.go ComputeScore (differs): HAMi adds the request terms only when the request type
    # equals the card type ("NVIDIA" vs the model name, so never for NVIDIA); gpuslice always adds
    # them. Card: 2 of 10 slots, 1 of 4 cores, 2048 of 8192 MiB; request 1 card, 1024 MiB, 1 core.
    state = node("n").card(memory=8192, cores=4, slots=10).used(0, memory=2048, cores=1, slots=2).state()
    req = requests.ContainerRequest(count=1, memory_mib=1024, cores=1)
    got = usage.hami_card_key(state, 0, req, requests.ScoringWeights())
    hami = 2 / 10 + 1 / 4 + 2048 / 8192  # 0.7 (HAMi's Weight 10 scales it to 7)
    assert got == pytest.approx(3 / 10 + 2 / 4 + 3072 / 8192)
    assert got != pytest.approx(hami)


# ----- node order: node_policy_test.go (TestLess, TestComputeDefaultScore) and the policy e2e


@dataclasses.dataclass(frozen=True)
class NodeCase:
    source: str
    states: tuple[nodes.NodeState, ...]
    pod: requests.PodRequest
    node_policy: str
    want: str
    card_policy: str = "spread"
    cards: tuple[str, ...] | None = None
    differs: str | None = None
    xfail: str | None = None


def choose_node(case: NodeCase) -> tuple[str, fit.Placement]:
    """kube-scheduler's pick among the nodes that fit: the highest node-policy score, then the name."""
    node_policy = registry.get(case.node_policy)
    card_policy = registry.card_policy(case.card_policy)
    fitting = []
    for state in case.states:
        got = fit.place(state, case.pod, card_policy)
        if got.status.ok:
            score = node_policy.score_node(state, case.pod, api.EMPTY_CONTEXT).score
            fitting.append((-score, state.inventory.name, got))
    assert fitting, "no node fits"
    _, name, got = min(fitting, key=lambda t: (t[0], t[1]))
    return name, got


def _seeded(name: str, cores: int, pct_mem: int) -> nodes.NodeState:
    """Two 10000 MiB cards; g0 holds one pod of ``cores`` cores and ``pct_mem`` % memory."""
    return (
        node(name)
        .card(memory=10000, uuid_=f"{name}-g0")
        .card(memory=10000, uuid_=f"{name}-g1")
        .used(0, memory=pct_mem * 100, cores=cores)
        .state()
    )


_NP = "pkg/scheduler/policy/node_policy_test.go"
_E2E_COMBINED = f"{E2E_POLICY} honors combined node and GPU policy annotations"
_LOW, _HIGH = _seeded("low", 20, 20), _seeded("high", 60, 60)
_POD10 = parsed(gpu(1, pct=10, cores=10))

NODE_CASES = [
    NodeCase(
        f"{E2E_POLICY} places workloads according to node binpack and spread policies/binpack",
        (_seeded("a", 60, 40), _seeded("b", 0, 0)),
        _POD10,
        "binpack",
        "a",
    ),
    NodeCase(
        f"{E2E_POLICY} places workloads according to node binpack and spread policies/spread",
        (_seeded("a", 60, 40), _seeded("b", 0, 0)),
        _POD10,
        "spread",
        "b",
    ),
    NodeCase(
        f"{_E2E_COMBINED}/binpack node, binpack,spread GPU",
        (_LOW, _HIGH),
        _POD10,
        "binpack",
        "high",
        "binpack,spread",
        ("high-g0",),
    ),
    NodeCase(
        f"{_E2E_COMBINED}/binpack node, spread,binpack GPU",
        (_LOW, _HIGH),
        _POD10,
        "binpack",
        "high",
        "spread,binpack",
        ("high-g1",),
    ),
    NodeCase(
        f"{_E2E_COMBINED}/spread node, binpack,spread GPU",
        (_LOW, _HIGH),
        _POD10,
        "spread",
        "low",
        "binpack,spread",
        ("low-g0",),
    ),
    NodeCase(
        f"{_E2E_COMBINED}/spread node, spread,binpack GPU",
        (_LOW, _HIGH),
        _POD10,
        "spread",
        "low",
        "spread,binpack",
        ("low-g1",),
    ),
    # TestComputeDefaultScore's formula, 10 * (used/count + usedcores/totalcore + usedmem/totalmem)
    # over the node before the pod: "slots" holds 9 small pods (9/10 + 0 + 1000/10000 -> 10), "busy"
    # one big pod (1/10 + 30/100 + 5000/10000 -> 9). TestLess: binpack takes the highest score,
    # spread the lowest.
    *[
        NodeCase(
            f"{_NP} TestComputeDefaultScore + TestLess/{policy}",
            (
                node("slots").card(memory=10000).used(0, memory=1000, slots=9).state(),
                node("busy").card(memory=10000).used(0, memory=5000, cores=30).state(),
            ),
            pod().gpu(1, memory=1000).obj(),
            policy,
            want,
            differs=(
                "gpuslice's node score is 0.6*memory + 0.4*cores after placing the pod (docs/hami-compat.md "
                "section 11); HAMi's counts slots too (used/count + cores + memory, before the pod)"
            ),
        )
        # HAMi: binpack -> "slots", spread -> "busy"
        for policy, want in (("binpack", "busy"), ("spread", "slots"))
    ],
]


@pytest.mark.parametrize("case", [pytest_param(c) for c in NODE_CASES])
def test_node_order(case: NodeCase) -> None:
    name, got = choose_node(case)
    assert name == case.want
    if case.cards is not None:
        assert picked(got) == [sorted(case.cards)]


def test_case_sources_are_unique_and_differences_explained() -> None:
    tables: list[Sequence[Any]] = [
        FIT_CASES,
        QUOTA_CASES,
        USAGE_CASES,
        PARSE_CASES,
        POLICY_CASES,
        DEFAULT_CASES,
        NODE_CASES,
    ]
    sources = [c.source for t in tables for c in t]
    assert len(sources) == len(set(sources))
    for t in tables:
        for c in t:
            assert not (c.differs and c.xfail), c.source
    assert devices.FULL_CORES == 100  # the exclusive rule above assumes HAMi's unscaled card
