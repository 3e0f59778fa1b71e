"""The ownership rule, pure: managedFields to annotation owners, and the patch the agent may send.

Aspects: every entry naming an annotation key counts (any operation, any subresource, several
entries of one manager); malformed entries and non-annotation fields are ignored; a key owned by
any other manager is neither written nor deleted, whether or not its value differs; the agent's
own keys and keys nobody owns are patched as ``publish.changes`` would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from gpuslice.agent import ownership
from gpuslice.codec import keys

pytestmark = pytest.mark.unit

AGENT = "gpuslice-agent"
PLUGIN = "nvidia-device-plugin"


def annotations_entry(manager: str | None, *names: str, **extra: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {".": {}}
    fields.update({f"f:{n}": {} for n in names})
    entry: dict[str, Any] = {
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-08-01T10:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:annotations": fields}},
        **extra,
    }
    if manager is not None:
        entry["manager"] = manager
    return entry


# A GPU node as the API server serves it: the kubelet registered it and reports its status, HAMi's
# device plugin registered its cards and pair scores, the agent published topology and telemetry,
# the extender holds the lock and the handshake, an admin cordoned a card.
NODE_MANAGED_FIELDS: list[dict[str, Any]] = [
    {
        "manager": "kubelet",
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-08-01T09:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {
            "f:metadata": {
                "f:annotations": {".": {}, "f:volumes.kubernetes.io/controller-managed-attach-detach": {}},
                "f:labels": {".": {}, "f:kubernetes.io/hostname": {}},
            }
        },
    },
    {
        "manager": "kubelet",
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-08-01T10:05:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:status": {"f:allocatable": {"f:nvidia.com/gpu": {}}}},
        "subresource": "status",
    },
    annotations_entry(PLUGIN, keys.NODE_REGISTER, keys.NODE_PAIR_SCORE),
    annotations_entry(AGENT, keys.GPU_TOPOLOGY, keys.GPU_TELEMETRY),
    annotations_entry("gpuslice", keys.NODE_HANDSHAKE, keys.NODE_LOCK),
    annotations_entry("kubectl-annotate", keys.DEVICE_CORDON),
]


def test_managers_of_a_gpu_node() -> None:
    assert ownership.annotation_managers(NODE_MANAGED_FIELDS) == {
        "volumes.kubernetes.io/controller-managed-attach-detach": {"kubelet"},
        keys.NODE_REGISTER: {PLUGIN},
        keys.NODE_PAIR_SCORE: {PLUGIN},
        keys.GPU_TOPOLOGY: {AGENT},
        keys.GPU_TELEMETRY: {AGENT},
        keys.NODE_HANDSHAKE: {"gpuslice"},
        keys.NODE_LOCK: {"gpuslice"},
        keys.DEVICE_CORDON: {"kubectl-annotate"},
    }


def test_every_entry_counts() -> None:
    fields = [
        annotations_entry(PLUGIN, keys.NODE_REGISTER),
        annotations_entry(PLUGIN, keys.NODE_PAIR_SCORE, operation="Apply"),  # same manager, second entry
        annotations_entry(AGENT, keys.NODE_PAIR_SCORE, operation="Apply"),  # shared by two appliers
        annotations_entry("kubectl", keys.GPU_TOPOLOGY, subresource="status"),
        annotations_entry(None, keys.GPU_TELEMETRY),  # a manager without a name is somebody else
        annotations_entry("", "example.com/x"),
    ]
    assert ownership.annotation_managers(fields) == {
        keys.NODE_REGISTER: {PLUGIN},
        keys.NODE_PAIR_SCORE: {PLUGIN, AGENT},
        keys.GPU_TOPOLOGY: {"kubectl"},
        keys.GPU_TELEMETRY: {ownership.UNNAMED},
        "example.com/x": {ownership.UNNAMED},
    }


@pytest.mark.parametrize(
    "entry",
    [
        {"manager": PLUGIN},
        {"manager": PLUGIN, "fieldsV1": None},
        {"manager": PLUGIN, "fieldsV1": {"f:metadata": {"f:labels": {"f:" + keys.NODE_REGISTER: {}}}}},
        {"manager": PLUGIN, "fieldsV1": {"f:metadata": {"f:annotations": {".": {}}}}},  # the map itself
        {"manager": PLUGIN, "fieldsV1": {"f:metadata": {"f:annotations": []}}},
        {"manager": PLUGIN, "fieldsV1": {"f:metadata": "nonsense"}},
        {"manager": PLUGIN, "fieldsV1": {"f:status": {"f:annotations": {"f:" + keys.NODE_REGISTER: {}}}}},
    ],
    ids=["no-fields", "null-fields", "a-label", "map-only", "not-a-map", "bad-metadata", "not-metadata"],
)
def test_entries_that_own_no_annotation(entry: dict[str, Any]) -> None:
    assert ownership.annotation_managers([entry]) == {}


def test_other_owners_excludes_the_agent() -> None:
    managers = {
        keys.NODE_PAIR_SCORE: frozenset({AGENT, PLUGIN, "kubectl"}),
        keys.GPU_TOPOLOGY: frozenset({AGENT}),
    }
    assert ownership.other_owners(managers, keys.NODE_PAIR_SCORE, AGENT) == ("kubectl", PLUGIN)
    assert ownership.other_owners(managers, keys.GPU_TOPOLOGY, AGENT) == ()
    assert ownership.other_owners(managers, keys.NODE_REGISTER, AGENT) == ()  # nobody's


CURRENT = {keys.NODE_REGISTER: "hami", keys.NODE_PAIR_SCORE: "hami", keys.GPU_TOPOLOGY: "old"}
DESIRED = {keys.NODE_REGISTER: "ours", keys.NODE_PAIR_SCORE: "ours", keys.GPU_TOPOLOGY: "new"}


@pytest.mark.parametrize(
    ("managers", "current", "desired", "remove", "patch", "yielded"),
    [
        # nobody else wrote anything: exactly publish.changes
        ({}, CURRENT, DESIRED, (), DESIRED, {}),
        # the agent's own keys: the same
        (
            {k: {AGENT} for k in CURRENT},
            CURRENT,
            DESIRED,
            (),
            DESIRED,
            {},
        ),
        # HAMi's plugin owns register and score: only the topology is written
        (
            {keys.NODE_REGISTER: {PLUGIN}, keys.NODE_PAIR_SCORE: {PLUGIN}, keys.GPU_TOPOLOGY: {AGENT}},
            CURRENT,
            DESIRED,
            (),
            {keys.GPU_TOPOLOGY: "new"},
            {keys.NODE_REGISTER: (PLUGIN,), keys.NODE_PAIR_SCORE: (PLUGIN,)},
        ),
        # shared with another manager is owned elsewhere too
        (
            {keys.NODE_PAIR_SCORE: {AGENT, PLUGIN}},
            CURRENT,
            {keys.NODE_PAIR_SCORE: "ours"},
            (),
            {},
            {keys.NODE_PAIR_SCORE: (PLUGIN,)},
        ),
        # yielded even when the values agree: another writer owns it either way
        (
            {keys.NODE_PAIR_SCORE: {PLUGIN}},
            CURRENT,
            {keys.NODE_PAIR_SCORE: "hami"},
            (),
            {},
            {keys.NODE_PAIR_SCORE: (PLUGIN,)},
        ),
        # no cards: the agent's topology is deleted, the plugin's score is not
        (
            {keys.NODE_PAIR_SCORE: {PLUGIN}, keys.GPU_TOPOLOGY: {AGENT}},
            CURRENT,
            {},
            (keys.NODE_PAIR_SCORE, keys.GPU_TOPOLOGY),
            {keys.GPU_TOPOLOGY: None},
            {keys.NODE_PAIR_SCORE: (PLUGIN,)},
        ),
        # its writer deleted the key, which left every entry: the agent writes it again
        (
            {keys.GPU_TOPOLOGY: {AGENT}},
            {keys.GPU_TOPOLOGY: "new"},
            {keys.NODE_PAIR_SCORE: "ours", keys.GPU_TOPOLOGY: "new"},
            (),
            {keys.NODE_PAIR_SCORE: "ours"},
            {},
        ),
        # an admin's kubectl annotate on the agent's own key counts as another writer
        (
            {keys.GPU_TOPOLOGY: {"kubectl-annotate"}},
            CURRENT,
            {keys.GPU_TOPOLOGY: "new"},
            (),
            {},
            {keys.GPU_TOPOLOGY: ("kubectl-annotate",)},
        ),
    ],
    ids=[
        "nobody-else",
        "all-ours",
        "plugin-registers",
        "shared",
        "same-value",
        "no-cards",
        "taken-again",
        "admin-edit",
    ],
)
def test_plan(
    managers: Mapping[str, set[str]],
    current: Mapping[str, str],
    desired: Mapping[str, str],
    remove: tuple[str, ...],
    patch: Mapping[str, str | None],
    yielded: Mapping[str, tuple[str, ...]],
) -> None:
    frozen = {k: frozenset(v) for k, v in managers.items()}
    result = ownership.plan(current, desired, remove, frozen, AGENT)
    assert result.patch == patch
    assert result.yielded == yielded


def test_plan_from_the_managed_fields_of_a_gpu_node() -> None:
    managers = ownership.annotation_managers(NODE_MANAGED_FIELDS)
    current = {k: "old" for k in managers}
    desired = {
        k: "new" for k in (keys.NODE_REGISTER, keys.NODE_PAIR_SCORE, keys.GPU_TOPOLOGY, keys.GPU_TELEMETRY)
    }
    result = ownership.plan(current, desired, (), managers, AGENT)
    assert result.patch == {keys.GPU_TOPOLOGY: "new", keys.GPU_TELEMETRY: "new"}
    assert result.yielded == {keys.NODE_REGISTER: (PLUGIN,), keys.NODE_PAIR_SCORE: (PLUGIN,)}
