"""``binpack``: fill the fullest nodes and cards first (see ``usage`` for the arithmetic)."""

from __future__ import annotations

from collections.abc import Mapping

from gpuslice.model import nodes, requests
from gpuslice.policy import columns, registry, usage


class Binpack:
    """Node score = weighted usage after placement; cards: the fullest eligible ones."""

    name = "binpack"
    fullest = True

    def __init__(self, args: Mapping[str, float]) -> None:
        """Read the optional ``memory`` / ``cores`` weights."""
        self.wm, self.wc = usage.weights(args)

    def score_node(
        self, state: nodes.NodeState, pod: requests.PodRequest, ctx: registry.Context
    ) -> registry.Scored:
        """Higher for fuller nodes."""
        return registry.Scored(usage.node_usage_score(state, pod, self.wm, self.wc))

    def score_columns(
        self, cols: columns.NodeColumns, rows: columns.IntArray, pod: requests.PodRequest
    ) -> columns.IntArray:
        """``score_node`` for many rows at once."""
        return usage.node_usage_scores(cols, rows, pod, self.wm, self.wc)

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: registry.Context,
    ) -> tuple[int, ...] | None:
        """The fullest eligible cards."""
        return usage.choose_by_key(
            state, request, eligible, self.wm, self.wc, fullest=True, ctx_weights=ctx.weights
        )


registry.register("binpack", Binpack)
