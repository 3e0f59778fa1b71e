"""The node agent's API calls: read a Node's annotations, merge-patch them, record Node events.

Small and synchronous (the agent is a thread-based program), on lightkube. Its failures are
``kube.errors`` like every other API call's: a lightkube error becomes the class of its status code
(``Conflict`` for 409, ...), anything else ``ApiUnavailable``.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any

import lightkube
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models import core_v1 as core_models
from lightkube.models import meta_v1
from lightkube.resources import core_v1, events_v1
from lightkube.types import PatchType

from gpuslice.kube import errors

AGENT_FIELD_MANAGER = "gpuslice-agent"
"""The field manager every write of the agent carries; the API server records it in the Node's
``metadata.managedFields``, which is how the agent tells its own annotation keys from keys another
component wrote (``gpuslice.agent.ownership``)."""
REPORTING_CONTROLLER = "gpuslice.io/agent"
EVENT_NAMESPACE = "default"
"""Node events live in ``default`` (Nodes are cluster-scoped), as the kubelet records them."""
_NOTE_MAX = 1024  # events.k8s.io/v1 rejects longer notes


class NodeInfo:
    """What the agent needs from its Node object.

    Attributes:
        name: the Node's name.
        uid: its uid (for events).
        annotations: its annotations.
        resource_version: ``metadata.resourceVersion`` (a patch carrying it is a compare-and-swap).
        managed_fields: ``metadata.managedFields``, each entry as the API serves it (``manager``,
            ``operation``, ``fieldsV1``, ...): who wrote which field.
    """

    def __init__(
        self,
        name: str,
        uid: str,
        annotations: Mapping[str, str],
        *,
        resource_version: str = "",
        managed_fields: tuple[Mapping[str, Any], ...] = (),
    ) -> None:
        self.name = name
        self.uid = uid
        self.annotations = dict(annotations)
        self.resource_version = resource_version
        self.managed_fields = managed_fields


def make_client(kubeconfig: str | None = None) -> lightkube.Client:
    """A client from a kubeconfig file, or from the environment (in-cluster or ``KUBECONFIG``)."""
    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    return lightkube.Client(config=config, field_manager=AGENT_FIELD_MANAGER)


def _wrap(what: str, exc: Exception) -> errors.ApiError:
    """A failed lightkube call as ``kube.errors``: by its status code, else not reached (code 0)."""
    if isinstance(exc, lightkube.ApiError):
        code = exc.status.code or 0
        message = f"{what}: {exc.status.message}"
        if code >= 400:
            return errors.class_for(code)(message, code=code, reason=exc.status.reason or "")
        return errors.ApiUnavailable(message)
    return errors.ApiUnavailable(f"{what}: {exc}")


def get_node(client: lightkube.Client, name: str) -> NodeInfo:
    """Read a Node's uid, annotations, resourceVersion and managedFields.

    Raises:
        errors.ApiError: the call failed (``errors.NotFound``: the Node does not exist).
    """
    try:
        node = client.get(core_v1.Node, name)
    except Exception as e:  # lightkube raises ApiError or the HTTP client's errors
        raise _wrap(f"reading node {name}", e) from e
    meta = node.metadata
    return NodeInfo(
        name=name,
        uid=(meta.uid if meta else None) or "",
        annotations=(meta.annotations if meta else None) or {},
        resource_version=(meta.resourceVersion if meta else None) or "",
        managed_fields=tuple(e.to_dict() for e in ((meta.managedFields if meta else None) or ())),
    )


def patch_node_annotations(
    client: lightkube.Client,
    name: str,
    changes: Mapping[str, str | None],
    *,
    resource_version: str | None = None,
    field_manager: str = AGENT_FIELD_MANAGER,
) -> None:
    """Merge-patch annotations (a None value removes the key) as ``field_manager``.

    With ``resource_version`` the patch applies only to that version of the Node (409 otherwise),
    so nothing written since the caller's read is overwritten.

    Raises:
        errors.ApiError: the patch failed (``errors.Conflict``: the Node changed since ``resource_version``).
    """
    if not changes:
        return
    metadata: dict[str, object] = {"annotations": dict(changes)}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    body = {"metadata": metadata}
    try:
        client.patch(core_v1.Node, name, body, patch_type=PatchType.MERGE, field_manager=field_manager)
    except Exception as e:
        raise _wrap(f"patching node {name}", e) from e


def record_node_event(
    client: lightkube.Client,
    node: NodeInfo,
    *,
    type_: str,
    reason: str,
    note: str,
    action: str,
    now: datetime.datetime,
) -> None:
    """Create an events.k8s.io/v1 Event about a Node (type ``Warning`` or ``Normal``).

    Raises:
        errors.ApiError: the create failed.
    """
    event = events_v1.Event(
        # named as the kubelet names events: <object>.<unix nanoseconds in hex>
        metadata=meta_v1.ObjectMeta(
            name=f"{node.name}.{int(now.timestamp() * 1e9):x}", namespace=EVENT_NAMESPACE
        ),
        eventTime=now,
        type=type_,
        reason=reason,
        note=note[:_NOTE_MAX],
        action=action,
        reportingController=REPORTING_CONTROLLER,
        reportingInstance=f"gpuslice-agent-{node.name}"[:128],
        regarding=core_models.ObjectReference(
            apiVersion="v1", kind="Node", name=node.name, uid=node.uid or None
        ),
    )
    try:
        client.create(event, namespace=EVENT_NAMESPACE)
    except Exception as e:
        raise _wrap(f"recording event {reason} on node {node.name}", e) from e


class NodeClient:
    """One Node's annotations and events, for the node agent (its ``NodeApi``).

    Args:
        client: the API client (``make_client``).
        node_name: the Node.
        wall: unix seconds, for event times.
        field_manager: the field manager its patches carry.
    """

    def __init__(
        self,
        client: lightkube.Client,
        node_name: str,
        wall: Callable[[], float],
        field_manager: str = AGENT_FIELD_MANAGER,
    ) -> None:
        self._client = client
        self._name = node_name
        self._wall = wall
        self._uid = ""
        self.field_manager = field_manager

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None, node_name: str, wall: Callable[[], float]) -> NodeClient:
        """A client from a kubeconfig file, or from the environment when None."""
        return cls(make_client(kubeconfig), node_name, wall)

    def read(self) -> Mapping[str, str]:
        """The Node's annotations (remembers its uid for events)."""
        info = get_node(self._client, self._name)
        self._uid = info.uid
        return info.annotations

    def read_node(self) -> NodeInfo:
        """The Node's annotations, resourceVersion and managedFields (remembers its uid for events)."""
        info = get_node(self._client, self._name)
        self._uid = info.uid
        return info

    def patch(self, changes: Mapping[str, str | None], resource_version: str | None = None) -> None:
        """Merge-patch annotations as ``field_manager`` (only onto ``resource_version`` if given)."""
        patch_node_annotations(
            self._client,
            self._name,
            changes,
            resource_version=resource_version,
            field_manager=self.field_manager,
        )

    def event(self, type_: str, reason: str, note: str, action: str) -> None:
        """Record an events.k8s.io/v1 Event regarding the Node."""
        now = datetime.datetime.fromtimestamp(self._wall(), datetime.UTC)
        node = NodeInfo(self._name, self._uid, {})
        record_node_event(self._client, node, type_=type_, reason=reason, note=note, action=action, now=now)

    def close(self) -> None:
        """Close the client's connections."""
        self._client.close()
