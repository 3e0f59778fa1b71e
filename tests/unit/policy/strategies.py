"""Hypothesis strategies for nodes and pods (shared by the policy and cache property tests)."""

from __future__ import annotations

from hypothesis import strategies as st

from gpuslice.model import devices, nodes, requests

MEMS = (1000, 16000, 24000, 81920)


@st.composite
def node_states(draw: st.DrawFn, name: str = "n", max_cards: int = 8, host: bool = True) -> nodes.NodeState:
    n = draw(st.integers(0, max_cards))
    mem = draw(st.sampled_from(MEMS))
    cores = draw(st.sampled_from((100, 100, 200)))
    split = draw(st.integers(1, 4))
    devs = []
    usage = []
    cordoned = set()
    for i in range(n):
        u = f"GPU-{name}-{i}"
        devs.append(
            devices.GpuDevice(
                uuid=u,
                index=i,
                type=draw(st.sampled_from(("NVIDIA A100", "NVIDIA V100"))),
                memory_mib=mem,
                cores=cores,
                split_count=split,
                numa=draw(st.integers(0, 1)),
                health=draw(st.booleans()) or draw(st.booleans()),
                mode=draw(
                    st.sampled_from((devices.MODE_HAMI_CORE, devices.MODE_HAMI_CORE, devices.MODE_MPS))
                ),
            )
        )
        if draw(st.integers(0, 5)) == 0:
            cordoned.add(u)
        slots = draw(st.integers(0, split))
        usage.append(
            nodes.CardUsage(
                slots=slots,
                memory_mib=0 if slots == 0 else draw(st.integers(0, mem)),
                cores=0 if slots == 0 else draw(st.sampled_from((0, 10, 50, cores))),
            )
        )
    cpu = draw(st.sampled_from((0, 8000))) if host else 0
    hmem = draw(st.sampled_from((0, 32000))) if host else 0
    return nodes.NodeState(
        inventory=nodes.NodeInventory(
            name=name, devices=tuple(devs), cordoned=frozenset(cordoned), cpu_milli=cpu, memory_mib=hmem
        ),
        usage=tuple(usage),
        cpu_used_milli=draw(st.integers(0, cpu)),
        memory_used_mib=draw(st.integers(0, hmem)),
    )


@st.composite
def container_requests(draw: st.DrawFn, max_count: int = 4) -> requests.ContainerRequest:
    count = draw(st.integers(1, max_count))
    if draw(st.booleans()):
        return requests.ContainerRequest(
            count=count,
            memory_mib=draw(st.sampled_from((1, 500, 4000, 8000, 20000))),
            cores=draw(st.sampled_from((0, 10, 30, 100, 150))),
        )
    return requests.ContainerRequest(
        count=count,
        memory_percentage=draw(st.sampled_from((10, 25, 50, 100))),
        cores=draw(st.sampled_from((0, 30, 100))),
    )


FAST_SELECTORS = (
    requests.NO_SELECTORS,
    requests.Selectors(use_types=("a100",)),
    requests.Selectors(nouse_types=("A100",)),
    requests.Selectors(use_types=("h100",)),
    requests.Selectors(mode="mps"),
    requests.Selectors(mode="hami-core", numa_node=1),
    requests.Selectors(numa_node=0),
)


@st.composite
def simple_pods(draw: st.DrawFn) -> requests.PodRequest:
    """Pods of the vectorised fast path: one GPU container; type, mode and NUMA-hint selectors."""
    return requests.PodRequest(
        name="p",
        containers=(draw(st.none()), draw(container_requests())),
        cpu_milli=draw(st.sampled_from((0, 1000, 6000))),
        memory_mib=draw(st.sampled_from((0, 1000, 30000))),
        selectors=draw(st.sampled_from(FAST_SELECTORS)),
    )


@st.composite
def pods(draw: st.DrawFn) -> requests.PodRequest:
    """Any pod: init and app containers, some without GPUs, optional selectors."""
    init = draw(st.lists(st.one_of(st.none(), container_requests(2)), max_size=2))
    app = draw(st.lists(st.one_of(st.none(), container_requests(3)), min_size=1, max_size=3))
    sel = draw(
        st.sampled_from(
            (
                requests.NO_SELECTORS,
                requests.Selectors(use_types=("a100",)),
                requests.Selectors(numa_bind=True),
                requests.Selectors(numa_node=1),
            )
        )
    )
    return requests.PodRequest(
        name="p", containers=tuple(init) + tuple(app), init_count=len(init), selectors=sel
    )
