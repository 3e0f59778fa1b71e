"""Gangs: pods placed all together or not at all (docs/gangs.md).

A pod names its gang in one of four ways, each read by ``gpuslice.codec.gangs``:

* scheduler-plugins' label ``scheduling.x-k8s.io/pod-group`` naming a ``PodGroup``
  (``scheduling.x-k8s.io/v1alpha1``), whose ``spec.minMember`` and ``spec.scheduleTimeoutSeconds``
  apply (``SOURCE_POD_GROUP``);
* gpuslice's own annotations, for clusters without that CRD (``SOURCE_ANNOTATION``);
* Kubernetes' native gang scheduling (KEP-4671): ``spec.schedulingGroup.podGroupName`` naming a
  ``PodGroup`` of ``scheduling.k8s.io`` (``SOURCE_SCHEDULING_GROUP``), or, in v1.35,
  ``spec.workloadRef`` naming a ``Workload`` and one of its pod groups (``SOURCE_WORKLOAD``).

Where the minimum lives in an object (a PodGroup, a Workload) the pod's ``GangRef`` carries 0 and
the extender's gang directory reads the object from its watch.
"""

from __future__ import annotations

import msgspec

SOURCE_POD_GROUP = "pod-group"
"""scheduler-plugins' ``scheduling.x-k8s.io/pod-group`` label and its ``PodGroup``."""
SOURCE_ANNOTATION = "annotation"
"""gpuslice's ``gpuslice.io/gang`` annotations (the minimum on the pod itself)."""
SOURCE_SCHEDULING_GROUP = "scheduling-group"
"""``spec.schedulingGroup.podGroupName`` (Kubernetes' native PodGroup)."""
SOURCE_WORKLOAD = "workload"
"""``spec.workloadRef`` (Kubernetes v1.35's Workload API)."""

MAX_MEMBERS = 4096
"""The largest minimum member count accepted (a bound on the planner's work)."""


class GangRef(msgspec.Struct, frozen=True, kw_only=True):
    """What a pod says about its gang.

    Attributes:
        namespace: the pod's namespace (a gang never spans namespaces).
        name: the gang's name: the PodGroup's, the annotation's, or ``workload/podGroup[/replica]``.
        source: how the pod names it (``SOURCE_*``).
        min_member: members that must be placed together; 0 when the group object says.
        timeout_s: how long a plan waits for its members; 0 when the group object (or the
            extender's default) says.
        group: the object to read the minimum from: the PodGroup's or the Workload's name.
        pod_group: with ``SOURCE_WORKLOAD``, the pod group inside the Workload.
    """

    namespace: str
    name: str
    source: str
    min_member: int = 0
    timeout_s: int = 0
    group: str = ""
    pod_group: str = ""

    @property
    def key(self) -> str:
        """``namespace/name``: the gang's identity."""
        return f"{self.namespace}/{self.name}"


class GroupSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a group object (PodGroup, Workload pod group) says about its gang.

    Attributes:
        min_member: members that must be placed together.
        timeout_s: scheduler-plugins' ``scheduleTimeoutSeconds`` (0: not set).
    """

    min_member: int
    timeout_s: int = 0
