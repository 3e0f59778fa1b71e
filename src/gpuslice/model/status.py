"""Scheduling outcomes as data: a small closed enum of codes plus reason constants.

Codes follow kube-scheduler's framework: ``UNSCHEDULABLE`` means preemption (freeing capacity on the
node) could help, ``UNRESOLVABLE`` means it cannot, and ``ERROR`` is reserved for surprises.
Reasons are module constants, never formatted per call, so a simulator can afford them.
"""

from __future__ import annotations

import enum

import msgspec


class Code(enum.IntEnum):
    """What the scheduler should do next with a node's outcome.

    This list must stay in the order of kube-scheduler's codes it mirrors.
    """

    SUCCESS = 0
    """The node (or card) fits."""
    ERROR = 1
    """An unexpected failure; the whole request fails."""
    UNSCHEDULABLE = 2
    """Does not fit now; freeing capacity (preemption, departures) could make it fit."""
    UNRESOLVABLE = 3
    """Cannot fit whatever is evicted (wrong type, too few cards, unregistered node)."""


# Card- and node-level reasons. Each rejection carries exactly one of these.
INSUFFICIENT_GPU_MEMORY = "InsufficientGPUMemory"
INSUFFICIENT_GPU_CORES = "InsufficientGPUCores"
INSUFFICIENT_GPU_COUNT = "InsufficientGPUCount"
GPU_SLOTS_EXHAUSTED = "GPUSlotsExhausted"
EXCLUSIVE_CONFLICT = "ExclusiveConflict"
MIG_PLACEMENT_INFEASIBLE = "MigPlacementInfeasible"
"""A card in MIG mode has no free legal placement of a profile that serves the request (HAMi's
``CardMigTopologyInfeasible``)."""
DEVICE_TYPE_MISMATCH = "DeviceTypeMismatch"
UUID_FILTERED = "UUIDFiltered"
DEVICE_UNHEALTHY = "DeviceUnhealthy"
DEVICE_CORDONED = "DeviceCordoned"
NUMA_UNSATISFIED = "NUMAUnsatisfied"
QUOTA_EXCEEDED = "QuotaExceeded"
NODE_UNREGISTERED = "NodeUnregistered"
NODE_REGISTRATION_INVALID = "NodeRegistrationInvalid"
INSUFFICIENT_CPU = "InsufficientCPU"
INSUFFICIENT_HOST_MEMORY = "InsufficientHostMemory"
INVALID_REQUEST = "InvalidRequest"
NODE_HANDSHAKE_STALE = "NodeHandshakeStale"
"""The node's device plugin stopped reporting (HAMi's handshake / kubelet no longer advertises GPUs)."""
NODE_LOCK_HELD = "NodeLockHeld"
"""Another pod has held the node's HAMi lock for longer than a bind takes (a stuck Allocate)."""
NODE_ALLOCATE_STALLED = "NodeAllocateStalled"
"""The node's device plugin left an Allocate unanswered past the timeout; it gets no pods until it
answers one or a cool-off has passed."""
NVLINK_REQUIRED = "NVLinkRequired"
"""The pod's ``gpu-topology-requirement`` asks for NVLink between every pair of its cards, and no
such set of enough eligible cards exists on the node (docs/topology.md)."""
INSUFFICIENT_GPU_BANDWIDTH = "InsufficientGPUBandwidth"
"""The pod's ``gpu-topology-requirement`` asks for a minimum link bandwidth between every pair of
its cards, and no such set of enough eligible cards exists on the node (or the node publishes no
bandwidth; docs/topology.md)."""

FOREIGN_CLAIM_HELD = "ForeignClaimHeld"
"""The pod carries another scheduler's filter claim that scheduler may still act on (younger than
the node lock expiry, or a node lock names the pod); it waits until the claim is stale."""

GANG_UNSCHEDULABLE = "GangUnschedulable"
"""The pod belongs to a gang, and no plan places the gang's minimum of members together now
(docs/gangs.md); the message names the gang and what is short."""
GANG_PLANNED_ELSEWHERE = "GangPlannedElsewhere"
"""The pod's gang plan holds its cards on another node: every node but that one fails so."""
GANG_GROUP_MISSING = "GangGroupMissing"
"""The pod names a PodGroup (or Workload) the extender has not seen: how many members must be
placed together is unknown, so none is placed yet."""

ALL_REASONS: tuple[str, ...] = (
    INSUFFICIENT_GPU_MEMORY,
    INSUFFICIENT_GPU_CORES,
    INSUFFICIENT_GPU_COUNT,
    GPU_SLOTS_EXHAUSTED,
    EXCLUSIVE_CONFLICT,
    MIG_PLACEMENT_INFEASIBLE,
    DEVICE_TYPE_MISMATCH,
    UUID_FILTERED,
    DEVICE_UNHEALTHY,
    DEVICE_CORDONED,
    NUMA_UNSATISFIED,
    QUOTA_EXCEEDED,
    NODE_UNREGISTERED,
    NODE_REGISTRATION_INVALID,
    INSUFFICIENT_CPU,
    INSUFFICIENT_HOST_MEMORY,
    INVALID_REQUEST,
    NODE_HANDSHAKE_STALE,
    NODE_LOCK_HELD,
    NODE_ALLOCATE_STALLED,
    NVLINK_REQUIRED,
    INSUFFICIENT_GPU_BANDWIDTH,
    FOREIGN_CLAIM_HELD,
    GANG_UNSCHEDULABLE,
    GANG_PLANNED_ELSEWHERE,
    GANG_GROUP_MISSING,
)

ALREADY_CACHED = "AlreadyCached"
"""The cache refuses to assume a pod it holds already (the watch confirmed it, or another bind of
it is in flight). A refusal of the pod, not of a node, so it is not in ``ALL_REASONS``."""


class Status(msgspec.Struct, frozen=True):
    """An outcome: a code, the reasons behind it (empty on success) and, where one is said, a message.

    A node's filter outcome has no message; a refused pod request (``invalid_request``) carries
    the parser's words in ``message``.
    """

    code: Code = Code.SUCCESS
    reasons: tuple[str, ...] = ()
    message: str = ""

    @property
    def ok(self) -> bool:
        """True when the node fits."""
        return self.code is Code.SUCCESS


SUCCESS = Status()


def invalid_request(message: str) -> Status:
    """A pod whose GPU request does not parse: unresolvable on every node, ``message`` says why."""
    return Status(Code.UNRESOLVABLE, (INVALID_REQUEST,), message)
