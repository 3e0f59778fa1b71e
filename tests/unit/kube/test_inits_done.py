"""kube.objects: initContainerStatuses and Pod.inits_done; kube.sync and extender.feed act on it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User

from gpuslice.cache import cache as cluster_cache
from gpuslice.codec import keys, pod_devices, registrations
from gpuslice.extender import config, feed, metrics
from gpuslice.framework import logs, nominations
from gpuslice.kube import client as kclient
from gpuslice.kube import informer, kinds, objects, sync
from gpuslice.model import allocations, nodes
from gpuslice.policy import quota
from gpuslice_dev import nodesim

pytestmark = pytest.mark.unit

E = informer.EventType
STARTED = "2026-01-01T00:00:00Z"


def done(name: str, code: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "ready": False,
        "restartCount": 0,
        "image": "busybox",
        "state": {"terminated": {"exitCode": code, "reason": "Completed", "startedAt": STARTED}},
    }


def running(name: str) -> dict[str, Any]:
    return {"name": name, "state": {"running": {"startedAt": STARTED}}}


def waiting(name: str) -> dict[str, Any]:
    return {"name": name, "state": {"waiting": {"reason": "PodInitializing"}}}


def pod_json(inits: list[dict[str, Any]], statuses: list[dict[str, Any]] | None) -> bytes:
    status: dict[str, Any] = {"phase": "Pending"}
    if statuses is not None:
        status["initContainerStatuses"] = statuses
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {"initContainers": inits, "containers": [{"name": "app", "image": "busybox"}]},
        "status": status,
    }
    return json.dumps(body).encode()


I1 = {"name": "i1", "image": "busybox"}
I2 = {"name": "i2", "image": "busybox"}
SIDECAR = {"name": "side", "image": "busybox", "restartPolicy": "Always"}

CASES = [
    # (id, init containers, initContainerStatuses, inits_done)
    ("no-init-containers", [], None, False),
    ("no-init-containers-empty-statuses", [], [], False),
    ("one-succeeded", [I1], [done("i1")], True),
    ("all-succeeded", [I1, I2], [done("i1"), done("i2")], True),
    ("statuses-in-any-order", [I1, I2], [done("i2"), done("i1")], True),
    ("no-statuses-yet", [I1], None, False),
    ("one-missing", [I1, I2], [done("i1")], False),
    ("one-running", [I1, I2], [done("i1"), running("i2")], False),
    ("one-waiting", [I1, I2], [done("i1"), waiting("i2")], False),
    ("failed-exit-1", [I1], [done("i1", 1)], False),
    ("killed-exit-137", [I1, I2], [done("i1"), done("i2", 137)], False),
    ("status-of-another-name", [I1], [done("other")], False),
    # a native sidecar keeps running (and stays charged); the other init containers are done
    ("native-sidecar-running", [I1, SIDECAR], [done("i1"), running("side")], True),
    ("native-sidecar-and-a-running-init", [SIDECAR, I1], [running("side"), running("i1")], False),
    ("only-a-native-sidecar", [SIDECAR], [done("side")], False),
]


@pytest.mark.parametrize(("inits", "statuses", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_inits_done(
    inits: list[dict[str, Any]], statuses: list[dict[str, Any]] | None, expected: bool
) -> None:
    pod = objects.decode_pod(pod_json(inits, statuses))
    assert pod.inits_done is expected
    assert pod.sidecars == tuple(i for i, c in enumerate(inits) if c.get("restartPolicy") == "Always")
    # the informer's decoder (which trims annotations) keeps what inits_done reads
    assert kinds.PODS.decoder.decode(pod_json(inits, statuses)).inits_done is expected


def test_statuses_decode_only_what_is_read() -> None:
    pod = objects.decode_pod(pod_json([I1, SIDECAR], [done("i1", 3), running("side")]))
    assert pod.spec.init_containers[1].restart_policy == "Always"
    assert pod.status.init_container_statuses == [
        objects.ContainerStatus("i1", objects.ContainerState(objects.ContainerStateTerminated(3))),
        objects.ContainerStatus("side", objects.ContainerState(None)),
    ]
    assert not pod.status.init_container_statuses[0].succeeded


# ----- kube.sync.Sync.on_pod -> ClusterCache

NODE = "n1"
CARDS = nodesim.cards(NODE, count=2)
CARD_A, CARD_B = CARDS[0].uuid, CARDS[1].uuid
# init container: 5000 MiB on A and 2000 MiB on B; app container: 1500 MiB / 10 cores on A
ALLOC = allocations.PodAllocation(
    node=NODE,
    containers=(
        (allocations.DeviceGrant(CARD_A, 5000, 0), allocations.DeviceGrant(CARD_B, 2000, 0)),
        (allocations.DeviceGrant(CARD_A, 1500, 10),),
    ),
    init_count=1,
)
PLACED = pod_devices.bind_annotations(ALLOC, 1_800_000_000.0)


def placed_pod(statuses: list[objects.ContainerStatus], phase: str = "Running") -> objects.Pod:
    return objects.Pod(
        metadata=objects.ObjectMeta(name="p", namespace="ns", uid="u1", annotations=PLACED),
        spec=objects.PodSpec(
            node_name=NODE,
            init_containers=[objects.Container(name="init")],
            containers=[objects.Container(name="app")],
        ),
        status=objects.PodStatus(phase=phase, init_container_statuses=statuses),
    )


def exited(code: int) -> objects.ContainerStatus:
    return objects.ContainerStatus("init", objects.ContainerState(objects.ContainerStateTerminated(code)))


RUNNING = objects.ContainerStatus("init", objects.ContainerState(None))


@pytest.fixture
def setup() -> Iterator[tuple[sync.Sync, cluster_cache.ClusterCache]]:
    config = KubeConfig.from_one(cluster=Cluster(server="http://127.0.0.1:9"), user=User(token="t")).get()
    assert config is not None
    cache = cluster_cache.ClusterCache(nominator=nominations.Nominator())
    cache.set_quota("ns", quota.QuotaView(memory_limit=100_000))
    s = sync.Sync(kclient.KubeClient(config), cache)
    register = {keys.NODE_REGISTER: registrations.encode_json(CARDS)}
    node = objects.Node(metadata=objects.ObjectMeta(name=NODE, annotations=register))
    s.on_node(informer.Event(E.ADDED, node))
    yield s, cache


def charged(cache: cluster_cache.ClusterCache) -> tuple[nodes.CardUsage, nodes.CardUsage, int]:
    snap = cache.snapshot()
    q = snap.quota("ns")
    assert q is not None
    return snap.nodes[NODE].usage[0], snap.nodes[NODE].usage[1], q.used_memory


FULL = (nodes.CardUsage(1, 5000, 10), nodes.CardUsage(1, 2000, 0), 7000)
APP = (nodes.CardUsage(1, 1500, 10), nodes.EMPTY_CARD, 1500)


def test_on_pod_releases_the_init_peak_and_takes_it_back(
    setup: tuple[sync.Sync, cluster_cache.ClusterCache],
) -> None:
    s, cache = setup
    s.on_pod(informer.Event(E.ADDED, placed_pod([], phase="Pending")))
    assert charged(cache) == FULL
    s.on_pod(informer.Event(E.MODIFIED, placed_pod([RUNNING], phase="Pending")))
    assert charged(cache) == FULL
    s.on_pod(informer.Event(E.MODIFIED, placed_pod([exited(1)], phase="Pending")))
    assert charged(cache) == FULL
    s.on_pod(informer.Event(E.MODIFIED, placed_pod([exited(0)])))
    assert charged(cache) == APP
    s.on_pod(informer.Event(E.MODIFIED, placed_pod([exited(0)])))  # the same again: no change
    assert charged(cache) == APP
    s.on_pod(informer.Event(E.MODIFIED, placed_pod([RUNNING], phase="Pending")))  # kubelet re-runs it
    assert charged(cache) == FULL
    s.on_pod(informer.Event(E.MODIFIED, placed_pod([exited(0)])))
    s.on_pod(informer.Event(E.DELETED, placed_pod([exited(0)])))
    assert charged(cache) == (nodes.EMPTY_CARD, nodes.EMPTY_CARD, 0)


def test_a_restart_charges_a_pod_past_its_inits_with_the_app_only(
    setup: tuple[sync.Sync, cluster_cache.ClusterCache],
) -> None:
    s, cache = setup
    s.on_pod(informer.Event(E.ADDED, placed_pod([exited(0)])))
    assert charged(cache) == APP


# ----- extender.feed: the release nudges the requeue like any freed capacity


def test_feed_nudges_the_node_once_when_the_init_peak_is_released() -> None:
    cache = cluster_cache.ClusterCache(nominator=nominations.Nominator())
    kube: Any = object()  # informers are built but never run here
    f = feed.Feed(kube, cache, config.Settings(), logs.Log(0), metrics.Metrics())
    freed: list[str] = []
    f.on_capacity_freed.add(freed.append)
    register = {keys.NODE_REGISTER: registrations.encode_json(CARDS)}
    f.sync.nodes.handler(
        informer.Event(E.ADDED, objects.Node(metadata=objects.ObjectMeta(name=NODE, annotations=register)))
    )
    on_pod = f.sync.pods.handler
    on_pod(informer.Event(E.ADDED, placed_pod([RUNNING], phase="Pending")))
    on_pod(informer.Event(E.MODIFIED, placed_pod([exited(1)], phase="Pending")))
    assert freed == []
    on_pod(informer.Event(E.MODIFIED, placed_pod([exited(0)])))
    assert freed == [NODE]
    assert cache.snapshot().nodes[NODE].usage[1] == nodes.EMPTY_CARD
    on_pod(informer.Event(E.MODIFIED, placed_pod([exited(0)])))  # a later status update: no new nudge
    assert freed == [NODE]
    on_pod(informer.Event(E.DELETED, placed_pod([exited(0)])))  # the pod goes away: freed again
    assert freed == [NODE, NODE]
    # a pod first seen past its init containers (e.g. after a restart) frees nothing
    on_pod(informer.Event(E.ADDED, placed_pod([exited(0)])))
    on_pod(informer.Event(E.MODIFIED, placed_pod([exited(0)])))
    assert freed == [NODE, NODE]
