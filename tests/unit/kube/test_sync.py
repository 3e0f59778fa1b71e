"""kube.sync's event handlers on a real ClusterCache (no apiserver: events are fed directly)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User

from gpuslice.cache import cache as cluster_cache
from gpuslice.codec import keys, pod_devices, registrations
from gpuslice.framework import nominations
from gpuslice.kube import client as kclient
from gpuslice.kube import informer, objects, sync
from gpuslice.model import allocations, nodes, status
from gpuslice_dev import nodesim

pytestmark = pytest.mark.unit

E = informer.EventType
NODE = "n1"
CARDS = nodesim.cards(NODE, count=2)
REGISTER = registrations.encode_json(CARDS)
ALLOC = allocations.PodAllocation(
    node=NODE, containers=((allocations.DeviceGrant(uuid=CARDS[0].uuid, memory_mib=1000, cores=10),),)
)


def node_obj(annotations: dict[str, str], name: str = NODE) -> objects.Node:
    return objects.Node(metadata=objects.ObjectMeta(name=name, annotations=annotations))


def pod_obj(annotations: dict[str, str], node_name: str = "", phase: str = "Pending") -> objects.Pod:
    return objects.Pod(
        metadata=objects.ObjectMeta(name="p", namespace="ns", uid="u1", annotations=annotations),
        spec=objects.PodSpec(node_name=node_name, containers=[objects.Container(name="c")]),
        status=objects.PodStatus(phase=phase),
    )


PLACED = pod_devices.bind_annotations(ALLOC, 1_800_000_000.0)


@pytest.fixture
def setup() -> Iterator[tuple[sync.Sync, cluster_cache.ClusterCache, list[tuple[str, str]]]]:
    config = KubeConfig.from_one(cluster=Cluster(server="http://127.0.0.1:9"), user=User(token="t")).get()
    assert config is not None
    cache = cluster_cache.ClusterCache(nominator=nominations.Nominator())
    invalid: list[tuple[str, str]] = []
    s = sync.Sync(kclient.KubeClient(config), cache, on_invalid=lambda n, r: invalid.append((n, r)))
    s.on_node(informer.Event(E.ADDED, node_obj({keys.NODE_REGISTER: REGISTER})))
    yield s, cache, invalid


def used(cache: cluster_cache.ClusterCache) -> tuple[int, int, int]:
    u = cache.snapshot().nodes[NODE].usage[0]
    return u.slots, u.memory_mib, u.cores


def test_placed_pod_is_charged_and_uncharged(
    setup: tuple[sync.Sync, cluster_cache.ClusterCache, list[tuple[str, str]]],
) -> None:
    s, cache, _ = setup
    s.on_pod(informer.Event(E.ADDED, pod_obj(PLACED, NODE)))
    assert used(cache) == (1, 1000, 10)
    s.on_pod(informer.Event(E.MODIFIED, pod_obj(PLACED, NODE, phase="Succeeded")))
    assert used(cache) == (0, 0, 0)
    s.on_pod(informer.Event(E.MODIFIED, pod_obj(PLACED, NODE)))
    s.on_pod(informer.Event(E.DELETED, pod_obj(PLACED, NODE)))
    assert used(cache) == (0, 0, 0) and cache.pod_state("ns/p") is None


@pytest.mark.parametrize(
    "annotations",
    [{}, PLACED],
    ids=["before-the-annotation-patch", "annotated-before-the-binding"],
)
def test_assumed_pod_is_left_to_the_bind_path(
    setup: tuple[sync.Sync, cluster_cache.ClusterCache, list[tuple[str, str]]], annotations: dict[str, str]
) -> None:
    s, cache, _ = setup
    assert cache.assume("ns/p", "u1", ALLOC, 0.0).ok
    s.on_pod(informer.Event(E.MODIFIED, pod_obj(annotations)))  # no nodeName yet
    assert cache.pod_state("ns/p") is cluster_cache.PodState.ASSUMED
    assert used(cache) == (1, 1000, 10)
    s.on_pod(informer.Event(E.MODIFIED, pod_obj(PLACED, NODE)))  # bound: the watch confirms
    assert cache.pod_state("ns/p") is cluster_cache.PodState.ADDED


def test_unannotated_pod_is_not_charged_and_annotation_removal_uncharges(
    setup: tuple[sync.Sync, cluster_cache.ClusterCache, list[tuple[str, str]]],
) -> None:
    s, cache, _ = setup
    s.on_pod(informer.Event(E.ADDED, pod_obj({}, NODE)))
    assert cache.pod_state("ns/p") is None
    s.on_pod(informer.Event(E.MODIFIED, pod_obj(PLACED, NODE)))
    s.on_pod(informer.Event(E.MODIFIED, pod_obj({}, NODE)))
    assert cache.pod_state("ns/p") is None and used(cache) == (0, 0, 0)


def test_malformed_device_annotation_is_reported_not_charged(
    setup: tuple[sync.Sync, cluster_cache.ClusterCache, list[tuple[str, str]]],
) -> None:
    s, cache, _ = setup
    bad = {**PLACED, keys.DEVICES_ALLOCATED: "GPU-x,NVIDIA,notanumber,0:;"}
    s.on_pod(informer.Event(E.ADDED, pod_obj(bad, NODE)))
    assert cache.pod_state("ns/p") is None and list(s.bad_pods) == ["ns/p"]
    s.on_pod(informer.Event(E.MODIFIED, pod_obj(PLACED, NODE)))
    assert s.bad_pods == {} and used(cache) == (1, 1000, 10)


def test_invalid_registration_excludes_only_that_node_and_reports_once(
    setup: tuple[sync.Sync, cluster_cache.ClusterCache, list[tuple[str, str]]],
) -> None:
    s, cache, invalid = setup
    for _ in range(2):  # the same problem twice: one report
        s.on_node(informer.Event(E.MODIFIED, node_obj({keys.NODE_REGISTER: "[{oops"}, name="n2")))
    s.on_node(informer.Event(E.MODIFIED, node_obj({keys.NODE_REGISTER: "[]"}, name="n2")))  # another problem
    assert set(cache.snapshot().nodes) == {NODE}
    assert [n for n, _ in invalid] == ["n2", "n2"] and "no gpu found" in s.invalid_nodes["n2"]
    s.on_node(informer.Event(E.MODIFIED, node_obj({keys.NODE_REGISTER: REGISTER}, name="n2")))
    assert s.invalid_nodes == {} and set(cache.snapshot().nodes) == {NODE, "n2"}
    s.on_node(informer.Event(E.MODIFIED, node_obj({}, name="n2")))  # registration gone: not a GPU node
    assert set(cache.snapshot().nodes) == {NODE} and s.invalid_nodes == {}
    assert status.NODE_REGISTRATION_INVALID == "NodeRegistrationInvalid"


def test_transform_applies_to_every_inventory() -> None:
    config = KubeConfig.from_one(cluster=Cluster(server="http://127.0.0.1:9"), user=User(token="t")).get()
    assert config is not None
    cache = cluster_cache.ClusterCache(nominator=nominations.Nominator())

    def halve(inv: nodes.NodeInventory) -> nodes.NodeInventory:
        return nodes.NodeInventory(name=inv.name, devices=inv.devices[:1])

    s = sync.Sync(kclient.KubeClient(config), cache, transform=halve)
    s.on_node(informer.Event(E.ADDED, node_obj({keys.NODE_REGISTER: REGISTER})))
    assert len(cache.snapshot().nodes[NODE].inventory.devices) == 1
