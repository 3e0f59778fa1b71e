"""``spread``: prefer the emptiest nodes and cards (see ``usage`` for the arithmetic)."""

from __future__ import annotations

from collections.abc import Mapping

from gpuslice.model import nodes, requests
from gpuslice.policy import columns, registry, usage


class Spread:
    """Node score = 100 - weighted usage after placement; cards: the emptiest eligible ones."""

    name = "spread"
    fullest = False

    def __init__(self, args: Mapping[str, float]) -> None:
        """Read the optional ``memory`` / ``cores`` weights."""
        self.wm, self.wc = usage.weights(args)

    def score_node(
        self, state: nodes.NodeState, pod: requests.PodRequest, ctx: registry.Context
    ) -> registry.Scored:
        """Higher for emptier nodes."""
        return registry.Scored(registry.MAX_SCORE - usage.node_usage_score(state, pod, self.wm, self.wc))

    def score_columns(
        self, cols: columns.NodeColumns, rows: columns.IntArray, pod: requests.PodRequest
    ) -> columns.IntArray:
        """``score_node`` for many rows at once."""
        return registry.MAX_SCORE - usage.node_usage_scores(cols, rows, pod, self.wm, self.wc)

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: registry.Context,
    ) -> tuple[int, ...] | None:
        """The emptiest eligible cards."""
        return usage.choose_by_key(
            state, request, eligible, self.wm, self.wc, fullest=False, ctx_weights=ctx.weights
        )


registry.register("spread", Spread)
