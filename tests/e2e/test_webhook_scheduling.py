"""The admission webhook in front of the e2e cluster: pods without a schedulerName reach gpuslice.

``gpuslice webhook`` runs over HTTPS (a test CA) and is registered, mutating and validating, for
namespaces carrying a label unique to this module, so the other e2e tests never reach it; the
configurations are deleted afterwards. The kube-scheduler here serves only the
``gpuslice-scheduler`` profile, so a pod keeping ``default-scheduler`` would never be bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuslice.codec import keys, pod_devices
from tests.e2e.conftest import SCHEDULER, Cluster, inventory
from tests.integration.test_webhook import (
    Registration,
    WebhookProcess,
    create,
    make_certs,
    pod_body,
    register,
    wait_webhook_active,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def webhook_ns(
    e2e_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Registration]]:
    work: Path = tmp_path_factory.mktemp("webhook")
    ca, crt, key = make_certs(work)
    hook = WebhookProcess(e2e_cluster.cp.kubeconfig, ca, crt, key, work / "webhook.log").start()
    reg: Registration | None = None
    try:
        reg = register(e2e_cluster.cp, hook)
        ns = reg.namespace("e2e-wh")
        wait_webhook_active(e2e_cluster.cp, ns)
        yield ns, reg
    finally:
        if reg is not None:
            reg.delete()
        hook.stop()


def grants(pod: dict[str, Any]) -> list[tuple[str, int, int]]:
    ann = pod["metadata"]["annotations"]
    return [
        (g.uuid, g.memory_mib, g.cores) for c in pod_devices.decode(ann[keys.DEVICES_ALLOCATED]) for g in c
    ]


def assert_hami_contract(pod: dict[str, Any]) -> None:
    ann = pod["metadata"]["annotations"]
    node = pod["spec"]["nodeName"]
    assert ann[keys.VGPU_NODE] == node
    assert ann[keys.BIND_PHASE] in (keys.BIND_PHASE_ALLOCATING, keys.BIND_PHASE_SUCCESS)
    assert ann[keys.BIND_TIME].isdigit() and ann[keys.VGPU_TIME].isdigit()
    assert {u for u, _, _ in grants(pod)} <= {d.uuid for d in inventory(node)}


def test_pod_without_scheduler_name_is_scheduled_by_gpuslice(
    e2e_cluster: Cluster, webhook_ns: tuple[str, Registration]
) -> None:
    ns, _ = webhook_ns
    # Only gpumem: the webhook adds nvidia.com/gpu: 1 and our schedulerName.
    status, created = create(e2e_cluster.cp, ns, pod_body("mem-only", {"nvidia.com/gpumem": "2000"}))
    assert status == 201, created
    assert created["spec"]["schedulerName"] == SCHEDULER
    pod = e2e_cluster.wait_bound(ns, "mem-only")
    assert_hami_contract(pod)
    assert [(m, c) for _, m, c in grants(pod)] == [(2000, 0)]
    e2e_cluster.delete_pod(ns, "mem-only")


def test_bare_card_is_exclusive_after_the_webhook(
    e2e_cluster: Cluster, webhook_ns: tuple[str, Registration]
) -> None:
    ns, _ = webhook_ns
    status, created = create(e2e_cluster.cp, ns, pod_body("whole", {"nvidia.com/gpu": "1"}))
    assert status == 201, created
    assert created["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] == "100"
    pod = e2e_cluster.wait_bound(ns, "whole")
    assert_hami_contract(pod)
    ((uuid, mem, cores),) = grants(pod)
    card = next(d for d in inventory(pod["spec"]["nodeName"]) if d.uuid == uuid)
    assert (mem, cores) == (card.memory_mib, 100)
    e2e_cluster.delete_pod(ns, "whole")


def test_more_cards_than_any_node_is_refused_at_create(
    e2e_cluster: Cluster, webhook_ns: tuple[str, Registration]
) -> None:
    ns, _ = webhook_ns
    status, body = create(e2e_cluster.cp, ns, pod_body("huge", {"nvidia.com/gpu": "64"}, container="train"))
    assert status in (400, 403), body
    assert 'container "train": nvidia.com/gpu is 64, more cards than any node registers' in body["message"]
