"""The agent loop against an in-memory Node API: what is patched, when, and which events are raised."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping

import pytest

from gpuslice.agent import backend, cli, fake, health, metrics, service
from gpuslice.codec import keys, node_inventory
from gpuslice.kube import errors as kerrors
from gpuslice.kube import nodes as kube_nodes

pytestmark = pytest.mark.unit

TOPO_KEYS = {keys.NODE_PAIR_SCORE, keys.GPU_TOPOLOGY}
ALL_KEYS = TOPO_KEYS | {keys.NODE_REGISTER}


class FakeApi:
    """A Node in memory; records patches and events; can fail on demand.

    It keeps managedFields as the API server does for updates and patches: a manager that changes
    or adds a key owns it alone from then on, a deleted key is nobody's (``write_as`` plays
    another component; editing ``annotations`` directly changes no owner).
    """

    field_manager = kube_nodes.AGENT_FIELD_MANAGER

    def __init__(self, annotations: Mapping[str, str] | None = None) -> None:
        self.annotations = dict(annotations or {})
        self.owners: dict[str, str] = {}
        self.version = 1
        self.patches: list[dict[str, str | None]] = []
        self.versions_sent: list[str | None] = []
        self.events: list[tuple[str, str, str]] = []
        self.fail = False
        self.conflicts = 0
        self.on_read: Callable[[], None] | None = None
        self.closed = False
        self._cond = threading.Condition()

    def read_node(self) -> kube_nodes.NodeInfo:
        if self.fail:
            raise kerrors.ApiServerError("apiserver down", code=503)
        labels: dict[str, dict[str, object]] = {"f:labels": {"f:kubernetes.io/hostname": {}}}
        by_manager = {"kubelet": labels}  # as the kubelet registers a Node
        for key, manager in self.owners.items():
            by_manager.setdefault(manager, {}).setdefault("f:annotations", {})[f"f:{key}"] = {}
        fields = tuple(
            {"manager": m, "operation": "Update", "fieldsV1": {"f:metadata": meta}}
            for m, meta in by_manager.items()
        )
        info = kube_nodes.NodeInfo(
            "n1", "uid-1", self.annotations, resource_version=str(self.version), managed_fields=fields
        )
        if self.on_read is not None:  # something happens between the agent's read and its patch
            self.on_read()
        return info

    def write_as(self, manager: str, changes: Mapping[str, str | None]) -> None:
        """Another component's merge patch."""
        for k, v in changes.items():
            if v is None:
                self.annotations.pop(k, None)
                self.owners.pop(k, None)
            elif self.annotations.get(k) != v:
                self.annotations[k] = v
                self.owners[k] = manager
        self.version += 1

    def patch(self, changes: Mapping[str, str | None], resource_version: str | None = None) -> None:
        if self.fail:
            raise kerrors.ApiServerError("apiserver down", code=503)
        self.versions_sent.append(resource_version)
        if self.conflicts:
            self.conflicts -= 1
            raise kerrors.Conflict("the object has been modified")
        if resource_version is not None and resource_version != str(self.version):
            raise kerrors.Conflict("the object has been modified")
        with self._cond:
            self.patches.append(dict(changes))
            self.write_as(self.field_manager, changes)
            self._cond.notify_all()

    def event(self, type_: str, reason: str, note: str, action: str) -> None:
        with self._cond:
            self.events.append((type_, reason, note))
            self._cond.notify_all()

    def close(self) -> None:
        self.closed = True

    def wait_for(self, predicate: Callable[[], bool]) -> bool:
        with self._cond:
            return self._cond.wait_for(predicate, timeout=10)

    def reasons(self) -> list[str]:
        return [e[1] for e in self.events]


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(
    shape: str = "t4-4",
    api: FakeApi | None = None,
    opener: Callable[[], backend.Backend] | None = None,
    **settings: object,
) -> tuple[service.Agent, FakeApi, Clock, fake.FakeBackend]:
    api = api if api is not None else FakeApi()
    nvml = fake.FakeBackend(fake.shape(shape))
    clock = Clock()
    s = service.Settings(**{"node_name": "n1", "register": True, "watch_health": False, **settings})  # type: ignore[arg-type]
    agent = service.Agent(s, opener or (lambda: nvml), api, metrics.AgentMetrics(), clock=clock, wall=clock)
    return agent, api, clock, nvml


@pytest.fixture
def closing() -> Iterator[list[service.Agent]]:
    agents: list[service.Agent] = []
    yield agents
    for a in agents:
        a.close()


def test_first_round_patches_everything_then_nothing() -> None:
    agent, api, clock, _ = make()
    report = agent.refresh()
    assert report.error is None and report.backend is not None
    assert set(report.patched) == ALL_KEYS
    assert len(api.patches) == 1
    assert agent.refresh().patched == []  # same values: no patch
    assert len(api.patches) == 1
    inv = node_inventory.decode_node("n1", api.annotations)
    assert len(inv.devices) == 4


def test_only_changed_keys_are_patched() -> None:
    agent, api, _, _ = make()
    agent.refresh()
    api.annotations[keys.GPU_TOPOLOGY] = "edited by hand"
    api.annotations["other.io/keep"] = "x"
    assert agent.refresh().patched == [keys.GPU_TOPOLOGY]
    assert api.patches[-1].keys() == {keys.GPU_TOPOLOGY}
    assert api.annotations["other.io/keep"] == "x"


def test_without_register_no_registration() -> None:
    agent, api, _, _ = make(register=False)
    assert set(agent.refresh().patched) == TOPO_KEYS
    assert keys.NODE_REGISTER not in api.annotations


def test_no_gpus_removes_topology() -> None:
    api = FakeApi({keys.GPU_TOPOLOGY: "old", keys.NODE_PAIR_SCORE: "old"})
    agent, api, _, _ = make("none", api)
    agent.refresh()
    assert api.patches == [{keys.NODE_REGISTER: "[]", keys.GPU_TOPOLOGY: None, keys.NODE_PAIR_SCORE: None}]
    api.annotations[keys.GPU_TELEMETRY] = "old readings"
    agent.publish_telemetry()
    assert api.patches[-1] == {keys.GPU_TELEMETRY: None}


def test_nvml_unavailable_keeps_annotations_and_says_so_once() -> None:
    state: dict[str, backend.Backend | None] = {"nvml": None}

    def opener() -> backend.Backend:
        if state["nvml"] is None:
            raise backend.BackendError(backend.REASON_LIBRARY_MISSING, "NVML Shared Library Not Found")
        return state["nvml"]

    api = FakeApi({keys.GPU_TOPOLOGY: "published earlier"})
    agent, api, clock, nvml = make(api=api, opener=opener)
    r = agent.refresh()
    assert r.error is not None and "LibraryMissing" in r.error
    delay = agent.cycle()
    assert delay <= service.RETRY_S  # retried soon, not after the 300 s period
    clock.now += service.RETRY_S
    agent.cycle()
    assert api.patches == []  # nothing known: nothing written, nothing removed
    assert api.reasons() == [service.REASON_NVML_UNAVAILABLE]  # said once, not every retry
    state["nvml"] = nvml
    clock.now += service.RETRY_S
    agent.cycle()
    assert set(api.annotations) >= ALL_KEYS
    assert agent.metrics.registry.get_sample_value("gpuslice_agent_nvml_up") == 1


def test_api_failure_is_retried_soon() -> None:
    agent, api, clock, _ = make()
    api.fail = True
    assert agent.cycle() <= service.RETRY_S
    assert agent.last_report.error is not None and "apiserver down" in agent.last_report.error
    api.fail = False
    clock.now += service.RETRY_S
    agent.cycle()
    assert set(api.annotations) >= ALL_KEYS


def test_refresh_period_and_on_demand() -> None:
    agent, api, clock, nvml = make(refresh_s=300.0, telemetry_s=60.0)
    agent.cycle()
    calls = {"n": 0}
    real = nvml.gpus

    def counting() -> tuple[backend.GpuRecord, ...]:
        calls["n"] += 1
        return real()

    nvml.gpus = counting  # type: ignore[method-assign]
    clock.now += 60
    assert agent.cycle() == 60  # telemetry at +60 again; discovery not yet due (next at +300)
    assert calls["n"] == 0
    agent.request_refresh()
    agent.cycle()
    assert calls["n"] == 1
    clock.now += 300
    agent.cycle()
    assert calls["n"] == 2


def test_telemetry_low_rate_and_only_on_change() -> None:
    agent, api, clock, nvml = make(telemetry_s=60.0, refresh_s=300.0)
    agent.cycle()
    first = api.annotations[keys.GPU_TELEMETRY]
    n = len(api.patches)
    clock.now += 60
    agent.cycle()  # same readings, published 60 s ago < 300 s: no patch
    assert len(api.patches) == n
    nvml.set_telemetry(2, temperature_c=83.0, utilization_pct=97.0)
    clock.now += 60
    agent.cycle()
    assert api.patches[-1].keys() == {keys.GPU_TELEMETRY}
    t = node_inventory.node_telemetry(api.annotations)
    assert (t[2].temperature_c, t[2].utilization_pct) == (83.0, 97.0)
    assert api.annotations[keys.GPU_TELEMETRY] != first
    body = agent.metrics.render()[0].decode()
    assert 'gpuslice_agent_gpu_temperature_celsius{index="2"' in body
    assert "83.0" in body


def test_asymmetric_links_raise_one_warning() -> None:
    m = fake.shape("a40-2")
    broken = fake.Shape(m.name, m.gpus, (m.nvlinks[0], m.nvlinks[1][:2]), m.levels, m.p2p, m.telemetry)
    nvml = fake.FakeBackend(broken)
    agent, api, _, _ = make(opener=lambda: nvml)
    agent.refresh()
    agent.refresh()
    assert api.reasons() == [service.REASON_ASYMMETRIC]
    assert "GPU 0 counts 4 NVLinks to GPU 1, which counts 2" in api.events[0][2]


def test_dry_run_reports_what_it_would_patch() -> None:
    nvml = fake.FakeBackend(fake.shape("a40-2"))
    s = service.Settings(node_name="n1", watch_health=False)
    agent = service.Agent(s, lambda: nvml, None, metrics.AgentMetrics())
    assert set(agent.refresh().patched) == TOPO_KEYS
    assert agent.refresh().patched == []


def test_xid_79_marks_unhealthy_and_recovers(closing: list[service.Agent]) -> None:
    agent, api, clock, nvml = make(quiet_period_s=120.0, health_poll_s=0.01, watch_health=True)
    closing.append(agent)
    stop = threading.Event()
    loop = threading.Thread(target=agent.run, args=(stop,))
    loop.start()
    try:
        assert api.wait_for(lambda: keys.NODE_REGISTER in api.annotations)
        nvml.inject_xid(0, 13)  # application error: not a device fault
        nvml.inject_xid(3, 79)  # fallen off the bus
        assert api.wait_for(lambda: health.REASON_UNHEALTHY in api.reasons())
        assert api.wait_for(lambda: not node_inventory.decode_node("n1", api.annotations).devices[3].health)
        assert [x.health for x in node_inventory.decode_node("n1", api.annotations).devices] == [
            True,
            True,
            True,
            False,
        ]
        assert [(t, r) for t, r, _ in api.events] == [("Warning", health.REASON_UNHEALTHY)]
        assert "GPU 3: XID 79" in api.events[0][2]
        clock.now += 120.0  # quiet period over
        assert api.wait_for(lambda: health.REASON_RECOVERED in api.reasons())
        assert api.wait_for(
            lambda: all(x.health for x in node_inventory.decode_node("n1", api.annotations).devices)
        )
        assert [(t, r) for t, r, _ in api.events] == [
            ("Warning", health.REASON_UNHEALTHY),
            ("Normal", health.REASON_RECOVERED),
        ]
    finally:
        stop.set()
        agent.wake()
        loop.join(10)
    assert not loop.is_alive()


def cycle_until(agent: service.Agent, pred: Callable[[], bool]) -> bool:
    """Run the agent's cycles until ``pred`` holds (the watcher thread queues changes meanwhile)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        agent.cycle()
        if pred():
            return True
        time.sleep(0.01)
    return False


def watcher_of(agent: service.Agent) -> health.Watcher | None:
    return agent.watcher


class Flaky(fake.FakeBackend):
    """A fake whose card list can fail as if NVML lost the GPU."""

    broken = False

    def gpus(self) -> tuple[backend.GpuRecord, ...]:
        if self.broken:
            raise backend.BackendError(backend.REASON_GPU_LOST, "GPU is lost")
        return super().gpus()


def test_nvml_failure_keeps_health_state(closing: list[service.Agent]) -> None:
    nvml = Flaky(fake.shape("t4-4"))
    agent, api, clock, _ = make(
        opener=lambda: nvml, watch_health=True, health_poll_s=0.01, quiet_period_s=600.0
    )
    closing.append(agent)
    agent.refresh()
    first = agent.watcher
    assert first is not None
    nvml.inject_xid(1, 79)
    assert cycle_until(agent, lambda: health.REASON_UNHEALTHY in api.reasons())
    assert not node_inventory.decode_node("n1", api.annotations).devices[1].health
    nvml.broken = True
    assert agent.refresh().error is not None
    assert watcher_of(agent) is None  # the event thread of the failed session is stopped
    assert not node_inventory.decode_node("n1", api.annotations).devices[1].health  # published state kept
    nvml.broken = False
    assert agent.refresh().error is None
    assert watcher_of(agent) not in (None, first)
    assert [x.health for x in node_inventory.decode_node("n1", api.annotations).devices] == [
        True,
        False,
        True,
        True,
    ]


PLUGIN = "nvidia-device-plugin"
HAMI = {
    keys.NODE_REGISTER: '[{"id":"GPU-hami-0","count":10,"devmem":15360,"devcore":100}]',
    keys.NODE_PAIR_SCORE: "[]",
}


def gauge(agent: service.Agent, name: str, key: str | None = None) -> float | None:
    return agent.metrics.registry.get_sample_value(name, {"key": key} if key else {})


def test_keys_another_writer_owns_are_left_alone() -> None:
    api = FakeApi()
    api.write_as(PLUGIN, HAMI)
    agent, api, clock, nvml = make(api=api)
    for i in range(3):
        report = agent.refresh()
        nvml.set_telemetry(0, temperature_c=40.0 + 10 * i)
        agent.publish_telemetry()
        assert report.error is None
        assert report.yielded == {keys.NODE_REGISTER: [PLUGIN], keys.NODE_PAIR_SCORE: [PLUGIN]}
        assert report.annotations[keys.NODE_REGISTER] != HAMI[keys.NODE_REGISTER]  # it would differ
    assert {k: api.annotations[k] for k in HAMI} == HAMI
    assert all(k not in p for p in api.patches for k in HAMI)  # never written, never deleted
    assert [set(p) for p in api.patches].count({keys.GPU_TELEMETRY}) == 3  # its own keys: as before
    assert api.owners[keys.GPU_TOPOLOGY] == api.owners[keys.GPU_TELEMETRY] == kube_nodes.AGENT_FIELD_MANAGER
    assert api.reasons() == [service.REASON_OWNED_ELSEWHERE, service.REASON_REGISTRATION_REFUSED]  # once
    assert keys.NODE_PAIR_SCORE in api.events[0][2] and PLUGIN in api.events[0][2]
    refusal = api.events[1][2]
    assert PLUGIN in refusal and "agent.register" in refusal and keys.NODE_REGISTER in refusal
    assert gauge(agent, "gpuslice_agent_annotation_yielded", keys.NODE_REGISTER) == 1
    assert gauge(agent, "gpuslice_agent_annotation_yielded", keys.NODE_PAIR_SCORE) == 1
    assert gauge(agent, "gpuslice_agent_annotation_yielded", keys.GPU_TOPOLOGY) == 0
    assert gauge(agent, "gpuslice_agent_annotation_yielded", keys.GPU_TELEMETRY) == 0
    assert gauge(agent, "gpuslice_agent_registration_refused") == 1
    assert gauge(agent, "gpuslice_agent_node_managed_fields") == 1
    ok, text = cli._health(agent)
    assert ok  # healthy: the liveness probe must not restart an agent whose telemetry is wanted
    assert "registration refused" in text and f"{keys.NODE_PAIR_SCORE} ({PLUGIN})" in text


def test_without_register_only_the_score_is_yielded() -> None:
    api = FakeApi()
    api.write_as(PLUGIN, HAMI)
    agent, api, _, _ = make(api=api, register=False)
    assert agent.refresh().yielded == {keys.NODE_PAIR_SCORE: [PLUGIN]}
    assert api.reasons() == [service.REASON_OWNED_ELSEWHERE]
    assert gauge(agent, "gpuslice_agent_registration_refused") == 0
    assert gauge(agent, "gpuslice_agent_annotation_yielded", keys.NODE_REGISTER) is None  # not its key
    assert "registration refused" not in cli._health(agent)[1]


def test_no_cards_deletes_only_its_own_keys() -> None:
    api = FakeApi()
    api.write_as(kube_nodes.AGENT_FIELD_MANAGER, {keys.GPU_TOPOLOGY: "old"})
    api.write_as(PLUGIN, {keys.NODE_PAIR_SCORE: "[]"})
    agent, api, _, _ = make("none", api, register=False)
    agent.refresh()
    assert api.patches == [{keys.GPU_TOPOLOGY: None}]
    assert api.annotations == {keys.NODE_PAIR_SCORE: "[]"}
    assert api.reasons() == [service.REASON_OWNED_ELSEWHERE]


def test_taken_again_when_the_other_writer_deletes_and_warned_again_when_it_returns() -> None:
    api = FakeApi()
    api.write_as(PLUGIN, HAMI)
    agent, api, _, _ = make(api=api)
    agent.refresh()
    api.write_as(PLUGIN, {k: None for k in HAMI})  # the plugin is gone and cleaned up
    report = agent.refresh()
    assert report.patched == sorted(HAMI) and report.yielded == {}
    assert {k: api.owners[k] for k in HAMI} == {k: kube_nodes.AGENT_FIELD_MANAGER for k in HAMI}
    assert gauge(agent, "gpuslice_agent_registration_refused") == 0
    assert gauge(agent, "gpuslice_agent_annotation_yielded", keys.NODE_REGISTER) == 0
    api.write_as(PLUGIN, HAMI)  # it comes back: the API server moves the keys to it
    assert agent.refresh().patched == []
    assert {k: api.annotations[k] for k in HAMI} == HAMI
    reasons = [service.REASON_OWNED_ELSEWHERE, service.REASON_REGISTRATION_REFUSED]
    assert api.reasons() == reasons * 2
    assert gauge(agent, "gpuslice_agent_registration_refused") == 1


def test_a_write_between_read_and_patch_is_not_overwritten() -> None:
    api = FakeApi()
    agent, api, _, _ = make(api=api)

    def plugin_writes() -> None:
        api.on_read = None  # once
        api.write_as(PLUGIN, HAMI)

    api.on_read = plugin_writes
    report = agent.refresh()
    assert report.error is None
    assert api.versions_sent == ["1", "2"]  # the first patch carried the version read and failed
    assert {k: api.annotations[k] for k in HAMI} == HAMI
    assert report.patched == [keys.GPU_TOPOLOGY] and api.patches == [
        {keys.GPU_TOPOLOGY: report.annotations[keys.GPU_TOPOLOGY]}
    ]
    assert report.yielded == {keys.NODE_REGISTER: [PLUGIN], keys.NODE_PAIR_SCORE: [PLUGIN]}


def test_conflicts_without_end_are_an_error_retried_soon() -> None:
    agent, api, clock, _ = make()
    api.conflicts = service.CONFLICT_ATTEMPTS
    report = agent.refresh()
    assert report.error is not None and "modified" in report.error
    assert len(api.versions_sent) == service.CONFLICT_ATTEMPTS and api.patches == []
    assert agent.cycle() <= service.RETRY_S
    clock.now += service.RETRY_S
    agent.cycle()
    assert set(api.annotations) >= ALL_KEYS


def test_a_node_without_managed_fields_is_said_once() -> None:
    class Untracked(FakeApi):
        def read_node(self) -> kube_nodes.NodeInfo:
            info = super().read_node()
            return kube_nodes.NodeInfo(
                info.name, info.uid, info.annotations, resource_version=info.resource_version
            )

    agent, api, _, _ = make(api=Untracked())
    agent.refresh()
    assert set(api.annotations) == ALL_KEYS  # nothing tells who else wrote: as before
    assert gauge(agent, "gpuslice_agent_node_managed_fields") == 0
