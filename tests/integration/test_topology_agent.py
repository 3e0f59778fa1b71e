"""docs/topology.md against a real kube-apiserver: the agent's bandwidth matrix, telemetry time, jobs.

The node agent (fake NVML backend, an HGX H100 shape) publishes on a real Node; the extender's feed
decodes the bandwidth matrix and the telemetry read time into its cache. A pod bound there with a
controller owner reference and a job label reaches the cache as a pod of that job on its card.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from gpuslice.agent import fake, metrics, service
from gpuslice.codec import keys, pod_devices, telemetry
from gpuslice.kube import client as kclient
from gpuslice.kube import nodes as kube_nodes
from gpuslice.model import allocations, nodes
from gpuslice_dev.controlplane import ControlPlane
from tests.integration import extcache
from tests.integration import kubehelpers as h

pytestmark = pytest.mark.integration
on_session_loop = pytest.mark.asyncio(loop_scope="session")


@on_session_loop
async def test_agent_publishes_bandwidth_and_a_placed_pod_carries_its_job(
    control_plane: ControlPlane, kube: kclient.KubeClient, node_name: str, namespace: str
) -> None:
    h.create_node(control_plane, node_name)
    nvml = fake.FakeBackend(fake.shape("h100-8"))
    api = kube_nodes.NodeClient.from_kubeconfig(str(control_plane.kubeconfig), node_name, time.time)
    agent = service.Agent(
        service.Settings(node_name=node_name, register=True, watch_health=False),
        lambda: nvml,
        api,
        metrics.AgentMetrics(),
    )
    try:
        async with extcache.extender_cache(kube, "training.example/job") as cache:
            assert (await asyncio.to_thread(agent.refresh)).error is None
            await asyncio.to_thread(agent.publish_telemetry)
            state = await extcache.cached(cache, node_name, lambda s: len(s.inventory.telemetry) == 8)
            topo = state.inventory.topology
            assert topo is not None and topo.bandwidth is not None
            assert topo.pair_bandwidth(0, 7) == 450.0  # 18 NVLink 4.0 links of 25 GB/s
            status, node = control_plane.api_request("GET", f"/api/v1/nodes/{node_name}")
            assert status == 200
            ann = node["metadata"]["annotations"]
            assert json.loads(ann[keys.GPU_TOPOLOGY])["bw"][0][7] == 450.0
            ts = telemetry.decode(ann[keys.GPU_TELEMETRY]).timestamp.timestamp()
            assert state.inventory.telemetry_at == ts

            card = state.inventory.devices[3].uuid
            grants = ((allocations.DeviceGrant(card, 1000, 0),),)
            body: dict[str, Any] = h.pod_body(
                "worker-0",
                gpus=1,
                node_name=node_name,
                annotations={
                    **pod_devices.device_annotations(grants),
                    keys.VGPU_NODE: node_name,
                    keys.BIND_PHASE: keys.BIND_PHASE_SUCCESS,
                },
            )
            body["metadata"]["labels"] = {"training.example/job": "llm-7"}
            body["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "llm-7",
                    "uid": "6d3b2f4e-0000-4000-8000-000000000001",
                    "controller": True,
                }
            ]
            status, created = control_plane.api_request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
            assert status == 201, created
            state = await extcache.cached(cache, node_name, lambda s: bool(s.jobs))
            assert state.jobs == (nodes.JobOnNode("label:llm-7", 1, (3,)),)
    finally:
        agent.close()
