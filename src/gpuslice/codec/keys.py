"""Annotation keys gpuslice reads and writes: HAMi's protocol plus gpuslice's own.

One place for every key, so the extender, the agent and the tests cannot drift apart.
"""

from __future__ import annotations

# Node annotations written by the HAMi device plugin (docs/hami-compat.md section 4).
NODE_REGISTER = "hami.io/node-nvidia-register"
"""Card list, JSON (plugin >= v2.8) or the legacy colon format."""
NODE_PAIR_SCORE = "hami.io/node-nvidia-score"
"""Pairwise topology scores, only with ``ENABLE_TOPOLOGY_SCORE=true``."""
NODE_HANDSHAKE = "hami.io/node-handshake"
"""Liveness handshake (no ``-nvidia`` suffix)."""
DEVICE_CORDON = "hami.io/device-cordon"
"""Comma-separated GPU UUIDs excluded from new allocations (set by an admin)."""
NODE_LOCK = "hami.io/mutex.lock"
"""Node lock ``<RFC3339>,<namespace>,<pod>``, shared by all vendors."""

# Node annotations written by the gpuslice node agent.
GPU_TOPOLOGY = "gpuslice.io/gpu-topology"
"""Full NVLink / PCIe / P2P matrices (see ``gpuslice.codec.topology``)."""
GPU_TELEMETRY = "gpuslice.io/gpu-telemetry"
"""Per-card health and load readings (see ``gpuslice.codec.telemetry``)."""

# Pod annotations written by the scheduler (docs/hami-compat.md section 5) and the device plugin.
VGPU_NODE = "hami.io/vgpu-node"
"""The chosen node; HAMi also sets it as a pod label."""
VGPU_TIME = "hami.io/vgpu-time"
"""Unix seconds when the node was chosen."""
DEVICES_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
"""Encoded devices; the plugin blanks each container's entry as it allocates."""
DEVICES_ALLOCATED = "hami.io/vgpu-devices-allocated"
"""Same string, never erased: the source of truth for rebuilding usage."""
MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
"""The MIG instances a pod was given (profile and placement per card, HAMi v2.10); the device plugin
adds each instance's MIG UUID and GPU/compute instance ids at ``Allocate``."""
BIND_PHASE = "hami.io/bind-phase"
"""``allocating`` (scheduler at bind), then ``success`` / ``failed`` (device plugin)."""
BIND_TIME = "hami.io/bind-time"
"""Unix seconds of the bind."""

BIND_PHASE_ALLOCATING = "allocating"
BIND_PHASE_SUCCESS = "success"
BIND_PHASE_FAILED = "failed"

# Pod selection annotations, HAMi's names (docs/hami-compat.md section 9).
USE_GPU_TYPE = "nvidia.com/use-gputype"
NOUSE_GPU_TYPE = "nvidia.com/nouse-gputype"
USE_GPU_UUID = "nvidia.com/use-gpuuuid"
NOUSE_GPU_UUID = "nvidia.com/nouse-gpuuuid"
NUMA_BIND = "nvidia.com/numa-bind"
VGPU_MODE = "nvidia.com/vgpu-mode"
NODE_SCHEDULER_POLICY = "hami.io/node-scheduler-policy"
GPU_SCHEDULER_POLICY = "hami.io/gpu-scheduler-policy"

# gpuslice's aliases; merged with HAMi's names.
GPU_TYPE = "hami.io/gpu-type"
"""Alias of ``nvidia.com/use-gputype``."""
GPU_UUID_INCLUDE = "hami.io/gpu-uuid-include"
"""Alias of ``nvidia.com/use-gpuuuid``."""
GPU_UUID_EXCLUDE = "hami.io/gpu-uuid-exclude"
"""Alias of ``nvidia.com/nouse-gpuuuid``."""
NUMA_HINT = "hami.io/numa-hint"
"""A required NUMA node id (integer) for every card of the pod."""
GPU_TOPOLOGY_REQUIREMENT = "hami.io/gpu-topology-requirement"
"""Link requirement between the cards of a multi-card container, JSON
``{"RequireNVLink": true, "MinGPUBandwidth": 200}`` (GB/s; see ``gpuslice.codec.linkreq``)."""
DEVICE_SCORING_WEIGHTS = "hami.io/device-scoring-weights"
"""Card-score weights ``slot=1,core=1,memory=3``; all three keys required, at least one positive."""

# ----- gangs (docs/gangs.md)

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
"""scheduler-plugins' label naming the pod's ``PodGroup`` (``scheduling.x-k8s.io/v1alpha1``)."""
GANG = "gpuslice.io/gang"
"""gpuslice's gang name, for clusters without the PodGroup CRD (the gang is ``namespace/name``)."""
GANG_MIN_MEMBERS = "gpuslice.io/gang-min-members"
"""With ``GANG``: how many members must be placed together (a positive integer)."""
GANG_TIMEOUT_SECONDS = "gpuslice.io/gang-timeout-seconds"
"""With ``GANG``: how long a plan waits for its members, in seconds (optional)."""
