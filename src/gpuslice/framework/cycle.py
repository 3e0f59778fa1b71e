"""One pod's scheduling cycle: the profile's plugins for the pod, its context, and the nodes it reads.

kube-scheduler creates a ``CycleState`` once per pod and hands it to every plugin
(``pkg/scheduler/framework/cycle_state.go``); here a ``Cycle`` is that, plus the operations every
caller needs: judge many nodes (``evaluate``), place on one (``place``), the node policy's candidate
step (``stepped``) and the first node whose cards the card rule accepts (``first_placed``). Filter,
prioritize, bind's re-fit, ``/preempt``, preemption, explain, shadow and the simulator all go
through it, so which policy acts for a pod, with which context, is decided in one place
(``Cycle.of`` from a cache snapshot; ``Cycle.detached`` from any node source, as the simulator and
the shadow report have).

The context is fixed when the cycle is built: the learned workload (None while untrusted, when a
learning policy gives way to the profile's fallback, at node and at card level alike), the cards
per model, the clock reading, the telemetry age limit and the pod's job with the nodes holding its
other pods.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from gpuslice.framework import profile as profiles
from gpuslice.framework import view
from gpuslice.model import allocations, nodes, requests
from gpuslice.policy import api, batch, columns, fit
from gpuslice.policy import mig as migs
from gpuslice.policy import quota as quotas

UNFIT = -1
"""The internal score of a node the pod does not fit."""


def context_of(profile: profiles.Profile, snap: view.Snapshot, pod: requests.PodRequest) -> api.Context:
    """The policy context of ``pod`` on a cache snapshot, read now (``Cycle.of``; gang plans)."""
    job = pod.job(profile.job_label)
    return api.Context(
        workload=view.workload(snap),
        capacity=view.capacity(snap),
        now=profile.now(),
        telemetry_max_age_s=profile.telemetry_max_age_s,
        job=job,
        job_nodes=view.job_nodes(snap, job),
        mig_rule=profile.mig_rule,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Cycle:
    """One pod judged by one profile against one view of the cluster (module docstring).

    Attributes:
        profile: the profile.
        pod: the pod's request.
        ctx: the policy context, fixed for the cycle.
        node: the node plugin acting for the pod (its override, or the fallback while untrusted).
        cards: the card rule acting for the pod, bound to it.
        states: node name -> state, the nodes the cycle reads.
        cols: the same nodes as columns for the vectorised path (None: node by node).
        quota: the pod's namespace quota with its usage (None: unlimited).
    """

    profile: profiles.Profile
    pod: requests.PodRequest
    ctx: api.Context
    node: api.Plugin
    cards: api.CardChooser
    states: Mapping[str, nodes.NodeState]
    cols: columns.NodeColumns | None
    quota: quotas.QuotaView | None

    @classmethod
    def of(cls, profile: profiles.Profile, snap: view.Snapshot, pod: requests.PodRequest) -> Cycle:
        """The cycle of ``pod`` on a cache snapshot (the extender's every verb)."""
        ctx = context_of(profile, snap, pod)
        return cls.detached(
            profile, pod, ctx, snap.nodes, view.columns(snap), view.quota(snap, pod.namespace)
        )

    @classmethod
    def detached(
        cls,
        profile: profiles.Profile,
        pod: requests.PodRequest,
        ctx: api.Context,
        states: Mapping[str, nodes.NodeState],
        cols: columns.NodeColumns | None = None,
        quota: quotas.QuotaView | None = None,
    ) -> Cycle:
        """The cycle of ``pod`` with a context and nodes the caller holds (simulator, shadow report)."""
        trusted = ctx.workload is not None
        return cls(
            profile, pod, ctx, profile.node(pod, trusted), profile.card(pod, trusted), states, cols, quota
        )

    def state(self, name: str) -> nodes.NodeState | None:
        """The node's state, None when the cycle's view has no such node."""
        return self.states.get(name)

    def evaluate(self, names: Sequence[str]) -> batch.Evaluation:
        """Judge every named node at once (``batch.evaluate``: exactly ``fit.place`` per node)."""
        return batch.evaluate(
            self.states, self.cols, names, self.pod, self.node, self.cards, self.ctx, self.quota
        )

    def place(self, state: nodes.NodeState, quota: bool = True) -> fit.Placement:
        """The pod on one node with the acting card rule (``quota`` False: judged without the quota)."""
        return fit.place(state, self.pod, self.cards, self.ctx, self.quota if quota else None)

    def mig_note(self, state: nodes.NodeState, alloc: allocations.PodAllocation) -> str | None:
        """How the placement's MIG instances compare with HAMi's first fit on ``state`` (``mig.compare``).

        None when the context already places by first fit, or the placement holds no instance.
        Otherwise the pod is placed again on the same state under ``FIRST_FIT`` (same card rule,
        context and quota), which costs one more fit of one node.
        """
        if self.ctx.mig_rule == migs.FIRST_FIT or not any(g.mig for c in alloc.containers for g in c):
            return None
        first = dataclasses.replace(self.ctx, mig_rule=migs.FIRST_FIT)
        hami = fit.place(state, self.pod, self.cards, first, self.quota).allocation
        return migs.compare(state, alloc, hami, self.ctx)

    def stepped(self, scores: np.ndarray) -> np.ndarray:
        """The node policy's candidate step over the nodes the pod fits (``UNFIT`` ones stay so).

        Some policies are defined relative to the candidates (BestFit's min-max normalisation,
        Random's single winner); the simulator applies the same step over its feasible nodes.
        """
        fits = scores > UNFIT
        if not fits.any():
            return scores
        if fits.all():
            return self.node.normalize(scores, self.ctx)
        out = scores.copy()
        out[fits] = self.node.normalize(scores[fits], self.ctx)
        return out

    def first_placed(
        self, names: Sequence[str], keys: np.ndarray
    ) -> tuple[int, allocations.PodAllocation] | None:
        """The best of ``names`` (by ``keys``, ``batch.best_first``) whose cards the card rule accepts."""
        return batch.first_placed(self.states, names, keys, self.pod, self.cards, self.ctx, self.quota)
