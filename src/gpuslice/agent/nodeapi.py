"""The agent's ``NodeApi`` over the Kubernetes API (``gpuslice.kube.nodes``)."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping

import lightkube

from gpuslice.kube import nodes


class KubeNodeApi:
    """Reads and patches one Node, and records events about it.

    Args:
        client: the API client (``nodes.make_client``).
        node_name: the Node.
        wall: unix seconds, for event times.
    """

    def __init__(self, client: lightkube.Client, node_name: str, wall: Callable[[], float]) -> None:
        self._client = client
        self._name = node_name
        self._wall = wall
        self._uid = ""

    def read(self) -> Mapping[str, str]:
        """The Node's annotations (remembers its uid for events)."""
        info = nodes.get_node(self._client, self._name)
        self._uid = info.uid
        return info.annotations

    def patch(self, changes: Mapping[str, str | None]) -> None:
        """Merge-patch annotations."""
        nodes.patch_node_annotations(self._client, self._name, changes)

    def event(self, type_: str, reason: str, note: str, action: str) -> None:
        """Record an events.k8s.io/v1 Event regarding the Node."""
        now = datetime.datetime.fromtimestamp(self._wall(), datetime.UTC)
        node = nodes.NodeInfo(self._name, self._uid, {})
        nodes.record_node_event(
            self._client, node, type_=type_, reason=reason, note=note, action=action, now=now
        )

    def close(self) -> None:
        """Close the client's connections."""
        self._client.close()
