"""``binpack`` and ``spread``: one usage-based strategy, filling the fullest or the emptiest first.

Both score a node by its weighted usage after placing the pod (see ``usage`` for the arithmetic);
binpack keeps it (fuller is better), spread takes ``100 - usage`` (emptier is better). Cards are
chosen the same way: the fullest eligible cards for binpack, the emptiest for spread.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuslice.model import nodes, requests
from gpuslice.policy import api, columns, usage


class Fill:
    """A usage-based policy; ``fullest`` selects binpack (True) or spread (False)."""

    idle_only = False
    """Declared: no card filter beyond the fit (``api.Policy``)."""
    learns_workload = False
    """Declared: scores without the learned workload (``api.Policy``)."""

    def __init__(self, name: str, fullest: bool, args: Mapping[str, float]) -> None:
        """Read the optional ``memory`` / ``cores`` weights."""
        self.name = name
        self.fullest = fullest
        self.wm, self.wc = usage.weights(args)

    def _oriented(self, used: int) -> int:
        return used if self.fullest else api.MAX_SCORE - used

    def score_node(self, state: nodes.NodeState, pod: requests.PodRequest, ctx: api.Context) -> api.Scored:
        """Higher for fuller (binpack) or emptier (spread) nodes."""
        return api.Scored(self._oriented(usage.node_usage_score(state, pod, self.wm, self.wc)))

    def score_columns(
        self,
        cols: columns.NodeColumns,
        rows: columns.IntArray,
        pod: requests.PodRequest,
        ctx: api.Context = api.EMPTY_CONTEXT,
    ) -> columns.IntArray:
        """``score_node`` for many rows at once."""
        used = usage.node_usage_scores(cols, rows, pod, self.wm, self.wc)
        return used if self.fullest else api.MAX_SCORE - used

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: api.Context,
    ) -> tuple[int, ...] | None:
        """The fullest (binpack) or emptiest (spread) eligible cards."""
        return usage.choose_by_key(
            state, request, eligible, self.wm, self.wc, fullest=self.fullest, card_weights=ctx.card_weights
        )


FACTORIES: Mapping[str, api.PolicyFactory] = {
    "binpack": lambda args: Fill("binpack", True, args),
    "spread": lambda args: Fill("spread", False, args),
}
"""The policies this module defines, by registry name (``framework.registry`` collects them)."""
