"""Host CPU and memory: node allocatable into the inventory, every bound pod's requests charged."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User

from gpuslice.cache import cache as cluster_cache
from gpuslice.cache import shapes
from gpuslice.codec import errors as codec_errors
from gpuslice.codec import keys, pod_devices, registrations, resources
from gpuslice.framework import nominations
from gpuslice.kube import client as kclient
from gpuslice.kube import informer, objects, sync
from gpuslice.model import allocations
from gpuslice.policy import api
from gpuslice_dev import nodesim

pytestmark = pytest.mark.unit

E = informer.EventType
NODE = "n1"
CARDS = nodesim.cards(NODE, count=2)
REGISTER = registrations.encode_json(CARDS)
ALLOCATABLE = {"cpu": "32", "memory": "128Gi", "pods": "110"}


def node_obj(allocatable: dict[str, str]) -> objects.Node:
    return objects.Node(
        metadata=objects.ObjectMeta(name=NODE, annotations={keys.NODE_REGISTER: REGISTER}),
        status=objects.NodeStatus(allocatable=allocatable),
    )


def container(name: str, cpu: str | None, memory: str | None, restart: str = "") -> objects.Container:
    reqs = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return objects.Container(
        name=name, resources=objects.ResourceRequirements(requests=reqs), restart_policy=restart
    )


def pod_obj(
    name: str,
    node_name: str,
    apps: list[objects.Container],
    inits: list[objects.Container] | None = None,
    annotations: dict[str, str] | None = None,
    phase: str = "Running",
) -> objects.Pod:
    return objects.Pod(
        metadata=objects.ObjectMeta(
            name=name, namespace="ns", uid=f"u-{name}", annotations=annotations or {}
        ),
        spec=objects.PodSpec(node_name=node_name, containers=apps, init_containers=inits or []),
        status=objects.PodStatus(phase=phase),
    )


@pytest.fixture
def setup() -> Iterator[tuple[sync.Sync, cluster_cache.ClusterCache]]:
    config = KubeConfig.from_one(cluster=Cluster(server="http://127.0.0.1:9"), user=User(token="t")).get()
    assert config is not None
    cache = cluster_cache.ClusterCache(nominator=nominations.Nominator())
    s = sync.Sync(kclient.KubeClient(config), cache)
    s.on_node(informer.Event(E.ADDED, node_obj(ALLOCATABLE)))
    yield s, cache


def host(cache: cluster_cache.ClusterCache) -> tuple[int, int, int, int]:
    state = cache.snapshot().nodes[NODE]
    return state.inventory.cpu_milli, state.cpu_used_milli, state.inventory.memory_mib, state.memory_used_mib


def test_node_allocatable_becomes_the_inventory_host_capacity(
    setup: tuple[sync.Sync, cluster_cache.ClusterCache],
) -> None:
    s, cache = setup
    assert host(cache) == (32000, 0, 131072, 0)
    # A new allocatable (kubelet reserved more) is taken even though the GPU annotations are unchanged.
    s.on_node(informer.Event(E.MODIFIED, node_obj({"cpu": "31500m", "memory": "100Gi"})))
    assert host(cache) == (31500, 0, 102400, 0)


def test_every_bound_pod_charges_its_host_requests_gpu_or_not(
    setup: tuple[sync.Sync, cluster_cache.ClusterCache],
) -> None:
    s, cache = setup
    plain = pod_obj("web", NODE, [container("a", "500m", "1Gi"), container("b", "250m", "512Mi")])
    s.on_pod(informer.Event(E.ADDED, plain))
    assert host(cache) == (32000, 750, 131072, 1536)
    alloc = allocations.PodAllocation(
        node=NODE, containers=((allocations.DeviceGrant(uuid=CARDS[0].uuid, memory_mib=1000, cores=10),),)
    )
    gpu = pod_obj(
        "train",
        NODE,
        [container("c", "4", "16Gi")],
        annotations=pod_devices.bind_annotations(alloc, 1_800_000_000.0),
    )
    s.on_pod(informer.Event(E.ADDED, gpu))
    assert host(cache) == (32000, 4750, 131072, 17920)
    assert cache.snapshot().nodes[NODE].usage[0].memory_mib == 1000
    # Finished and deleted pods give their requests back; an unbound pod charges nothing.
    s.on_pod(informer.Event(E.MODIFIED, pod_obj("web", NODE, plain.spec.containers, phase="Succeeded")))
    assert host(cache) == (32000, 4000, 131072, 16384)
    s.on_pod(informer.Event(E.DELETED, gpu))
    s.on_pod(informer.Event(E.ADDED, pod_obj("pending", "", [container("a", "8", "8Gi")])))
    assert host(cache) == (32000, 0, 131072, 0)
    assert cache.pod_state("ns/pending") is None


def test_a_pod_without_requests_is_not_held(setup: tuple[sync.Sync, cluster_cache.ClusterCache]) -> None:
    s, cache = setup
    s.on_pod(informer.Event(E.ADDED, pod_obj("best-effort", NODE, [container("a", None, None)])))
    assert cache.pod_state("ns/best-effort") is None and host(cache)[1] == 0


@pytest.mark.parametrize(
    ("apps", "inits", "sidecars", "expected"),
    [
        # app containers add up
        ([(500, 100), (250, 50)], [], (), (750, 150)),
        # an init container bigger than the apps sets the peak
        ([(500, 100)], [(2000, 10)], (), (2000, 100)),
        # init containers run one at a time: the largest counts, not their sum
        ([(100, 10)], [(300, 30), (200, 400)], (), (300, 400)),
        # a native sidecar (init 0) runs beside the later init container and the apps:
        # apps phase 100 + 50 = 150; init 1 phase 300 + 50 = 350
        ([(100, 10)], [(50, 5), (300, 30)], (0,), (350, 35)),
        # two sidecars accumulate, each init peak counts the sidecars started before it
        ([(100, 10)], [(1000, 1), (50, 5), (60, 6)], (1, 2), (1000, 21)),
    ],
)
def test_host_request_follows_kubernetes_pod_requests(
    apps: list[tuple[int, int]],
    inits: list[tuple[int, int]],
    sidecars: tuple[int, ...],
    expected: tuple[int, int],
) -> None:
    assert resources.host_request(apps, inits, sidecars) == expected


def test_sidecar_pod_through_sync(setup: tuple[sync.Sync, cluster_cache.ClusterCache]) -> None:
    s, cache = setup
    pod = pod_obj(
        "mesh",
        NODE,
        [container("app", "1", "1Gi")],
        inits=[container("proxy", "200m", "128Mi", restart="Always"), container("migrate", "2", "64Mi")],
    )
    s.on_pod(informer.Event(E.ADDED, pod))
    # apps 1000 + proxy 200 = 1200 > migrate 2000 + proxy 200 = 2200 -> 2200 milli;
    # memory: 1024 + 128 = 1152 > 64 + 128
    assert host(cache)[1:4:2] == (2200, 1152)


@pytest.mark.parametrize(
    ("allocatable", "expected"),
    [
        ({"cpu": "7910m", "memory": "32746492Ki"}, (7910, 31978)),  # 32746492 / 1024 = 31978.99, down
        ({"cpu": "2"}, (2000, 0)),
        ({}, (0, 0)),
    ],
)
def test_allocatable_host(allocatable: dict[str, str], expected: tuple[int, int]) -> None:
    assert resources.allocatable_host(allocatable) == expected


def test_malformed_allocatable_is_an_error() -> None:
    with pytest.raises(codec_errors.DecodeError):
        resources.allocatable_host({"cpu": "lots"})


# ----- values past the bounds of gpuslice.model.limits


def test_a_node_whose_allocatable_is_past_the_bound_is_invalid_and_named(
    setup: tuple[sync.Sync, cluster_cache.ClusterCache],
) -> None:
    s, cache = setup
    s.on_node(informer.Event(E.MODIFIED, node_obj({"cpu": "1e30", "memory": "128Gi"})))
    assert NODE not in cache.snapshot().nodes
    assert "cpu" in s.invalid_nodes[NODE] and "status.allocatable" in s.invalid_nodes[NODE]


def test_a_bound_pod_with_an_absurd_request_holds_no_host_resources(
    setup: tuple[sync.Sync, cluster_cache.ClusterCache],
) -> None:
    s, cache = setup
    s.on_pod(informer.Event(E.ADDED, pod_obj("sane", NODE, [container("c", "2", "1Gi")])))
    s.on_pod(informer.Event(E.ADDED, pod_obj("absurd", NODE, [container("c", "1e30", "1Gi")])))
    # the absurd pod is not charged (no node could run it); the sane one is, and nothing overflows
    assert host(cache) == (32000, 2000, 131072, 1024)


def test_a_pending_pod_with_an_absurd_request_never_enters_the_workload() -> None:
    config = KubeConfig.from_one(cluster=Cluster(server="http://127.0.0.1:9"), user=User(token="t")).get()
    assert config is not None
    hist = shapes.ShapeHistogram()
    s = sync.Sync(
        kclient.KubeClient(config), cluster_cache.ClusterCache(hist, nominator=nominations.Nominator())
    )
    for name, cpu in (("absurd-cpu", "1e30"), ("absurd-total", f"{2**39 // 1000 + 1}"), ("sane", "4")):
        apps = [container("a", cpu, None), container("b", cpu, None)]  # two: the total is checked too
        s.on_pod(informer.Event(E.ADDED, pod_obj(name, "", apps, phase="Pending")))
    assert list(hist.weights()) == [api.Shape(cpu_milli=8000, share_milli=0, count=0)]
    assert hist.refused == 0  # refused where decoded, before the histogram's own guard


def test_usage_summed_past_int32_on_one_card_is_held_without_overflow(
    setup: tuple[sync.Sync, cluster_cache.ClusterCache],
) -> None:
    # Device annotations are int32 each (HAMi's format); two of them on one card add past it.
    s, cache = setup
    uuid = CARDS[0].uuid
    for name in ("x", "y"):
        ann = {
            keys.VGPU_NODE: NODE,
            keys.DEVICES_ALLOCATED: pod_devices.encode(
                [(allocations.DeviceGrant(uuid=uuid, memory_mib=2**31 - 1, cores=2**31 - 1),)]
            ),
        }
        s.on_pod(informer.Event(E.ADDED, pod_obj(name, NODE, [container("c", "1", None)], annotations=ann)))
    snap = cache.snapshot()
    assert snap.nodes[NODE].usage[0].memory_mib == 2 * (2**31 - 1)
    assert snap.columns.cards.max() <= 2**31 - 1  # clipped into the int32 columns, card read as full
