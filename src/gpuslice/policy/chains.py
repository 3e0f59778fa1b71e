"""Card-policy values as HAMi reads them: one registered policy, or a comma chain of sort keys and filters.

``hami.io/gpu-scheduler-policy`` (and the configured card policy) may name one registered policy
(``binpack``, ``fgd``, ``topology-aware:lowest-fragmentation``, ...) or, as in HAMi since v2.9
(``pkg/scheduler/policy/gpu_policy.go``, PR #2621), an ordered comma list of

* **sort keys** ``binpack`` (fullest card first), ``spread`` (emptiest first) and ``numa`` (lowest
  NUMA node first), compared in the order written, the card index last; and
* **filters** ``mutex`` (only idle cards are eligible; a card in use fails ``ExclusiveConflict``)
  and ``topology-aware`` (the container gets the best-connected set of eligible cards, as the
  ``topology-aware`` policy picks it).

Items are trimmed and repeats dropped (``"mutex, spread, numa"`` is ``mutex,spread,numa``); an
empty item (``"binpack,"``) makes the value invalid, as in HAMi. A chain without a sort key sorts
like ``spread`` (HAMi's default). Under ``nvidia.com/numa-bind`` ``fit`` offers the cards one NUMA
node at a time, lowest first, which puts ``numa`` first whatever the chain says, as HAMi forces
it. A lone ``numa`` or ``mutex`` is a chain too. Other registered policies (FGD, the paper's
policies, the topology strategies) judge the whole node and cannot be chained: naming one in a
chain is an unknown policy, as is any unknown item. Equal cards go to the lowest index.

binpack and spread rank cards by the same usage key as the ``binpack`` / ``spread`` policies
(``usage.ranking_key``: HAMi's weighted card score when the pod sets
``hami.io/device-scoring-weights``).
"""

from __future__ import annotations

from gpuslice.model import nodes, requests
from gpuslice.policy import api, fill, usage

BINPACK, SPREAD, NUMA = "binpack", "spread", "numa"
MUTEX, TOPOLOGY = "mutex", "topology-aware"
SORT_KEYS = (BINPACK, SPREAD, NUMA)
FILTERS = (MUTEX, TOPOLOGY)


class Chain:
    """A card policy built from HAMi's sort keys and filters (module docstring)."""

    learns_workload = False

    def __init__(self, items: tuple[str, ...], topology: api.Policy | None = None) -> None:
        """``items``: the chain's distinct items in the order written (already validated).

        ``topology``: the ``topology-aware`` policy, given when ``items`` names it.
        """
        self.name = ",".join(items)
        keys = tuple(k for k in items if k in SORT_KEYS)
        self.keys = keys or (SPREAD,)
        self.idle_only = MUTEX in items
        if (topology is not None) != (TOPOLOGY in items):
            raise ValueError("a chain takes the topology policy exactly when it names topology-aware")
        self._topology = topology
        usage_key = next((k for k in self.keys if k != NUMA), SPREAD)
        self._fill = fill.Fill(usage_key, usage_key == BINPACK, {})

    def score_node(self, state: nodes.NodeState, pod: requests.PodRequest, ctx: api.Context) -> api.Scored:
        """The topology score when the chain names ``topology-aware``, else its first usage key's."""
        if self._topology is not None:
            return self._topology.score_node(state, pod, ctx)
        return self._fill.score_node(state, pod, ctx)

    def choose_cards(
        self,
        state: nodes.NodeState,
        request: requests.ContainerRequest,
        eligible: tuple[int, ...],
        ctx: api.Context,
    ) -> tuple[int, ...] | None:
        """The first ``request.count`` eligible cards in chain order (or the best-connected set)."""
        if self._topology is not None:
            return self._topology.choose_cards(state, request, eligible, ctx)
        used = usage.ranking_key(state, request, self._fill.wm, self._fill.wc, ctx.card_weights)
        devs = state.inventory.devices

        def order(i: int) -> tuple[float, ...]:
            out: list[float] = []
            for key in self.keys:
                if key == NUMA:
                    out.append(devs[i].numa)
                else:
                    out.append(-used(i) if key == BINPACK else used(i))
            out.append(i)
            return tuple(out)

        return tuple(sorted(eligible, key=order)[: request.count])


def items(value: str) -> tuple[str, ...]:
    """A policy value's items: split on commas, trimmed, repeats dropped ('' for an empty item)."""
    out: dict[str, None] = {}
    for part in value.split(","):
        out.setdefault(part.strip(), None)
    return tuple(out)
