"""The extender side of docs/topology.md: settings, the policy context, link requirements in filter.

Runs on the real ``ClusterCache`` with a fixed clock injected through ``Profile.clock``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import pytest

from gpuslice.cache import cache as caches
from gpuslice.codec import keys, linkreq, resources
from gpuslice.extender import config, wire
from gpuslice.framework import cycle, logs, nominations, profile, scheduling
from gpuslice.model import nodes, requests, status
from tests.unit.builders import alloc, bridged, node, uuid

pytestmark = pytest.mark.unit

LOG = logs.Log(0)
NOW = 1_800_000_000.0


def test_settings_defaults_flags_env_and_yaml(tmp_path: Path) -> None:
    s = config.parse([], {})
    assert (s.job_label, s.telemetry_max_age_s) == ("", 480.0)
    s = config.parse(["--job-label", "training.example/job", "--telemetry-max-age-s", "2m"], {})
    assert (s.job_label, s.telemetry_max_age_s) == ("training.example/job", 120.0)
    s = config.parse([], {"GPUSLICE_JOB_LABEL": "job", "GPUSLICE_TELEMETRY_MAX_AGE_S": "90"})
    assert (s.job_label, s.telemetry_max_age_s) == ("job", 90.0)
    f = tmp_path / "c.yaml"
    f.write_text("job-label: app\ntelemetry_max_age_s: 30s\n")
    assert config.parse(["--config", str(f)], {}).telemetry_max_age_s == 30.0
    with pytest.raises(config.ConfigError, match="telemetry_max_age_s must be > 0"):
        config.validate({"telemetry_max_age_s": 0})


def policies(node_policy: str = "balanced") -> profile.Profile:
    built = profile.Profile.build(node_policy, "spread")
    return dataclasses.replace(built, job_label="job", telemetry_max_age_s=120.0, clock=lambda: NOW)


def _pod(labels: tuple[tuple[str, str], ...] = (), owner: str = "") -> requests.PodRequest:
    req = requests.ContainerRequest(count=1, memory_mib=1000)
    return requests.PodRequest(namespace="ns", name="p", containers=(req,), labels=labels, owner=owner)


def test_context_carries_the_clock_the_job_and_where_its_pods_are() -> None:
    cache = caches.ClusterCache(nominator=nominations.Nominator())
    for name in ("a", "b"):
        cache.upsert_node(node(name).gpus(2).inventory())
    cache.add_pod("ns/peer", "u1", alloc("b", ((uuid("b", 1), 1000, 0),)), job="label:train")
    snap = cache.snapshot()
    ctx = cycle.Cycle.of(policies(), snap, _pod(labels=(("job", "train"),), owner="u-rs")).ctx
    assert ctx.now == NOW and ctx.telemetry_max_age_s == 120.0 and ctx.job == "label:train"
    assert dict(ctx.job_nodes) == {"b": nodes.JobOnNode("label:train", 1, (1,))}
    assert snap.columns.telemetry_at.shape[0] >= 2  # the thermal age rule's per-row times
    bare = cycle.Cycle.of(profile.Profile.build("balanced", "spread"), snap, _pod()).ctx  # no clock, no job
    assert bare.now is None and bare.job == "" and not bare.job_nodes


def test_balanced_filter_and_prioritize_gather_a_job() -> None:
    cache = caches.ClusterCache(nominator=nominations.Nominator())
    for name in ("a", "b"):
        cache.upsert_node(node(name).gpus(2).inventory())
    cache.add_pod("ns/peer", "u1", alloc("b", ((uuid("b", 0), 1000, 0),)), job="owner:u-rs")
    pod = _pod(owner="u-rs")
    snap = cache.snapshot()
    scores = scheduling.score_nodes(cycle.Cycle.of(policies(), snap, pod), ["a", "b"], LOG)
    assert scores[1] > scores[0]  # b holds the job's other pod
    loner = scheduling.score_nodes(cycle.Cycle.of(policies(), snap, _pod(owner="u-other")), ["a", "b"], LOG)
    # no pod of its job anywhere: like joins like, as for a pod without a job
    alone = scheduling.score_nodes(cycle.Cycle.of(policies(), snap, _pod()), ["a", "b"], LOG)
    assert loner.tolist() == alone.tolist()
    assert loner.tolist() != scores.tolist()


def test_stale_telemetry_in_the_extender() -> None:
    cache = caches.ClusterCache(nominator=nominations.Nominator())
    for name, temp in (("hot", 85.0), ("cool", 35.0)):
        inv = node(name).gpus(1).telemetry(0, temperature_c=temp).inventory()
        cache.upsert_node(msgspec.structs.replace(inv, telemetry_at=NOW - 600))
    snap = cache.snapshot()
    stale = scheduling.score_nodes(cycle.Cycle.of(policies(), snap, _pod()), ["hot", "cool"], LOG)
    assert stale[0] == stale[1]
    fresh = dataclasses.replace(policies(), telemetry_max_age_s=3600.0)
    scores = scheduling.score_nodes(cycle.Cycle.of(fresh, snap, _pod()), ["hot", "cool"], LOG)
    assert scores[1] > scores[0]


def _linked_node(name: str, pairs: list[tuple[int, int]]) -> nodes.NodeInventory:
    return node(name).gpus(4).topo(bridged(name, 4, pairs, gbps=100.0)).inventory()


def test_filter_with_a_link_requirement() -> None:
    cache = caches.ClusterCache(nominator=nominations.Nominator())
    cache.upsert_node(_linked_node("bridged", [(2, 3)]))
    cache.upsert_node(_linked_node("pcie", []))
    cache.add_pod("ns/x", "ux", alloc("bridged", ((uuid("bridged", 2), 81920, 100),)))
    annotations = {
        keys.GPU_TOPOLOGY_REQUIREMENT: linkreq.encode(requests.TopologyRequirement(require_nvlink=True))
    }
    pod = resources.parse_pod(
        {
            "metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1000"}},
                    }
                ]
            },
        }
    )
    out = scheduling.filter_nodes(
        cycle.Cycle.of(policies("binpack"), cache.snapshot(), pod), ["bridged", "pcie"], LOG
    )
    assert out.feasible == []
    assert out.failed == {"bridged": status.NVLINK_REQUIRED}  # the pair is busy: preemption could help
    assert out.unresolvable == {"pcie": status.NVLINK_REQUIRED}
    cache.remove_pod("ns/x")
    out = scheduling.filter_nodes(
        cycle.Cycle.of(policies("binpack"), cache.snapshot(), pod), ["bridged", "pcie"], LOG
    )
    assert out.feasible == ["bridged"]


def test_the_wire_pod_carries_owner_and_labels_to_the_request() -> None:
    raw = (
        b'{"metadata":{"name":"p","namespace":"ns","labels":{"job":"x"},"ownerReferences":['
        b'{"apiVersion":"v1","kind":"ConfigMap","name":"c","uid":"u0"},'
        b'{"apiVersion":"batch/v1","kind":"Job","name":"j","uid":"u1","controller":true}]},'
        b'"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}'
    )
    req = resources.parse_pod(msgspec.json.decode(raw, type=wire.Pod).to_dict())
    assert (req.owner, req.job(), req.job("job")) == ("u1", "owner:u1", "label:x")
