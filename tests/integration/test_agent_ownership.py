"""The node agent leaves node annotation keys another component wrote, on a real kube-apiserver.

Another field manager plays HAMi's device plugin: a merge patch with ``fieldManager=nvidia-device-plugin``
(client-go's default field manager is the binary's name, and HAMi's plugin passes none) writes
``hami.io/node-nvidia-register`` and ``hami.io/node-nvidia-score``.

Aspects: with ``--register`` the agent leaves both values byte for byte through several publish
cycles while it keeps writing its own ``gpuslice.io/*`` keys; it raises one ``RegistrationRefused``
and one ``AnnotationOwnedElsewhere`` Warning (not one per cycle), its gauges and ``/healthz`` text
say so; the API server records the agent's writes under ``gpuslice-agent``; once the other writer
deletes its keys the agent writes them again. On a node nobody else wrote, the agent writes all
four keys as before, and when the plugin starts later and overwrites the registration, the agent
stops writing it. ``gpuslice agent --once --register`` reports the refusal and exits 0.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from gpuslice.agent import cli, fake, metrics, ownership, service
from gpuslice.codec import keys
from gpuslice.kube import nodes as kube_nodes
from gpuslice_dev.controlplane import ControlPlane
from tests.integration import kubehelpers as h

pytestmark = pytest.mark.integration

PLUGIN = "nvidia-device-plugin"
AGENT = kube_nodes.AGENT_FIELD_MANAGER
# HAMi's device plugin's values: two cards, not the agent's eight, so any rewrite shows
HAMI_REGISTER = (
    '[{"id":"GPU-hami-0","count":10,"devmem":81920,"devcore":100,"type":"NVIDIA-H100","health":true},'
    '{"id":"GPU-hami-1","index":1,"count":10,"devmem":81920,"devcore":100,"type":"NVIDIA-H100","health":true}]'
)
HAMI_SCORE = (
    '[{"uuid":"GPU-hami-0","score":{"GPU-hami-1":600}},{"uuid":"GPU-hami-1","score":{"GPU-hami-0":600}}]'
)
OWN_KEYS = (keys.GPU_TOPOLOGY, keys.GPU_TELEMETRY)


def create_node(cp: ControlPlane, node: str) -> None:
    """A Node as the kubelet registers one: with labels, so the API server tracks managedFields from
    the start (it never starts them by updates on an object created without any tracked field)."""
    h.create_node(cp, node, labels={"kubernetes.io/hostname": node})


def write_as(cp: ControlPlane, node: str, manager: str, changes: Mapping[str, str | None]) -> None:
    status, body = cp.api_request(
        "PATCH", f"/api/v1/nodes/{node}?fieldManager={manager}", {"metadata": {"annotations": dict(changes)}}
    )
    assert status == 200, body


def get_node(cp: ControlPlane, node: str) -> dict[str, Any]:
    status, body = cp.api_request("GET", f"/api/v1/nodes/{node}")
    assert status == 200, body
    return body


def owners(cp: ControlPlane, node: str) -> dict[str, frozenset[str]]:
    return ownership.annotation_managers(get_node(cp, node)["metadata"].get("managedFields", []))


def node_annotations(cp: ControlPlane, node: str) -> dict[str, str]:
    result: dict[str, str] = get_node(cp, node)["metadata"].get("annotations", {})
    return result


def reasons(cp: ControlPlane, node: str) -> list[str]:
    status, body = cp.api_request(
        "GET", f"/apis/events.k8s.io/v1/namespaces/default/events?fieldSelector=regarding.name%3D{node}"
    )
    assert status == 200, body
    return sorted(e["reason"] for e in body["items"])


def notes(cp: ControlPlane, node: str, reason: str) -> list[str]:
    status, body = cp.api_request(
        "GET", f"/apis/events.k8s.io/v1/namespaces/default/events?fieldSelector=regarding.name%3D{node}"
    )
    assert status == 200, body
    return [e["note"] for e in body["items"] if e["reason"] == reason]


def make_agent(cp: ControlPlane, node: str) -> tuple[service.Agent, fake.FakeBackend]:
    nvml = fake.FakeBackend(fake.shape("a100-8-2numa"))
    api = kube_nodes.NodeClient.from_kubeconfig(str(cp.kubeconfig), node, time.time)
    settings = service.Settings(node_name=node, register=True, watch_health=False)
    return service.Agent(settings, lambda: nvml, api, metrics.AgentMetrics()), nvml


def gauge(agent: service.Agent, name: str, key: str | None = None) -> float | None:
    return agent.metrics.registry.get_sample_value(name, {"key": key} if key else {})


def test_agent_leaves_the_plugins_keys_and_writes_its_own(
    control_plane: ControlPlane, node_name: str
) -> None:
    cp = control_plane
    create_node(cp, node_name)
    write_as(cp, node_name, PLUGIN, {keys.NODE_REGISTER: HAMI_REGISTER, keys.NODE_PAIR_SCORE: HAMI_SCORE})
    before = owners(cp, node_name)
    assert before[keys.NODE_REGISTER] == before[keys.NODE_PAIR_SCORE] == {PLUGIN}
    agent, nvml = make_agent(cp, node_name)
    try:
        for cycle in range(3):
            report = agent.refresh()
            assert report.error is None
            assert report.patched == ([keys.GPU_TOPOLOGY] if cycle == 0 else [])
            assert report.yielded == {keys.NODE_REGISTER: [PLUGIN], keys.NODE_PAIR_SCORE: [PLUGIN]}
            nvml.set_telemetry(0, temperature_c=40.0 + 10 * cycle)  # a material change every cycle
            wanted, patched = agent.publish_telemetry()
            assert patched == [keys.GPU_TELEMETRY]
            ann = node_annotations(cp, node_name)
            assert ann[keys.NODE_REGISTER] == HAMI_REGISTER
            assert ann[keys.NODE_PAIR_SCORE] == HAMI_SCORE
            assert ann[keys.GPU_TOPOLOGY] == report.annotations[keys.GPU_TOPOLOGY]
            assert ann[keys.GPU_TELEMETRY] == wanted[keys.GPU_TELEMETRY]
            # what the agent would have written differs, so leaving it is a decision, not a no-op
            assert report.annotations[keys.NODE_REGISTER] != HAMI_REGISTER
            assert report.annotations[keys.NODE_PAIR_SCORE] != HAMI_SCORE
        after = owners(cp, node_name)
        assert after[keys.NODE_REGISTER] == after[keys.NODE_PAIR_SCORE] == {PLUGIN}
        assert all(after[k] == {AGENT} for k in OWN_KEYS)  # the agent's writes carry its own name
        assert reasons(cp, node_name) == [service.REASON_OWNED_ELSEWHERE, service.REASON_REGISTRATION_REFUSED]
        (refusal,) = notes(cp, node_name, service.REASON_REGISTRATION_REFUSED)
        assert PLUGIN in refusal and "agent.register" in refusal
        (owned,) = notes(cp, node_name, service.REASON_OWNED_ELSEWHERE)
        assert keys.NODE_PAIR_SCORE in owned and PLUGIN in owned
        assert gauge(agent, "gpuslice_agent_annotation_yielded", keys.NODE_REGISTER) == 1
        assert gauge(agent, "gpuslice_agent_annotation_yielded", keys.NODE_PAIR_SCORE) == 1
        assert gauge(agent, "gpuslice_agent_annotation_yielded", keys.GPU_TOPOLOGY) == 0
        assert gauge(agent, "gpuslice_agent_registration_refused") == 1
        assert gauge(agent, "gpuslice_agent_node_managed_fields") == 1
        ok, text = cli._health(agent)  # still healthy: the liveness probe must not restart it
        assert ok and "registration refused" in text and PLUGIN in text

        # the plugin goes and deletes its keys: nobody owns them, the agent takes them
        write_as(cp, node_name, PLUGIN, {keys.NODE_REGISTER: None, keys.NODE_PAIR_SCORE: None})
        report = agent.refresh()
        assert report.patched == sorted([keys.NODE_REGISTER, keys.NODE_PAIR_SCORE])
        assert report.yielded == {}
        ann = node_annotations(cp, node_name)
        assert ann[keys.NODE_REGISTER] == report.annotations[keys.NODE_REGISTER]
        assert ann[keys.NODE_PAIR_SCORE] == report.annotations[keys.NODE_PAIR_SCORE]
        taken = owners(cp, node_name)
        assert taken[keys.NODE_REGISTER] == taken[keys.NODE_PAIR_SCORE] == {AGENT}
        assert gauge(agent, "gpuslice_agent_annotation_yielded", keys.NODE_REGISTER) == 0
        assert gauge(agent, "gpuslice_agent_registration_refused") == 0
        assert "registration refused" not in cli._health(agent)[1]
    finally:
        agent.close()


def test_node_nobody_else_wrote_then_the_plugin_arrives(control_plane: ControlPlane, node_name: str) -> None:
    cp = control_plane
    create_node(cp, node_name)
    agent, _ = make_agent(cp, node_name)
    try:
        report = agent.refresh()
        _, patched = agent.publish_telemetry()
        assert report.patched == sorted([keys.NODE_REGISTER, keys.GPU_TOPOLOGY, keys.NODE_PAIR_SCORE])
        assert patched == [keys.GPU_TELEMETRY]
        assert report.yielded == {}
        ann = node_annotations(cp, node_name)
        assert all(ann[k] == report.annotations[k] for k in report.patched)
        by_key = owners(cp, node_name)
        assert all(by_key[k] == {AGENT} for k in (*report.patched, keys.GPU_TELEMETRY))
        assert reasons(cp, node_name) == []
        assert gauge(agent, "gpuslice_agent_registration_refused") == 0

        # HAMi's plugin starts later and registers: the API server moves the key to it
        write_as(cp, node_name, PLUGIN, {keys.NODE_REGISTER: HAMI_REGISTER})
        for _ in range(2):
            report = agent.refresh()
            assert report.error is None and report.patched == []
        assert node_annotations(cp, node_name)[keys.NODE_REGISTER] == HAMI_REGISTER
        assert owners(cp, node_name)[keys.NODE_PAIR_SCORE] == {AGENT}  # the rest stays the agent's
        assert reasons(cp, node_name) == [service.REASON_REGISTRATION_REFUSED]
        assert gauge(agent, "gpuslice_agent_registration_refused") == 1
        assert gauge(agent, "gpuslice_agent_annotation_yielded", keys.NODE_PAIR_SCORE) == 0
    finally:
        agent.close()


@pytest.fixture
def no_logging_handlers() -> Iterator[None]:
    """``cli.main`` configures logging; leave the root logger as it was."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_cli_once_register_reports_the_refusal(
    control_plane: ControlPlane, node_name: str, capsys: pytest.CaptureFixture[str], no_logging_handlers: None
) -> None:
    create_node(control_plane, node_name)
    write_as(control_plane, node_name, PLUGIN, {keys.NODE_REGISTER: HAMI_REGISTER})
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    argv = ["--once", "--register", "--kubeconfig", str(control_plane.kubeconfig), "--node-name", node_name]
    assert cli.main(p.parse_args([*argv, "--backend", "fake:a40-2"])) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["yielded"] == {keys.NODE_REGISTER: [PLUGIN]}
    assert keys.NODE_REGISTER not in out["patched"]
    assert node_annotations(control_plane, node_name)[keys.NODE_REGISTER] == HAMI_REGISTER


def test_node_without_managed_fields_is_reported(control_plane: ControlPlane, node_name: str) -> None:
    """The documented limit: on a Node with no managedFields at all, other writers are invisible."""
    cp = control_plane
    h.create_node(cp, node_name)  # no labels, no annotations: no managedFields, now or after updates
    write_as(cp, node_name, PLUGIN, {keys.NODE_REGISTER: HAMI_REGISTER})
    assert "managedFields" not in get_node(cp, node_name)["metadata"]
    agent, _ = make_agent(cp, node_name)
    try:
        report = agent.refresh()
    finally:
        agent.close()
    assert report.yielded == {}
    assert keys.NODE_REGISTER in report.patched  # written as before: nothing says who wrote it
    assert gauge(agent, "gpuslice_agent_node_managed_fields") == 0
