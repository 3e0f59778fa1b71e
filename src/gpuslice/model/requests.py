"""A pod's GPU request, in HAMi's semantics (docs/hami-compat.md section 3).

The parsing functions that build these from container resources live in
``gpuslice.codec.resources``; this module only holds the frozen types and their arithmetic.
"""

from __future__ import annotations

import msgspec

from gpuslice.model import gangs

MEMORY_PERCENTAGE_UNSET = 101
"""HAMi's sentinel: no percentage given (memory comes from ``memory_mib``)."""


class ContainerRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What one container asks of each of its cards (HAMi's ``ContainerDeviceRequest``).

    Attributes:
        count: physical cards; each must be a different card.
        memory_mib: MiB per card (already multiplied by ``memoryFactor``); 0 when given as a
            percentage.
        memory_percentage: percent of each card's registered memory, or
            ``MEMORY_PERCENTAGE_UNSET`` when ``memory_mib`` applies.
        cores: percent of each card's SMs; values above 100 are clamped to 100 at fit.

    A request for 100 cores asks for every SM of an unscaled card. HAMi's exclusive rule
    (``pkg/device/nvidia/device.go`` ``Fit``) only applies on a card that registers exactly 100
    cores: there such a request needs a card nobody uses. On a core-scaled card (``devcore`` 200)
    it is an ordinary 100-core share (``policy.cards`` holds the rule).
    """

    count: int
    memory_mib: int = 0
    memory_percentage: int = MEMORY_PERCENTAGE_UNSET
    cores: int = 0

    def memory_on(self, card_memory_mib: int) -> int:
        """MiB this request takes on a card with the given registered memory."""
        if self.memory_mib > 0 or self.memory_percentage == MEMORY_PERCENTAGE_UNSET:
            return self.memory_mib
        return card_memory_mib * self.memory_percentage // 100

    @property
    def cores_clamped(self) -> int:
        """Cores per card as fit uses them (HAMi clamps to 100)."""
        return min(self.cores, 100)

    @property
    def exclusive(self) -> bool:
        """True for a whole-card request (100 cores, all SMs of an unscaled card)."""
        return self.cores_clamped >= 100


class ScoringWeights(msgspec.Struct, frozen=True, kw_only=True):
    """Card-score weights from ``hami.io/device-scoring-weights`` (HAMi's default is 1, 1, 1).

    Attributes:
        slot: weight of the card's slot usage.
        core: weight of its core usage.
        memory: weight of its memory usage.
    """

    slot: float = 1.0
    core: float = 1.0
    memory: float = 1.0


class Selectors(msgspec.Struct, frozen=True, kw_only=True):
    """Card constraints from pod annotations (HAMi's names and gpuslice's aliases merged).

    Attributes:
        use_types: card type must contain one of these (case-insensitive substring); empty = any.
        nouse_types: card type must contain none of these.
        use_uuids: card UUID must be one of these; empty = any.
        nouse_uuids: card UUID must be none of these.
        numa_bind: all cards of a container on one NUMA node.
        numa_node: a required NUMA node id for every card (``hami.io/numa-hint``).
        mode: required card mode (``hami-core``, ``mig``, ``mps``), or None.
    """

    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    nouse_uuids: tuple[str, ...] = ()
    numa_bind: bool = False
    numa_node: int | None = None
    mode: str | None = None


NO_SELECTORS = Selectors()


class TopologyRequirement(msgspec.Struct, frozen=True, kw_only=True):
    """What a multi-card container needs between its cards (``hami.io/gpu-topology-requirement``).

    Attributes:
        require_nvlink: every pair of the container's cards must be NVLink-connected.
        min_bandwidth_gbps: every pair's link bandwidth (GB/s per direction, as the node agent
            publishes it) must be at least this; 0 = no minimum.

    It applies to each container asking for two or more cards; a one-card container has no pair
    and is unaffected (docs/topology.md).
    """

    require_nvlink: bool = False
    min_bandwidth_gbps: float = 0.0

    @property
    def active(self) -> bool:
        """True when the requirement restricts anything."""
        return self.require_nvlink or self.min_bandwidth_gbps > 0


class PodRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the filter and the policies need to know about a pod.

    Attributes:
        namespace: pod namespace.
        name: pod name.
        uid: pod UID ('' when unknown, e.g. in the simulator).
        containers: per container, init containers first, its request or None (no GPU).
        init_count: how many of ``containers`` are init containers.
        sidecars: positions of init containers that keep running beside the app containers
            (Kubernetes native sidecars, ``restartPolicy: Always``).
        selectors: card constraints.
        node_policy: per-pod node policy override (``hami.io/node-scheduler-policy``), or None.
        card_policy: per-pod card policy override (``hami.io/gpu-scheduler-policy``, possibly a
            comma chain such as ``binpack,numa``), or None.
        scoring_weights: per-pod card-score weights (``hami.io/device-scoring-weights``), or None.
        cpu_milli: host CPU request (tracked only by the simulator).
        memory_mib: host memory request (tracked only by the simulator).
        topology: link requirement between the cards of each multi-card container, or None.
        owner: UID of the pod's controller owner reference ('' without one): its job by default.
        labels: the pod's labels as sorted pairs (a configured job label may name its job).
        gang: the gang the pod belongs to (placed all together or not at all), or None.
    """

    namespace: str = "default"
    name: str = ""
    uid: str = ""
    containers: tuple[ContainerRequest | None, ...] = ()
    init_count: int = 0
    sidecars: tuple[int, ...] = ()
    selectors: Selectors = NO_SELECTORS
    node_policy: str | None = None
    card_policy: str | None = None
    scoring_weights: ScoringWeights | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    topology: TopologyRequirement | None = None
    owner: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    gang: gangs.GangRef | None = None

    @property
    def wants_gpu(self) -> bool:
        """True when any container asks for at least one card."""
        return any(c is not None and c.count > 0 for c in self.containers)

    @property
    def app_containers(self) -> tuple[ContainerRequest | None, ...]:
        """The app containers' requests (init containers excluded)."""
        return self.containers[self.init_count :]

    def label(self, key: str) -> str | None:
        """The value of one label, or None when the pod does not carry it."""
        for k, v in self.labels:
            if k == key:
                return v
        return None

    def job(self, job_label: str = "") -> str:
        """The pod's job: the value of ``job_label`` when set and carried, else its controller owner."""
        return job_key(self.owner, self.label(job_label) if job_label else None)

    @property
    def max_count(self) -> int:
        """The largest card count any single container asks for."""
        return max((c.count for c in self.containers if c is not None), default=0)


def job_key(owner: str, label_value: str | None) -> str:
    """A job key: ``label:<value>`` when the job label has a value, else ``owner:<uid>``; '' for neither."""
    if label_value:
        return f"label:{label_value}"
    return f"owner:{owner}" if owner else ""


def footprint(pod: PodRequest) -> int:
    """Bytes a parsed request holds, roughly: its fixed parts, its strings and its containers.

    For the byte budgets of the memos that keep requests between calls (an estimate that grows
    with everything a request can carry, not an exact count).
    """
    sel = pod.selectors
    size = 600 + len(pod.namespace) + len(pod.name) + len(pod.uid) + len(pod.owner)
    size += 80 * len(pod.containers) + 8 * len(pod.sidecars)
    size += len(pod.node_policy or "") + len(pod.card_policy or "") + len(sel.mode or "")
    for group in (sel.use_types, sel.nouse_types, sel.use_uuids, sel.nouse_uuids):
        size += sum(56 + len(item) for item in group)
    size += sum(120 + len(k) + len(v) for k, v in pod.labels)
    if pod.gang is not None:
        size += 200 + len(pod.gang.name) + len(pod.gang.group) + len(pod.gang.pod_group)
    return size
