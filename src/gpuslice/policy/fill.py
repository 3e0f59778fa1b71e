"""``binpack`` and ``spread``: one usage-based strategy, filling the fullest or the emptiest first.

Both score a node by its weighted usage after placing the pod (see ``usage`` for the arithmetic);
binpack keeps it (fuller is better), spread takes ``100 - usage`` (emptier is better). Cards are
chosen the same way: the fullest eligible cards for binpack, the emptiest for spread.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuslice.model import nodes, requests
from gpuslice.policy import columns, registry, usage


class Fill:
    """A usage-based policy; ``fullest`` selects binpack (True) or spread (False)."""

    def __init__(self, name: str, fullest: bool, args: Mapping[str, float]) -> None:
        """Read the optional ``memory`` / ``cores`` weights."""
        self.name = name
        self.fullest = fullest
        self.wm, self.wc = usage.weights(args)

    def _oriented(self, used: int) -> int:
        return used if self.fullest else registry.MAX_SCORE - used

    def score_node(
        self, state: nodes.NodeState, pod: requests.PodRequest, ctx: registry.Context
    ) -> registry.Scored:
        """Higher for fuller (binpack) or emptier (spread) nodes."""
        return registry.Scored(self._oriented(usage.node_usage_score(state, pod, self.wm, self.wc)))

    def score_columns(
        self,
        cols: columns.NodeColumns,
        rows: columns.IntArray,
        pod: requests.PodRequest,
        ctx: registry.Context = registry.EMPTY_CONTEXT,
    ) -> columns.IntArray:
        """``score_node`` for many rows at once."""
        used = usage.node_usage_scores(cols, rows, pod, self.wm, self.wc)
        return used if self.fullest else registry.MAX_SCORE - used

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: registry.Context,
    ) -> tuple[int, ...] | None:
        """The fullest (binpack) or emptiest (spread) eligible cards."""
        return usage.choose_by_key(
            state, request, eligible, self.wm, self.wc, fullest=self.fullest, card_weights=ctx.card_weights
        )


registry.register("binpack", lambda args: Fill("binpack", True, args))
registry.register("spread", lambda args: Fill("spread", False, args))
