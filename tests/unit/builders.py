"""Fluent builders for model objects in tests (like kube-scheduler's testing wrappers).

    state = node("n1").gpus(4, memory=24576).used(0, memory=8000, cores=30).state()
    req = pod("p").gpu(1, memory=8000, cores=30).obj()

UUIDs are ``GPU-<node>-<index>``. Everything returns frozen model objects.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Self

from gpuslice.model import allocations, devices, nodes, requests, topology

A100 = "NVIDIA A100-SXM4-80GB"
V100 = "NVIDIA-Tesla V100-PCIE-32GB"


def uuid(node_name: str, index: int) -> str:
    """The UUID the node builder gives card ``index`` of ``node_name``."""
    return f"GPU-{node_name}-{index}"


class NodeBuilder:
    """Builds a NodeInventory / NodeState."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._devices: list[devices.GpuDevice] = []
        self._usage: list[nodes.CardUsage] = []
        self._cordoned: set[str] = set()
        self._topology: topology.Topology | None = None
        self._telemetry: list[nodes.CardTelemetry] = []
        self._cpu = (0, 0)
        self._cpu_used = (0, 0)

    def card(
        self,
        *,
        model: str = A100,
        memory: int = 81920,
        cores: int = 100,
        slots: int = 10,
        numa: int = 0,
        mode: str = devices.MODE_HAMI_CORE,
        health: bool = True,
        uuid_: str | None = None,
    ) -> Self:
        i = len(self._devices)
        self._devices.append(
            devices.GpuDevice(
                uuid=uuid_ or uuid(self._name, i),
                index=i,
                type=model,
                memory_mib=memory,
                cores=cores,
                split_count=slots,
                numa=numa,
                mode=mode,
                health=health,
            )
        )
        self._usage.append(nodes.EMPTY_CARD)
        return self

    def gpus(
        self,
        n: int,
        *,
        model: str = A100,
        memory: int = 81920,
        cores: int = 100,
        slots: int = 10,
        numa: int | None = None,
        per_numa: int | None = None,
        mode: str = devices.MODE_HAMI_CORE,
    ) -> Self:
        """Add n identical cards; NUMA is ``numa`` or ``index // per_numa`` (default all 0)."""
        for k in range(n):
            i = len(self._devices)
            nn = numa if numa is not None else (i // per_numa if per_numa else 0)
            self.card(model=model, memory=memory, cores=cores, slots=slots, numa=nn, mode=mode)
            del k
        return self

    def used(self, i: int, *, memory: int = 0, cores: int = 0, slots: int = 1) -> Self:
        u = self._usage[i]
        self._usage[i] = nodes.CardUsage(
            slots=u.slots + slots, memory_mib=u.memory_mib + memory, cores=u.cores + cores
        )
        return self

    def unhealthy(self, i: int) -> Self:
        d = self._devices[i]
        self._devices[i] = devices.GpuDevice(
            uuid=d.uuid,
            index=d.index,
            type=d.type,
            memory_mib=d.memory_mib,
            cores=d.cores,
            split_count=d.split_count,
            numa=d.numa,
            mode=d.mode,
            health=False,
        )
        return self

    def cordon(self, i: int) -> Self:
        self._cordoned.add(self._devices[i].uuid)
        return self

    def topo(self, t: topology.Topology) -> Self:
        self._topology = t
        return self

    def uniform_topo(self, level: topology.PcieLevel = topology.PcieLevel.SYSTEM, nvlinks: int = 0) -> Self:
        self._topology = topology.uniform(tuple(d.uuid for d in self._devices), level, nvlinks)
        return self

    def telemetry(self, i: int, **readings: float) -> Self:
        self._telemetry.append(nodes.CardTelemetry(uuid=self._devices[i].uuid, **readings))  # type: ignore[arg-type]
        return self

    def host(self, cpu_milli: int, memory_mib: int, *, cpu_used: int = 0, memory_used: int = 0) -> Self:
        self._cpu = (cpu_milli, memory_mib)
        self._cpu_used = (cpu_used, memory_used)
        return self

    def inventory(self) -> nodes.NodeInventory:
        return nodes.NodeInventory(
            name=self._name,
            devices=tuple(self._devices),
            topology=self._topology,
            cordoned=frozenset(self._cordoned),
            telemetry=tuple(self._telemetry),
            cpu_milli=self._cpu[0],
            memory_mib=self._cpu[1],
        )

    def state(self) -> nodes.NodeState:
        return nodes.NodeState(
            inventory=self.inventory(),
            usage=tuple(self._usage),
            cpu_used_milli=self._cpu_used[0],
            memory_used_mib=self._cpu_used[1],
        )


class PodBuilder:
    """Builds a PodRequest."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._namespace = "default"
        self._uid = ""
        self._init: list[requests.ContainerRequest | None] = []
        self._app: list[requests.ContainerRequest | None] = []
        self._sel: dict[str, object] = {}
        self._cpu = (0, 0)
        self._policies: tuple[str | None, str | None] = (None, None)

    @staticmethod
    def _req(count: int, memory: int, pct: int | None, cores: int) -> requests.ContainerRequest:
        return requests.ContainerRequest(
            count=count,
            memory_mib=memory,
            memory_percentage=requests.MEMORY_PERCENTAGE_UNSET if pct is None else pct,
            cores=cores,
        )

    def gpu(self, count: int = 1, *, memory: int = 0, pct: int | None = None, cores: int = 0) -> Self:
        """Add an app container asking ``count`` cards of ``memory`` MiB (or ``pct`` %) and ``cores``."""
        self._app.append(self._req(count, memory, pct, cores))
        return self

    def init_gpu(self, count: int = 1, *, memory: int = 0, pct: int | None = None, cores: int = 0) -> Self:
        self._init.append(self._req(count, memory, pct, cores))
        return self

    def no_gpu(self) -> Self:
        self._app.append(None)
        return self

    def ns(self, namespace: str) -> Self:
        self._namespace = namespace
        return self

    def uid(self, uid: str) -> Self:
        self._uid = uid
        return self

    def types(self, *use: str) -> Self:
        self._sel["use_types"] = use
        return self

    def nouse_types(self, *nouse: str) -> Self:
        self._sel["nouse_types"] = nouse
        return self

    def uuids(self, *use: str) -> Self:
        self._sel["use_uuids"] = use
        return self

    def nouse_uuids(self, *nouse: str) -> Self:
        self._sel["nouse_uuids"] = nouse
        return self

    def numa_bind(self) -> Self:
        self._sel["numa_bind"] = True
        return self

    def numa(self, node: int) -> Self:
        self._sel["numa_node"] = node
        return self

    def mode(self, mode: str) -> Self:
        self._sel["mode"] = mode
        return self

    def host(self, cpu_milli: int, memory_mib: int = 0) -> Self:
        self._cpu = (cpu_milli, memory_mib)
        return self

    def policies(self, node_policy: str | None, card_policy: str | None) -> Self:
        self._policies = (node_policy, card_policy)
        return self

    def obj(self) -> requests.PodRequest:
        return requests.PodRequest(
            namespace=self._namespace,
            name=self._name,
            uid=self._uid,
            containers=tuple(self._init) + tuple(self._app),
            init_count=len(self._init),
            selectors=requests.Selectors(**self._sel),  # type: ignore[arg-type]
            node_policy=self._policies[0],
            card_policy=self._policies[1],
            cpu_milli=self._cpu[0],
            memory_mib=self._cpu[1],
        )


def node(name: str = "n1") -> NodeBuilder:
    return NodeBuilder(name)


def pod(name: str = "p") -> PodBuilder:
    return PodBuilder(name)


def bridged(
    node_name: str,
    n: int,
    pairs: Iterable[tuple[int, int]],
    *,
    links: int = 4,
    gbps: float | None = None,
    pcie_gbps: float | None = 31.5,
    level: topology.PcieLevel = topology.PcieLevel.NODE,
    p2p_nvlink_only: bool = False,
) -> topology.Topology:
    """``node_name``'s n cards with ``links``-link NVLink bridges between ``pairs``, PCIe elsewhere.

    A bridged pair has ``gbps`` GB/s (``links`` x 25 by default), any other pair ``pcie_gbps``
    (None: no bandwidth matrix at all); every pair meets at PCIe ``level``; peer-to-peer works
    between every pair, or only across NVLink with ``p2p_nvlink_only``.
    """
    nv = [[0] * n for _ in range(n)]
    for a, b in pairs:
        nv[a][b] = nv[b][a] = links
    nvlink_gbps = links * 25.0 if gbps is None else gbps
    bandwidth = None
    if pcie_gbps is not None:
        bandwidth = tuple(
            tuple(0.0 if i == j else (nvlink_gbps if nv[i][j] else pcie_gbps) for j in range(n))
            for i in range(n)
        )
    return topology.Topology(
        uuids=tuple(uuid(node_name, i) for i in range(n)),
        nvlinks=tuple(tuple(r) for r in nv),
        pcie=tuple(
            tuple(topology.PcieLevel.INTERNAL if i == j else level for j in range(n)) for i in range(n)
        ),
        p2p=tuple(tuple(nv[i][j] > 0 if p2p_nvlink_only else i != j for j in range(n)) for i in range(n)),
        bandwidth=bandwidth,
    )


def alloc(
    node_name: str, *containers: tuple[tuple[str, int, int], ...], init_count: int = 0
) -> allocations.PodAllocation:
    """A PodAllocation from per-container ``(uuid, memory, cores)`` triples."""
    return allocations.PodAllocation(
        node=node_name,
        containers=tuple(
            tuple(allocations.DeviceGrant(u, m, c) for u, m, c in grants) for grants in containers
        ),
        init_count=init_count,
    )
