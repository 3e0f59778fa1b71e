"""The node agent (fake NVML backend) against a real kube-apiserver, read back by the extender's feed.

Aspects: the agent's merge patch lands on the Node and the extender's node informer decodes it into
the cluster cache (8 cards, topology, telemetry); a second round patches nothing; an XID 79 on one
card reaches the cache as an unhealthy card and an events.k8s.io Warning regarding the Node, and
the card comes back after the quiet period; a missing Node is reported, not fatal; ``gpuslice agent
--once`` works end to end.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuslice.agent import cli, fake, metrics, service
from gpuslice.codec import keys
from gpuslice.kube import client as kclient
from gpuslice.kube import nodes as kube_nodes
from gpuslice_dev.controlplane import ControlPlane
from tests.integration import extcache
from tests.integration import kubehelpers as h

pytestmark = pytest.mark.integration
on_session_loop = pytest.mark.asyncio(loop_scope="session")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_agent(
    cp: ControlPlane, node: str, shape: str, clock: Callable[[], float] = time.monotonic, **settings: Any
) -> tuple[service.Agent, fake.FakeBackend]:
    nvml = fake.FakeBackend(fake.shape(shape))
    api = kube_nodes.NodeClient.from_kubeconfig(str(cp.kubeconfig), node, time.time)
    s = service.Settings(**{"node_name": node, "register": True, "watch_health": False, **settings})
    return service.Agent(s, lambda: nvml, api, metrics.AgentMetrics(), clock=clock), nvml


def node_events(cp: ControlPlane, node: str) -> list[dict[str, Any]]:
    status, body = cp.api_request(
        "GET", f"/apis/events.k8s.io/v1/namespaces/default/events?fieldSelector=regarding.name%3D{node}"
    )
    assert status == 200, body
    items: list[dict[str, Any]] = body["items"]
    return sorted(items, key=lambda e: e["eventTime"])


@on_session_loop
async def test_agent_patch_reaches_the_extender_cache(
    control_plane: ControlPlane, kube: kclient.KubeClient, node_name: str
) -> None:
    h.create_node(control_plane, node_name)
    agent, _ = make_agent(control_plane, node_name, "a100-8-2numa")
    try:
        async with extcache.extender_cache(kube) as cache:
            report = await asyncio.to_thread(agent.refresh)
            assert report.error is None
            assert set(report.patched) == {keys.NODE_REGISTER, keys.NODE_PAIR_SCORE, keys.GPU_TOPOLOGY}
            await asyncio.to_thread(agent.publish_telemetry)
            state = await extcache.cached(cache, node_name, lambda s: len(s.inventory.telemetry) == 8)
            inv = state.inventory
            assert [d.type for d in inv.devices] == ["NVIDIA A100-PCIE-40GB"] * 8
            assert [d.numa for d in inv.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
            assert inv.topology is not None
            assert inv.topology.uuids == tuple(d.uuid for d in inv.devices)
            assert inv.topology.pair_score(0, 1) == 50  # one PCIe switch
            assert inv.topology.pair_score(0, 4) == 10  # across sockets
            assert (await asyncio.to_thread(agent.refresh)).patched == []  # nothing changed: no patch
    finally:
        agent.close()


@on_session_loop
async def test_xid_marks_card_unhealthy_with_warning_event(
    control_plane: ControlPlane, kube: kclient.KubeClient, node_name: str
) -> None:
    h.create_node(control_plane, node_name)
    clock = Clock()
    agent, nvml = make_agent(
        control_plane, node_name, "h100-8", clock, watch_health=True, health_poll_s=0.05, quiet_period_s=60.0
    )
    stop = threading.Event()
    loop = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    try:
        async with extcache.extender_cache(kube) as cache:
            loop.start()
            await extcache.cached(cache, node_name, lambda s: len(s.inventory.devices) == 8)
            nvml.inject_xid(5, 13)  # application error: nothing happens
            nvml.inject_xid(5, 79)  # fallen off the bus
            state = await extcache.cached(cache, node_name, lambda s: not s.inventory.devices[5].health)
            assert [d.health for d in state.inventory.devices] == [True] * 5 + [False] + [True] * 2
            events = node_events(control_plane, node_name)
            assert [(e["type"], e["reason"]) for e in events] == [("Warning", "GPUUnhealthy")]
            assert events[0]["reportingController"] == kube_nodes.REPORTING_CONTROLLER
            assert events[0]["regarding"]["kind"] == "Node" and events[0]["regarding"]["uid"]
            assert "XID 79" in events[0]["note"]
            clock.now += 60.0  # quiet period over
            await extcache.cached(cache, node_name, lambda s: all(d.health for d in s.inventory.devices))
            reasons = [e["reason"] for e in node_events(control_plane, node_name)]
            assert reasons == ["GPUUnhealthy", "GPURecovered"]
    finally:
        stop.set()
        agent.wake()
        loop.join(10)
        agent.close()
    assert not loop.is_alive()


@on_session_loop
async def test_missing_node_is_reported_not_fatal(control_plane: ControlPlane, node_name: str) -> None:
    agent, _ = make_agent(control_plane, node_name, "t4-4")
    try:
        report = await asyncio.to_thread(agent.refresh)
    finally:
        agent.close()
    assert report.error is not None and "not found" in report.error
    assert report.annotations  # it still knows what it would publish


@pytest.fixture
def no_logging_handlers() -> Iterator[None]:
    """``cli.main`` configures logging; leave the root logger as it was."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_cli_once_patches_the_node(
    control_plane: ControlPlane, node_name: str, capsys: pytest.CaptureFixture[str], no_logging_handlers: None
) -> None:
    h.create_node(control_plane, node_name)
    import argparse

    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    argv = [
        "--once",
        "--kubeconfig",
        str(control_plane.kubeconfig),
        "--node-name",
        node_name,
        "--backend",
        "fake:a40-2",
    ]
    assert cli.main(p.parse_args(argv)) == 0
    out = json.loads(capsys.readouterr().out)
    status, node = control_plane.api_request("GET", f"/api/v1/nodes/{node_name}")
    assert status == 200
    ann = node["metadata"]["annotations"]
    assert set(out["patched"]) == {keys.NODE_PAIR_SCORE, keys.GPU_TOPOLOGY, keys.GPU_TELEMETRY}
    assert keys.NODE_REGISTER not in ann  # without --register the HAMi device plugin owns it
    for key in out["patched"]:
        assert ann[key] == out["annotations"][key]
