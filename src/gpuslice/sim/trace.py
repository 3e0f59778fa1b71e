"""The Alibaba ``openb`` trace (cluster-trace-gpu-v2023) as ordinary gpuslice objects.

Nodes become ``NodeInventory`` with one ``GpuDevice`` per GPU (100 cores, the artifact's memory per
model, room for many sharing tasks). A pod's per-GPU share ``gpu_milli`` = d becomes a container
asking ``d / 10`` percent of the cores and of the memory of each card, so shares add up on a card
exactly as milli-GPU do; a whole GPU (d = 1000) is an exclusive 100-core request.
"""

from __future__ import annotations

import csv
import dataclasses
from importlib import resources
from pathlib import Path

from gpuslice.model import devices, nodes, requests

MODEL_MEMORY_MIB = {
    "T4": 15109,
    "V100M16": 16160,
    "P100": 16280,
    "G2": 20000,
    "A10": 22731,
    "G3": 30000,
    "V100M32": 32510,
}
"""GPU memory per model as in the FGD artifact (fgd-experiment.md section 2)."""
DEFAULT_MEMORY_MIB = 16384
"""Memory assumed for a model the table does not know."""
SPLIT_COUNT = 1000
"""Tasks a simulated card may hold (shares, not slots, are the limit)."""
FULL = 1000

DEFAULT_NODES = "openb_node_list_gpu_node.csv"
DEFAULT_PODS = "openb_pod_list_default.csv"


class TraceError(ValueError):
    """A trace file that cannot be read as an openb node or pod list."""


@dataclasses.dataclass(frozen=True, slots=True)
class TracePod:
    """One pod row of the trace, with its gpuslice request.

    Attributes:
        name: pod name (the sort key of the workload).
        cpu_milli: host CPU (0 in the file means 100).
        memory_mib: host memory.
        count: GPUs n.
        share: per-GPU share d in milli-GPU, clipped to 0..1000 and rounded up to a multiple of 10.
        types: allowed GPU models (empty = any).
        creation: creation time in seconds, or None when the file has no times.
        deletion: deletion time in seconds, or None.
        request: the pod as the policies see it.
        job: the pod's job from the optional ``job`` column ('' for none; ``gangsim``'s trace gangs).
    """

    name: str
    cpu_milli: int
    memory_mib: int
    count: int
    share: int
    types: tuple[str, ...]
    creation: float | None
    deletion: float | None
    request: requests.PodRequest
    job: str = ""

    @property
    def gpu_milli(self) -> int:
        """N * d."""
        return self.count * self.share


def data_path(name: str) -> Path:
    """Path of a file bundled in ``gpuslice/data``."""
    return Path(str(resources.files("gpuslice") / "data" / name))


def _rows(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in required if c not in (reader.fieldnames or ())]
            if missing:
                raise TraceError(f"{path}: missing columns {', '.join(missing)}")
            return list(reader)
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from exc


def _int(row: dict[str, str], key: str, path: Path) -> int:
    try:
        return int(float(row.get(key) or 0))
    except ValueError:
        raise TraceError(f"{path}: bad {key} {row.get(key)!r}") from None


def _time(row: dict[str, str], key: str) -> float | None:
    raw = (row.get(key) or "").strip()
    return float(raw) if raw else None


def node_inventory(name: str, cpu_milli: int, memory_mib: int, gpus: int, model: str) -> nodes.NodeInventory:
    """A simulated node: ``gpus`` cards of ``model``."""
    mem = MODEL_MEMORY_MIB.get(model, DEFAULT_MEMORY_MIB)
    cards = tuple(
        devices.GpuDevice(
            uuid=f"{name}-gpu{i}",
            index=i,
            type=model,
            memory_mib=mem,
            cores=devices.FULL_CORES,
            split_count=SPLIT_COUNT,
        )
        for i in range(gpus)
    )
    return nodes.NodeInventory(name=name, devices=cards, cpu_milli=cpu_milli, memory_mib=memory_mib)


def load_nodes(path: Path) -> list[nodes.NodeInventory]:
    """Read ``sn,cpu_milli,memory_mib,gpu,model``, in file order."""
    out = []
    for row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu")):
        out.append(
            node_inventory(
                row["sn"],
                _int(row, "cpu_milli", path),
                _int(row, "memory_mib", path),
                _int(row, "gpu", path),
                (row.get("model") or "").strip(),
            )
        )
    return out


def pod_request(
    name: str, cpu_milli: int, memory_mib: int, count: int, share: int, types: tuple[str, ...]
) -> requests.PodRequest:
    """The gpuslice request of one trace pod (see the module docstring)."""
    if count > 0 and share > 0:
        pct = share * devices.FULL_CORES // FULL
        container: requests.ContainerRequest | None = requests.ContainerRequest(
            count=count, memory_percentage=pct, cores=pct
        )
    else:
        container = None
    return requests.PodRequest(
        name=name,
        containers=(container,),
        selectors=requests.Selectors(use_types=types) if types else requests.NO_SELECTORS,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
    )


def make_pod(
    name: str,
    cpu_milli: int,
    memory_mib: int,
    count: int,
    gpu_milli: int,
    spec: str = "",
    creation: float | None = None,
    deletion: float | None = None,
    job: str = "",
) -> TracePod:
    """A trace pod from raw column values (applies the trace's conventions)."""
    cpu = cpu_milli if cpu_milli > 0 else 100
    share = min(max(gpu_milli, 0), FULL)
    share = -(-share // 10) * 10
    if count <= 0 or share == 0:
        count, share = 0, 0
    types = tuple(t for t in (s.strip() for s in spec.split("|")) if t)
    types = tuple(dict.fromkeys(types))
    req = pod_request(name, cpu, memory_mib, count, share, types)
    return TracePod(name, cpu, memory_mib, count, share, types, creation, deletion, req, job.strip())


def load_pods(path: Path) -> list[TracePod]:
    """Read an openb pod list (the 5-column variant too; an optional ``job`` column), in file order."""
    out = []
    for row in _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")):
        out.append(
            make_pod(
                row["name"],
                _int(row, "cpu_milli", path),
                _int(row, "memory_mib", path),
                _int(row, "num_gpu", path),
                _int(row, "gpu_milli", path),
                row.get("gpu_spec") or "",
                _time(row, "creation_time"),
                _time(row, "deletion_time"),
                row.get("job") or "",
            )
        )
    return out
