"""The largest GPU count any node registers, kept current by a node informer.

Feeds the validating route's capacity check (``validate.container_problems``): a container asking
more cards than ``max_cards()`` can never be placed. ``max_cards()`` is None until the informer
has listed and while no node carries a decodable ``hami.io/node-nvidia-register``: the check
then fails open (an operator installing gpuslice before the device plugins must not be blocked).

Nodes are stored with only the registration annotation (``trim``), so a large cluster costs a few
bytes per node. RBAC: nodes get/list/watch.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Mapping

from gpuslice.codec import errors as codec_errors
from gpuslice.codec import keys, node_inventory
from gpuslice.kube import client as kclient
from gpuslice.kube import informer, kinds, objects


def cards(annotations: Mapping[str, str]) -> int | None:
    """The number of cards a node registers; None without a (decodable) registration."""
    try:
        return len(node_inventory.node_devices(annotations))
    except codec_errors.DecodeError:
        return None


def trim(node: objects.Node) -> objects.Node:
    """The node with its name, resourceVersion and registration only."""
    ann = node.metadata.annotations
    kept = {keys.NODE_REGISTER: ann[keys.NODE_REGISTER]} if keys.NODE_REGISTER in ann else {}
    meta = objects.ObjectMeta(
        name=node.metadata.name, resource_version=node.metadata.resource_version, annotations=kept
    )
    return objects.Node(metadata=meta)


def _meta(node: objects.Node) -> objects.ObjectMeta:
    return node.metadata


NODES: kinds.Kind[objects.Node] = kinds.Kind("nodes", "/api/v1/nodes", objects.Node, _meta, trim)
"""Nodes, trimmed to the registration."""


class Cards:
    """Card count per node and how many nodes have each count (pure; fed with informer events)."""

    def __init__(self) -> None:
        self.by_node: dict[str, int] = {}
        self._counts: collections.Counter[int] = collections.Counter()

    def set(self, node: str, count: int | None) -> None:
        """Record a node's card count (None: not a GPU node, or a malformed registration)."""
        old = self.by_node.pop(node, None)
        if old is not None:
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]
        if count is not None and count > 0:
            self.by_node[node] = count
            self._counts[count] += 1

    def on_event(self, event: informer.Event[objects.Node]) -> None:
        """Apply one informer event."""
        node = event.obj
        if node is None:
            return
        deleted = event.type is informer.EventType.DELETED
        self.set(node.metadata.name, None if deleted else cards(node.metadata.annotations))

    def max(self) -> int | None:
        """The most cards one node has; None when no node registers any."""
        return max(self._counts) if self._counts else None


class NodeCapacity:
    """A node informer feeding ``Cards``.

    Args:
        kube: API client (needs nodes get/list/watch).
        resync_s: full relist period.
    """

    def __init__(self, kube: kclient.KubeClient, resync_s: float = 300.0) -> None:
        self.cards = Cards()
        self.informer = informer.Informer(kube, NODES, self.cards.on_event, resync_s=resync_s)

    def ready(self) -> bool:
        """True once the node informer has listed (it stays so)."""
        return self.informer.synced

    def max_cards(self) -> int | None:
        """The largest registered card count; None before the first list or with no GPU node."""
        return self.cards.max() if self.informer.synced else None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[NodeCapacity]:
        """Run the informer while the block runs."""
        task = asyncio.create_task(self.informer.run(), name="webhook-node-informer")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
