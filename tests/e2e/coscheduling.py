"""The KubeSchedulerConfiguration profile part that turns on scheduler-plugins' Coscheduling plugin.

Only the profile's ``plugins`` and ``pluginConfig`` are made here; the extender section still comes
from ``gpuslice render scheduler-config`` (``gpuslice.extender.render.scheduler_config``), and
``with_coscheduling`` adds the plugin to every profile of such a configuration without touching
``extenders``. The scheduler binary must be one that registers the plugin:
``hack/coscheduling/build.sh`` builds kubernetes-sigs/scheduler-plugins' ``cmd/scheduler``.

Sources, sigs.k8s.io/scheduler-plugins v0.34.7 (Apache-2.0):

- ``manifests/coscheduling/scheduler-config.yaml`` and ``pkg/coscheduling/README.md``: enable
  ``Coscheduling`` under ``multiPoint`` and make it the only ``queueSort`` plugin (``disabled: *``
  removes the default ``PrioritySort``; a profile has exactly one queue sort). Through
  ``multiPoint`` the plugin runs at every extension point it implements
  (``pkg/coscheduling/coscheduling.go``): QueueSort, PreFilter, PostFilter, Reserve/Unreserve and
  Permit; the README requires queueSort, permit and unreserve, and calls preFilter optional.
- ``apis/config/v1/types.go`` ``CoschedulingArgs`` and ``apis/config/v1/defaults.go``:
  ``permitWaitingTimeSeconds`` (default 60; a PodGroup's ``spec.scheduleTimeoutSeconds`` overrides
  it), ``podGroupBackoffSeconds`` (default 0, no backoff) and ``podGroupRejectPercentage`` (0-100,
  default 10: PostFilter rejects the whole waiting group only when more than that share of
  ``minMember`` is still unassigned). The args need no ``apiVersion``/``kind``: scheduler-plugins
  registers ``CoschedulingArgs`` in ``kubescheduler.config.k8s.io/v1``.

Pods join a group with the label ``scheduling.x-k8s.io/pod-group: <PodGroup name>`` in the same
namespace; the PodGroup CRD (``tests/e2e/manifests/podgroup-crd.yaml``) must be installed before the
scheduler starts, since the plugin reads PodGroups through a cached client.
"""

from __future__ import annotations

import copy
from typing import Any

PLUGIN = "Coscheduling"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
"""The pod label naming its PodGroup (``apis/scheduling/v1alpha1/types.go`` ``PodGroupLabel``)."""
POD_GROUP_API_VERSION = "scheduling.x-k8s.io/v1alpha1"


def plugins() -> dict[str, Any]:
    """A profile's ``plugins`` section that enables Coscheduling (the upstream manifest's)."""
    return {
        "multiPoint": {"enabled": [{"name": PLUGIN}]},
        "queueSort": {"enabled": [{"name": PLUGIN}], "disabled": [{"name": "*"}]},
    }


def plugin_config(
    permit_waiting_time_seconds: int = 10,
    pod_group_backoff_seconds: int | None = None,
    pod_group_reject_percentage: int | None = None,
) -> dict[str, Any]:
    """The ``pluginConfig`` entry with ``CoschedulingArgs``; None leaves upstream's default.

    ``permit_waiting_time_seconds`` defaults to the upstream manifest's 10 (the plugin's own default
    is 60), so that a group that cannot be completed gives its waiting pods back quickly in tests.

    Raises:
        ValueError: for values the plugin's validation rejects (negative, or a percentage outside
            0..100).
    """
    if permit_waiting_time_seconds < 0:
        raise ValueError("permitWaitingTimeSeconds must not be negative")
    args: dict[str, Any] = {"permitWaitingTimeSeconds": permit_waiting_time_seconds}
    if pod_group_backoff_seconds is not None:
        if pod_group_backoff_seconds < 0:
            raise ValueError("podGroupBackoffSeconds must not be negative")
        args["podGroupBackoffSeconds"] = pod_group_backoff_seconds
    if pod_group_reject_percentage is not None:
        if not 0 <= pod_group_reject_percentage <= 100:
            raise ValueError("podGroupRejectPercentage must be between 0 and 100")
        args["podGroupRejectPercentage"] = pod_group_reject_percentage
    return {"name": PLUGIN, "args": args}


def profile_part(**args: Any) -> dict[str, Any]:
    """``plugins`` and ``pluginConfig`` for one profile; ``args`` go to ``plugin_config``."""
    return {"plugins": plugins(), "pluginConfig": [plugin_config(**args)]}


def with_coscheduling(config: dict[str, Any], **args: Any) -> dict[str, Any]:
    """A copy of a KubeSchedulerConfiguration dict with Coscheduling on in every profile.

    ``config`` is what ``gpuslice.extender.render.scheduler_config`` returns; only the profiles
    change (the extender section is kept as it is). ``args`` go to ``plugin_config``.

    Raises:
        ValueError: when a profile already configures ``plugins`` or a Coscheduling plugin config.
    """
    out = copy.deepcopy(config)
    profiles = out.setdefault("profiles", [{}])
    for prof in profiles:
        if "plugins" in prof:
            raise ValueError(f"profile {prof.get('schedulerName')!r} already sets plugins")
        if any(pc.get("name") == PLUGIN for pc in prof.get("pluginConfig", [])):
            raise ValueError(f"profile {prof.get('schedulerName')!r} already configures {PLUGIN}")
        part = profile_part(**args)
        prof["plugins"] = part["plugins"]
        prof["pluginConfig"] = [*prof.get("pluginConfig", []), *part["pluginConfig"]]
    return out


def pod_group(
    name: str, namespace: str, min_member: int, schedule_timeout_seconds: int | None = None
) -> dict[str, Any]:
    """A PodGroup object (``scheduling.x-k8s.io/v1alpha1``) for the API."""
    spec: dict[str, Any] = {"minMember": min_member}
    if schedule_timeout_seconds is not None:
        spec["scheduleTimeoutSeconds"] = schedule_timeout_seconds
    return {
        "apiVersion": POD_GROUP_API_VERSION,
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
