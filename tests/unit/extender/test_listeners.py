"""``extender.listeners``: consumers told in the order added; and what ``serve.build`` registers."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.extender import config, feed, listeners, recovery, serve
from gpuslice.extender.binding import leader, leaderlabel
from gpuslice.framework import logs

pytestmark = pytest.mark.unit


def test_listeners_are_told_in_the_order_they_were_added() -> None:
    heard: list[tuple[str, str, bool]] = []
    event: listeners.Listeners[[str, bool]] = listeners.Listeners()
    assert not event and len(event) == 0
    event.emit("n1", True)  # nobody listens: nothing happens
    event.add(lambda node, held: heard.append(("first", node, held)))
    event.add(lambda node, held: heard.append(("second", node, held)))
    assert event and len(event) == 2
    event.emit("n1", True)
    event.emit("n2", False)
    assert heard == [
        ("first", "n1", True),
        ("second", "n1", True),
        ("first", "n2", False),
        ("second", "n2", False),
    ]


def test_a_failing_listener_stops_the_event_as_a_single_callback_would() -> None:
    heard: list[str] = []
    event: listeners.Listeners[[str]] = listeners.Listeners()

    def fails(node: str) -> None:
        raise RuntimeError(node)

    event.add(fails)
    event.add(heard.append)
    with pytest.raises(RuntimeError, match="n1"):
        event.emit("n1")
    assert heard == []


@pytest.fixture
def kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    return str(path)


@pytest.mark.parametrize("shadow", [False, True], ids=["live-only", "with-shadow"])
def test_serve_registers_each_consumer_once(kubeconfig: str, shadow: bool) -> None:
    values = {
        "kubeconfig": kubeconfig,
        "leader_elect": "lease",
        "events": False,
        "pod_name": "gs-0",
        "pod_namespace": "gpu",
    }
    if shadow:
        values["shadow_policies"] = "fgd"
    deps = serve.build(config.validate(values), logs.Log())
    services = [getattr(s, "__self__", None) for s in deps.services]
    source = next(s for s in services if isinstance(s, feed.Feed))
    lead = next(s for s in services if isinstance(s, leader.OwnLease))
    sweeper = next(s for s in services if isinstance(s, recovery.Recovery))
    label = next(s for s in services if isinstance(s, leaderlabel.PodLabel))
    # The bind flow hears the node locks; it and the shadow hear freed capacity and bound pods.
    assert len(source.on_node_lock) == 1
    assert len(source.on_capacity_freed) == 1 + shadow
    assert len(deps.flow.on_bound) == int(shadow)
    # Leadership: the metric, the pod label, the recovery loop.
    assert len(lead.on_change) == 3
    assert deps.metrics.registry.get_sample_value("gpuslice_leader") == 0
    lead._changed(True)
    assert deps.metrics.registry.get_sample_value("gpuslice_leader") == 1
    assert label._wanted is True and sweeper._wake.is_set()
    lead._changed(False)
    assert deps.metrics.registry.get_sample_value("gpuslice_leader") == 0 and label._wanted is False
