"""Every placement policy gpuslice ships, by name: an explicit map with no import side effects.

Like kube-scheduler's ``NewInTreeRegistry`` (``pkg/scheduler/framework/plugins/registry.go``), the
registry is one literal map from name to factory, assembled here from the ``FACTORIES`` each policy
module declares. A policy module never registers itself and never imports this module, so the
policy package has no cycle. ``get`` builds a policy and resolves its optional abilities once
(``api.Plugin.of``); ``card_policy`` also reads HAMi's comma chains (``policy.chains``).
Unknown names raise ``api.UnknownPolicyError`` (at startup, from the settings' validation).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping

from gpuslice.model import config as model_config
from gpuslice.policy import api, balanced, chains, fill, fragmentation, lookahead, paper, topology


def _merged(*modules: Mapping[str, api.PolicyFactory]) -> Mapping[str, api.PolicyFactory]:
    out: dict[str, api.PolicyFactory] = {}
    for factories in modules:
        for name, factory in factories.items():
            if name in out:
                raise ValueError(f"policy {name!r} defined twice")
            out[name] = factory
    return types.MappingProxyType(dict(sorted(out.items())))


IN_TREE: Mapping[str, api.PolicyFactory] = _merged(
    fill.FACTORIES,
    paper.FACTORIES,
    fragmentation.FACTORIES,
    lookahead.FACTORIES,
    topology.FACTORIES,
    balanced.FACTORIES,
)
"""Name -> factory of every built-in policy, sorted by name."""


def names() -> tuple[str, ...]:
    """All registered policy names, sorted."""
    return tuple(IN_TREE)


def get(name: str, args: Mapping[str, float] | None = None) -> api.Plugin:
    """Build the policy registered under ``name``; raises ``UnknownPolicyError`` if none is."""
    try:
        factory = IN_TREE[name]
    except KeyError:
        raise api.UnknownPolicyError(
            f"scoring policy {name!r} is not supported; known: {', '.join(names())}"
        ) from None
    return api.Plugin.of(factory(args or {}))


@functools.lru_cache(maxsize=256)
def card_policy(value: str) -> api.Plugin:
    """The card policy a value names: one registered policy or a HAMi chain (``policy.chains``).

    Raises:
        UnknownPolicyError: an empty value, an unknown item, or a whole-node policy in a chain.
    """
    parts = chains.items(value)
    if "" in parts:  # HAMi refuses "binpack," too (``IsValidGPUSchedulerPolicy``)
        raise api.UnknownPolicyError(f"card policy {value!r} has an empty item")
    if len(parts) == 1 and parts[0] not in (chains.MUTEX, chains.NUMA):
        return get(parts[0])
    for item in parts:
        if item not in chains.SORT_KEYS and item not in chains.FILTERS:
            what = "cannot be chained" if item in IN_TREE else "is not a card policy"
            raise api.UnknownPolicyError(
                f"card policy {value!r}: {item!r} {what}; a chain combines "
                f"{', '.join(chains.SORT_KEYS)} (sort keys) and {', '.join(chains.FILTERS)} (filters)"
            )
    topo = get(chains.TOPOLOGY).policy if chains.TOPOLOGY in parts else None
    return api.Plugin.of(chains.Chain(parts, topo))


def workload_errors(ws: model_config.WorkloadSettings) -> list[model_config.WorkloadSettingError]:
    """Every problem with ``ws`` (``fallback`` checked against this registry); empty when valid."""
    return model_config.workload_errors(ws, names())


def checked(ws: model_config.WorkloadSettings) -> model_config.WorkloadSettings:
    """``ws`` when valid; raises the first ``model_config.WorkloadSettingError`` otherwise."""
    problems = workload_errors(ws)
    if problems:
        raise problems[0]
    return ws
