"""Which node annotation keys the agent may write: those no other component wrote.

Two writers on one annotation key overwrite each other and the last one wins. HAMi's device plugin
writes ``hami.io/node-nvidia-register`` on every node it runs on, and ``hami.io/node-nvidia-score``
with ``ENABLE_TOPOLOGY_SCORE=true`` (``pkg/device-plugin/nvidiadevice/nvinternal/plugin/register.go``
in Project-HAMi/HAMi); the agent can publish both keys too. The rule: the agent owns a key only if
nobody else wrote it. Otherwise it neither writes nor deletes the key.

Who wrote what is Kubernetes' own record, ``metadata.managedFields``
(https://kubernetes.io/docs/reference/using-api/server-side-apply/#field-management): every create,
update or patch is recorded under its field manager (the ``fieldManager`` parameter, else the
client's user agent up to the first ``/``, which for a client-go program is its binary name), with
the fields it set, e.g. ``{"f:metadata": {"f:annotations": {"f:hami.io/node-nvidia-register": {}}}}``.
A plain update or patch that *changes* a field moves it to the writer's entry and out of every
other manager's; a field that is deleted leaves every entry. So a key another manager owns was last
changed by it, and once that manager deletes the key nobody owns it and the agent may take it
again. The agent writes as ``gpuslice.kube.nodes.AGENT_FIELD_MANAGER``.

Pure: managedFields entries (as the API serves them) and annotations in, a patch out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from gpuslice.agent import publish

UNNAMED = "(unnamed)"
"""How an entry without a manager name is reported."""


def annotation_managers(managed_fields: Iterable[Mapping[str, Any]]) -> dict[str, frozenset[str]]:
    """Each annotation key named in ``managedFields``, with the field managers that own it.

    Entries of every operation (``Update``, ``Apply``) and subresource count; one manager may have
    several entries (one per API version and operation). Malformed entries are skipped.
    """
    out: dict[str, set[str]] = {}
    for entry in managed_fields:
        fields = entry.get("fieldsV1")
        meta = fields.get("f:metadata") if isinstance(fields, Mapping) else None
        annotations = meta.get("f:annotations") if isinstance(meta, Mapping) else None
        if not isinstance(annotations, Mapping):
            continue
        manager = entry.get("manager")
        name = manager if isinstance(manager, str) and manager else UNNAMED
        for field in annotations:
            if isinstance(field, str) and field.startswith("f:"):
                out.setdefault(field[2:], set()).add(name)
    return {key: frozenset(managers) for key, managers in out.items()}


def other_owners(managers: Mapping[str, Collection[str]], key: str, own: str) -> tuple[str, ...]:
    """The managers other than ``own`` that own ``key``, sorted (empty: the agent may write it)."""
    return tuple(sorted(m for m in managers.get(key, ()) if m != own))


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the agent sends, and which keys it leaves to other writers.

    Attributes:
        patch: the merge patch (None deletes), only keys no other manager owns.
        yielded: each key the agent would publish or delete but another manager owns, with those
            managers; the agent leaves these keys as they are.
    """

    patch: dict[str, str | None]
    yielded: dict[str, tuple[str, ...]]


def plan(
    current: Mapping[str, str],
    desired: Mapping[str, str],
    remove: Iterable[str],
    managers: Mapping[str, Collection[str]],
    own: str,
) -> Plan:
    """The patch for ``desired`` and ``remove`` (see ``publish.changes``), minus keys owned elsewhere.

    A key counts as yielded whether or not its value differs: another writer owns it either way.
    A ``remove`` key that is absent is nobody's (a deleted field leaves every managedFields entry).

    Args:
        current: the Node's annotations.
        desired: the values the agent wants.
        remove: keys the agent wants gone.
        managers: ``annotation_managers`` of the Node.
        own: the agent's field manager.
    """
    remove = tuple(remove)
    yielded: dict[str, tuple[str, ...]] = {}
    for key in (*desired, *remove):
        others = other_owners(managers, key, own)
        if others:
            yielded[key] = others
    kept = {k: v for k, v in desired.items() if k not in yielded}
    patch = publish.changes(current, kept, (k for k in remove if k not in yielded))
    return Plan(patch=patch, yielded=yielded)
