"""The list+watch informer against a real kube-apiserver.

Aspects: the initial paged list emits every object then LISTED; watch events (add, modify,
delete) follow; a stale resourceVersion (410 from the server) leads to a relist whose diff emits
DELETED for objects that vanished while the informer was away, and never to a re-watch at the
stale version.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from gpuslice.codec import keys
from gpuslice.kube import client as kclient
from gpuslice.kube import informer, kinds, objects
from gpuslice_dev.controlplane import ControlPlane
from tests.integration import kubehelpers as h
from tests.integration.conftest import unique

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

WAIT_S = 10.0


class Recorder:
    """Collects events; ``wait_for`` returns the first event matching a predicate."""

    def __init__(self) -> None:
        self.events: list[informer.Event[objects.Node]] = []
        self._changed = asyncio.Event()

    def __call__(self, event: informer.Event[objects.Node]) -> None:
        self.events.append(event)
        self._changed.set()

    async def wait_for(
        self, pred: Callable[[informer.Event[objects.Node]], bool], start: int = 0
    ) -> informer.Event[objects.Node]:
        async def scan() -> informer.Event[objects.Node]:
            seen = start
            while True:
                for e in self.events[seen:]:
                    if pred(e):
                        return e
                seen = len(self.events)
                self._changed.clear()
                await self._changed.wait()

        return await asyncio.wait_for(scan(), WAIT_S)


def named(t: informer.EventType, name: str) -> Callable[[informer.Event[objects.Node]], bool]:
    return lambda e: e.type is t and e.obj is not None and e.obj.metadata.name == name


@contextlib.asynccontextmanager
async def running(inf: informer.Informer[objects.Node]) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(inf.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_list_then_watch_nodes(control_plane: ControlPlane, kube: kclient.KubeClient) -> None:
    label = unique("inf")
    names = [f"{label}-{i}" for i in range(3)]
    for n in names:
        h.create_node(control_plane, n, labels={"gpuslice.io/test": label})
    rec = Recorder()
    # page_size 2: the 3 nodes need two pages (limit/continue).
    inf = informer.Informer(kube, kinds.NODES, rec, page_size=2, label_selector=f"gpuslice.io/test={label}")
    try:
        async with running(inf):
            await rec.wait_for(lambda e: e.type is informer.EventType.LISTED)
            assert inf.synced and inf.lists == 1
            assert sorted(inf.store) == names
            assert [e.type for e in rec.events] == [informer.EventType.ADDED] * 3 + [
                informer.EventType.LISTED
            ]

            extra = f"{label}-x"
            names.append(extra)
            h.create_node(control_plane, extra, labels={"gpuslice.io/test": label})
            await rec.wait_for(named(informer.EventType.ADDED, extra))
            # A GPU annotation (stored nodes keep only those: objects.NodeWire).
            ann = {keys.DEVICE_CORDON: "GPU-x", "example.com/other": "b"}
            control_plane.api_request("PATCH", f"/api/v1/nodes/{extra}", {"metadata": {"annotations": ann}})
            # (create_node's status patch is a MODIFIED too; wait for the annotation.)
            is_mod = named(informer.EventType.MODIFIED, extra)
            got = await rec.wait_for(
                lambda e: is_mod(e) and e.obj is not None and bool(e.obj.metadata.annotations)
            )
            assert got.obj is not None and got.obj.metadata.annotations == {keys.DEVICE_CORDON: "GPU-x"}
            control_plane.api_request("DELETE", f"/api/v1/nodes/{names[0]}")
            await rec.wait_for(named(informer.EventType.DELETED, names[0]))
            assert names[0] not in inf.store and extra in inf.store
            assert inf.healthy and inf.restarts == 0
    finally:
        for n in names:
            control_plane.api_request("DELETE", f"/api/v1/nodes/{n}")


@pytest.fixture(scope="module")
def uncached_plane() -> Iterator[ControlPlane]:
    """A second apiserver without watch cache: watches go to etcd, so compaction yields 410."""
    with ControlPlane(extra_apiserver_args=["--watch-cache=false"]) as plane:
        yield plane


def compact_etcd(plane: ControlPlane, revision: int) -> None:
    """Compact etcd up to ``revision`` through its JSON gateway (physical: wait for it)."""
    body = json.dumps({"revision": str(revision), "physical": True}).encode()
    req = urllib.request.Request(f"{plane.etcd_url}/v3/kv/compaction", data=body, method="POST")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=10) as resp:
        assert resp.status == 200


async def test_gone_relists_and_emits_deletes(uncached_plane: ControlPlane) -> None:
    plane = uncached_plane
    names = [f"gone-{i}" for i in range(3)]
    for n in names:
        h.create_node(plane, n)
    rec = Recorder()
    async with kclient.KubeClient.from_kubeconfig(plane.kubeconfig, qps=0) as kube:
        inf = informer.Informer(kube, kinds.NODES, rec)
        stale = await inf.relist()
        assert sorted(inf.store) == names
        # While the informer is away a node disappears and etcd compacts past the informer's
        # resourceVersion: the watch at that version must fail with 410 and force a relist.
        plane.api_request("DELETE", f"/api/v1/nodes/{names[1]}")
        status, node = plane.api_request(
            "PATCH", f"/api/v1/nodes/{names[0]}", {"metadata": {"labels": {"x": "1"}}}
        )
        assert status == 200
        compact_etcd(plane, int(node["metadata"]["resourceVersion"]))
        mark = len(rec.events)

        async with running(inf):
            deleted = await rec.wait_for(named(informer.EventType.DELETED, names[1]), start=mark)
            await rec.wait_for(lambda e: e.type is informer.EventType.LISTED, start=mark)

    assert deleted.obj is not None
    assert inf.gone == 1 and inf.lists == 2
    assert sorted(inf.store) == [names[0], names[2]]
    assert inf.resource_version != stale
    types = [(e.type, e.obj.metadata.name if e.obj else "") for e in rec.events[mark:]]
    # names[0] changed (label): MODIFIED; names[2] unchanged: no event; names[1] gone: DELETED.
    assert types == [
        (informer.EventType.MODIFIED, names[0]),
        (informer.EventType.DELETED, names[1]),
        (informer.EventType.LISTED, ""),
    ]


async def test_pods_in_one_namespace(
    control_plane: ControlPlane, kube: kclient.KubeClient, namespace: str
) -> None:
    h.create_pod(control_plane, namespace, "p0")
    events: list[informer.Event[objects.Pod]] = []
    inf = informer.Informer(kube, kinds.PODS.in_namespace(namespace), events.append)

    rv = await inf.relist()

    assert list(inf.store) == [f"{namespace}/p0"] and rv
    assert [e.type for e in events] == [informer.EventType.ADDED, informer.EventType.LISTED]
