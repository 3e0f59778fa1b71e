"""The scheduling profile: every policy built once from the settings, with the defaults that pick them.

A ``Profile`` is what kube-scheduler calls a profile (``pkg/scheduler/profile``): built once at
startup from the configuration (node and card policy, HAMi chains, the workload fallback, the clock,
the telemetry age limit, the job label, the node-choice mode, the lock margin and the MIG placement
rule), and then asked, for each pod, which plugins act for it (``node``, ``card``).
``from_settings`` is the one way to build it from the extender's settings, so ``gpuslice serve``
and ``gpuslice explain`` judge with the same profile. The per-pod work goes through ``cycle.Cycle``.

While the learned target workload is untrusted (the context has no workload, see
``cache.shapes``), a policy that learns it (``api.Policy.learns_workload``: fgd, fgd-lookahead)
is replaced by the configured ``workload_fallback`` policy, at node level and at card level, as
the simulator's ``engine.Placer`` does (docs/workload.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Protocol

from gpuslice.codec import keys
from gpuslice.framework import registry
from gpuslice.model import config as model_config
from gpuslice.model import requests
from gpuslice.policy import api
from gpuslice.policy import mig as migs


class Settings(Protocol):
    """The settings a profile is built from (``extender.config.Settings`` has them all)."""

    @property
    def node_policy(self) -> str:
        """The default node policy."""
        ...

    @property
    def card_policy(self) -> str:
        """The default card policy (a registered policy or a HAMi chain)."""
        ...

    @property
    def node_choice(self) -> str:
        """How the node choice reaches kube-scheduler (``model.config.NODE_CHOICES``)."""
        ...

    @property
    def job_label(self) -> str:
        """The pod label naming a pod's job ('' = its controller owner)."""
        ...

    @property
    def telemetry_max_age_s(self) -> float:
        """Telemetry older than this counts as absent."""
        ...

    @property
    def lock_margin(self) -> float:
        """Near the best score by this fraction of the scale, prefer a free node lock."""
        ...

    @property
    def mig_placement(self) -> str:
        """How instances are chosen on MIG cards (``policy.mig.RULES``)."""
        ...

    @property
    def workload(self) -> model_config.WorkloadSettings:
        """The learned workload's settings (its ``fallback`` policy)."""
        ...


@dataclasses.dataclass(frozen=True)
class Profile:
    """Every registered policy built once, and the configured defaults (module docstring).

    The card default and ``hami.io/gpu-scheduler-policy`` may also be HAMi chains
    (``binpack,numa``, ``mutex``; ``policy.chains``), built on first use and kept. A per-pod
    override that names no policy is ignored and the configured default applies, as HAMi does
    (``GetGPUSchedulerPolicyByPod``); ``ignored`` says why, for a Warning event.

    Attributes:
        by_name: every registered policy, built (``registry.get``).
        node_default: the configured node policy.
        card_default: the configured card policy.
        choice: how the node choice reaches kube-scheduler (``model.config.NODE_CHOICES``).
        fallback: the policy standing in for learning ones while the workload is untrusted
            (``pod``: none, the learning policy scores without a workload).
        job_label: the pod label naming a pod's job (``requests.PodRequest.job``; '' = its owner).
        telemetry_max_age_s: telemetry older than this counts as absent (None = no limit).
        clock: wall-clock seconds for the context's ``now``; None = no clock (nothing is stale).
        lock_margin: near the best score by this fraction of the scale, prefer a free node lock.
        mig_rule: how instances are chosen on MIG cards (``policy.mig.RULES``; the context's
            ``mig_rule``).
    """

    by_name: Mapping[str, api.Plugin]
    node_default: str
    card_default: str
    choice: str
    fallback: str
    job_label: str
    telemetry_max_age_s: float | None
    clock: Callable[[], float] | None
    lock_margin: float
    mig_rule: str = migs.FRAGMENTATION

    @classmethod
    def build(
        cls,
        node_default: str,
        card_default: str,
        *,
        choice: str = model_config.DEFAULT_NODE_CHOICE,
        fallback: str = model_config.DEFAULT_WORKLOAD.fallback,
        job_label: str = "",
        telemetry_max_age_s: float | None = None,
        clock: Callable[[], float] | None = None,
        lock_margin: float = model_config.DEFAULT_LOCK_MARGIN,
        mig_rule: str = migs.FRAGMENTATION,
    ) -> Profile:
        """Build every registered policy; unknown defaults or fallback raise ``UnknownPolicyError``."""
        if choice not in model_config.NODE_CHOICES:
            raise ValueError(f"node choice must be one of {', '.join(model_config.NODE_CHOICES)}")
        if mig_rule not in migs.RULES:
            raise ValueError(f"MIG placement must be one of {', '.join(migs.RULES)}, got {mig_rule!r}")
        built = {name: registry.get(name) for name in registry.names()}
        registry.get(node_default), registry.card_policy(card_default)
        if fallback != model_config.WORKLOAD_FALLBACK_POD:
            registry.get(fallback)
        return cls(
            built,
            node_default,
            card_default,
            choice,
            fallback,
            job_label,
            telemetry_max_age_s,
            clock,
            lock_margin,
            mig_rule,
        )

    @classmethod
    def of_plugins(cls, plugin: api.Plugin, fallback: api.Plugin | None = None) -> Profile:
        """A profile of one policy at node and card level (the simulator's), with its fallback.

        ``fallback`` stands in for ``plugin`` while the workload is untrusted when ``plugin``
        learns it (None: ``pod``, no fallback).
        """
        by_name = {plugin.name: plugin}
        if fallback is not None:
            by_name.setdefault(fallback.name, fallback)
        return cls(
            by_name,
            plugin.name,
            plugin.name,
            model_config.DEFAULT_NODE_CHOICE,
            model_config.WORKLOAD_FALLBACK_POD if fallback is None else fallback.name,
            "",
            None,
            None,
            0.0,
        )

    @classmethod
    def from_settings(cls, settings: Settings, clock: Callable[[], float] | None) -> Profile:
        """The profile of a running extender (and of ``gpuslice explain`` judging like it)."""
        return cls.build(
            settings.node_policy,
            settings.card_policy,
            choice=settings.node_choice,
            fallback=settings.workload.fallback,
            job_label=settings.job_label,
            telemetry_max_age_s=settings.telemetry_max_age_s,
            clock=clock,
            lock_margin=settings.lock_margin,
            mig_rule=settings.mig_placement,
        )

    @property
    def extender_decides(self) -> bool:
        """True when the filter answers only the node the extender chooses."""
        return self.choice == "extender"

    @property
    def ranks(self) -> bool:
        """True when prioritize answers ranks (``extender`` and ``rank``), False for ``blend``."""
        return self.choice != "blend"

    def now(self) -> float | None:
        """The time a pod is judged at (None without a clock)."""
        return None if self.clock is None else self.clock()

    def node(self, pod: requests.PodRequest, trusted: bool) -> api.Plugin:
        """The pod's node policy: its override when registered, else the default.

        With the workload untrusted (``trusted`` False), a policy that learns it gives way to the
        fallback.
        """
        plugin = self.by_name.get(pod.node_policy) if pod.node_policy else None
        plugin = plugin or self.by_name[self.node_default]
        return plugin if trusted else self._untrusted(plugin)

    def card(self, pod: requests.PodRequest, trusted: bool) -> api.CardChooser:
        """The pod's card rule (its override when valid, else the default), bound to the pod.

        Binding it to the pod gives pod-aware card rules (FGD weighs the host CPU the pod takes
        too) the same view the simulator gives them. With the workload untrusted a learning
        policy gives way to the fallback's rule.
        """
        name = pod.card_policy or self.card_default
        if self._card_problem(name) is not None:
            name = self.card_default
        plugin = self.by_name.get(name)
        if plugin is None:
            return registry.card_policy(name)
        if not trusted:
            plugin = self._untrusted(plugin)
        return plugin.for_pod(pod)

    def _untrusted(self, plugin: api.Plugin) -> api.Plugin:
        """``plugin`` while the workload is untrusted: the fallback when it learns the workload."""
        if not plugin.learns_workload or self.fallback == model_config.WORKLOAD_FALLBACK_POD:
            return plugin
        return self.by_name[self.fallback]

    def ignored(self, pod: requests.PodRequest) -> list[str]:
        """Why the pod's policy overrides are ignored (empty when they are valid or absent)."""
        out: list[str] = []
        if pod.node_policy and pod.node_policy not in self.by_name:
            out.append(
                f"{keys.NODE_SCHEDULER_POLICY}: unknown policy {pod.node_policy!r}, "
                f"using {self.node_default!r}"
            )
        problem = self._card_problem(pod.card_policy) if pod.card_policy else None
        if problem is not None:
            out.append(f"{keys.GPU_SCHEDULER_POLICY}: {problem}; using {self.card_default!r}")
        return out

    def _card_problem(self, name: str) -> str | None:
        """Why ``name`` is neither a registered policy nor a valid chain; None when it is one."""
        if name in self.by_name:
            return None
        try:
            registry.card_policy(name)
        except api.UnknownPolicyError as err:
            return str(err)
        return None
