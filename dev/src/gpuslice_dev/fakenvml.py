"""A fake ``libnvidia-ml.so.1`` for running the agent's real NVML backend on a machine without a GPU.

``hack/fake-nvml/fakenvml.c`` exports the NVML calls that ``agent/nvml.py`` makes through
nvidia-ml-py and answers them from a plain-text *shape file* named by ``$GPUSLICE_FAKE_NVML_SHAPE``
(the format is described at the top of the C file). This module writes shape files from the
recorded machines of the agent's ``fake:<shape>`` backend (``write_shape``) and compiles the
library once per source version (``build_library``)::

    from gpuslice.agent import fake

    library = fakenvml.build_library()
    fakenvml.write_shape(fake.shape("h100-8"), Path("h100-8.shape"))
    env = fakenvml.agent_env(library, Path("h100-8.shape"), os.environ)
    subprocess.run(["gpuslice", "agent", "--backend", "nvml", ...], env=env)

The import contracts keep ``devcluster`` from importing the agent, so shapes are taken by their
structure (``MachineShape``, which ``agent.fake.Shape`` satisfies).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from gpuslice_dev.paths import REPO_ROOT

SOURCE = REPO_ROOT / "hack" / "fake-nvml" / "fakenvml.c"
LIBRARY_NAME = "libnvidia-ml.so.1"
SHAPE_ENV = "GPUSLICE_FAKE_NVML_SHAPE"
"""The environment variable the library reads the shape file's path from (at ``nvmlInit``)."""
CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror")
HEADER = "gpuslice-fake-nvml 1"
EVENT_KINDS = ("xid", "double-bit-ecc", "single-bit-ecc", "gpu-unavailable", "fatal-poison")
"""Event kinds the library knows by name (the agent's ``backend.EventKind`` values)."""

_LINK_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch", 255: "unknown"}  # nvmlIntNvLinkDeviceType_t
_LEVELS = frozenset({0, 10, 20, 30, 40, 50})  # nvmlGpuTopologyLevel_t
_P2P_STATUSES = range(7)  # nvmlGpuP2PStatus_t
_TEXT_MAX = 95  # NVML_DEVICE_UUID_V2_BUFFER_SIZE / NAME_V2 less the NUL
_BUS_ID = re.compile(r"([0-9A-Fa-f]{4}|[0-9A-Fa-f]{8}):[0-9A-Fa-f]{2}:[01][0-9A-Fa-f]\.[0-7]")
_TOKEN = re.compile(r"[!-~]+")
_UINT32_MAX = 2**32 - 1


class FakeNvmlError(Exception):
    """The fake library could not be built (no compiler, a compile error, an unreadable source)."""


class GpuShape(Protocol):
    """One card of a recorded machine (``agent.backend.GpuRecord`` is one)."""

    @property
    def index(self) -> int:
        """NVML index."""

    @property
    def uuid(self) -> str:
        """NVML UUID."""

    @property
    def name(self) -> str:
        """Product name."""

    @property
    def memory_total_mib(self) -> int:
        """Framebuffer memory."""

    @property
    def pci_bus_id(self) -> str:
        """Bus id as NVML writes it."""

    @property
    def numa_node(self) -> int | None:
        """NUMA node near the card."""

    @property
    def mig_enabled(self) -> bool | None:
        """Current MIG mode."""

    @property
    def pcie_generation(self) -> int | None:
        """Current PCIe generation."""

    @property
    def pcie_width(self) -> int | None:
        """Current PCIe width."""

    @property
    def pcie_max_generation(self) -> int | None:
        """Highest PCIe generation."""

    @property
    def pcie_max_width(self) -> int | None:
        """Widest PCIe link."""

    @property
    def architecture(self) -> int | None:
        """``nvmlDeviceArchitecture_t``."""

    @property
    def mig_profiles(self) -> Sequence[MigProfileShape]:
        """GPU-instance profiles of a card in MIG mode (empty otherwise)."""


class MigProfileShape(Protocol):
    """One GPU-instance profile (``agent.backend.MigProfileRecord`` is one)."""

    @property
    def profile(self) -> int:
        """``NVML_GPU_INSTANCE_PROFILE_*`` index."""

    @property
    def name(self) -> str:
        """Profile name without the ``MIG`` prefix."""

    @property
    def slice_count(self) -> int:
        """Compute slices."""

    @property
    def multiprocessors(self) -> int:
        """SMs of one instance."""

    @property
    def memory_mib(self) -> int:
        """Memory of one instance."""

    @property
    def placements(self) -> Sequence[tuple[int, int]]:
        """``(start, size)`` per possible placement."""


class LinkShape(Protocol):
    """One active NVLink (``agent.backend.NvLinkRecord`` is one)."""

    @property
    def link(self) -> int:
        """Link number."""

    @property
    def remote_bus_id(self) -> str:
        """Bus id of the far end."""

    @property
    def remote_type(self) -> int:
        """``nvmlIntNvLinkDeviceType_t`` of the far end."""

    @property
    def version(self) -> int | None:
        """``nvmlNvlinkVersion_t``."""


class TelemetryShape(Protocol):
    """Readings of one card (``agent.backend.TelemetryRecord`` is one)."""

    @property
    def index(self) -> int:
        """NVML index."""

    @property
    def temperature_c(self) -> float | None:
        """GPU temperature."""

    @property
    def power_draw_w(self) -> float | None:
        """Power draw."""

    @property
    def power_limit_w(self) -> float | None:
        """Enforced power limit."""

    @property
    def utilization_pct(self) -> float | None:
        """GPU utilisation."""

    @property
    def memory_used_mib(self) -> int | None:
        """Memory in use."""


class MachineShape(Protocol):
    """A recorded machine, as the agent's ``fake:<shape>`` backend serves it (``agent.fake.Shape``)."""

    @property
    def name(self) -> str:
        """The shape's name."""

    @property
    def gpus(self) -> Sequence[GpuShape]:
        """Cards by index."""

    @property
    def nvlinks(self) -> Sequence[Sequence[LinkShape]]:
        """Active links of each card."""

    @property
    def levels(self) -> Sequence[Sequence[int | None]]:
        """Common-ancestor level of each pair (None: unsupported)."""

    @property
    def p2p(self) -> Sequence[Sequence[int | None]]:
        """P2P read/write status of each pair (None: unsupported)."""

    @property
    def telemetry(self) -> Sequence[TelemetryShape]:
        """Readings per card."""


@dataclasses.dataclass(frozen=True)
class ScheduledEvent:
    """An NVML event the library delivers to a registered event set.

    Attributes:
        after_s: seconds after the agent created its event set.
        index: the card (None: no card named, which the agent applies to every card).
        kind: one of ``EVENT_KINDS``.
        data: the XID for ``xid`` events, else 0.
    """

    after_s: float
    index: int | None
    kind: str
    data: int = 0


def xid(index: int | None, code: int, after_s: float = 0.0) -> ScheduledEvent:
    """A critical-XID event on card ``index``."""
    return ScheduledEvent(after_s=after_s, index=index, kind="xid", data=code)


def _opt(value: int | None) -> str:
    return "-" if value is None else str(value)


def _whole(value: float | None, what: str, top: int) -> str:
    """An NVML integer reading that must come back as the same float."""
    if value is None:
        return "-"
    if value != int(value) or not 0 <= value <= top:
        raise ValueError(f"{what} {value!r}: NVML reports whole numbers from 0 to {top}")
    return str(int(value))


def _milliwatts(value: float | None, what: str) -> str:
    """Watts as NVML's milliwatts; the agent divides by 1000, which must give ``value`` back."""
    if value is None:
        return "-"
    mw = round(value * 1000)
    if mw / 1000.0 != value or not 0 <= mw <= _UINT32_MAX:
        raise ValueError(f"{what} {value!r} W is not a whole number of milliwatts NVML can report")
    return str(mw)


def _token(value: str, what: str) -> str:
    if not _TOKEN.fullmatch(value) or len(value) > _TEXT_MAX:
        raise ValueError(f"{what} {value!r}: 1 to {_TEXT_MAX} printable ASCII characters without spaces")
    return value


def _bus(value: str, what: str) -> str:
    if not _BUS_ID.fullmatch(value):
        raise ValueError(f"{what} {value!r} is not a PCI bus id DOMAIN:BB:DD.F")
    return value


def _gpu_lines(g: GpuShape, t: TelemetryShape, links: Sequence[LinkShape]) -> list[str]:
    where = f"GPU {g.index}"
    name = g.name
    if not name or name != name.strip() or len(name) > _TEXT_MAX or not all(" " <= c <= "~" for c in name):
        raise ValueError(f"{where}: name {name!r} must be 1 to {_TEXT_MAX} printable ASCII characters")
    if t.memory_used_mib is None:
        raise ValueError(f"{where}: NVML reports memory in use with the total; the shape must give it")
    if not 0 <= t.memory_used_mib <= g.memory_total_mib:
        raise ValueError(f"{where}: {t.memory_used_mib} MiB in use of {g.memory_total_mib} MiB")
    mig = None if g.mig_enabled is None else int(g.mig_enabled)
    pcie = (g.pcie_generation, g.pcie_width, g.pcie_max_generation, g.pcie_max_width)
    util = _whole(t.utilization_pct, f"{where}: utilisation", 100)
    lines = [
        f"device {g.index}",
        f"uuid {_token(g.uuid, f'{where}: uuid')}",
        f"name {name}",
        f"bus {_bus(g.pci_bus_id, f'{where}: bus id')}",
        f"memory {g.memory_total_mib} {t.memory_used_mib}",
        f"numa {_opt(g.numa_node)}",
        f"mig {_opt(mig)}",
        "pcie " + " ".join(_opt(v) for v in pcie),
        f"arch {_opt(g.architecture)}",
        f"temperature {_whole(t.temperature_c, f'{where}: temperature', 1000)}",
        f"power {_milliwatts(t.power_draw_w, f'{where}: power draw')}",
        f"power-limit {_milliwatts(t.power_limit_w, f'{where}: power limit')}",
        "utilization -" if util == "-" else f"utilization {util} 0",
    ]
    seen: set[int] = set()
    for link in links:
        if link.link in seen or not 0 <= link.link < 36:
            raise ValueError(f"{where}: NVLink {link.link} repeated or outside 0..35")
        if link.remote_type not in _LINK_TYPES:
            raise ValueError(f"{where}: NVLink {link.link} remote type {link.remote_type} unknown to NVML")
        seen.add(link.link)
        remote = _bus(link.remote_bus_id, f"{where}: NVLink {link.link} remote bus id")
        lines.append(f"nvlink {link.link} {remote} {_LINK_TYPES[link.remote_type]} {_opt(link.version)}")
    lines.extend(_mig_lines(where, g.mig_profiles))
    return lines


_GI_PROFILE_IDS = {0: 19, 9: 15, 1: 14, 2: 9, 3: 5, 4: 0}
"""A GPU-instance profile's id as an A100 reports it, by ``NVML_GPU_INSTANCE_PROFILE_*`` index; the
id (not the index) is what ``nvmlDeviceGetGpuInstancePossiblePlacements`` takes."""


def _mig_lines(where: str, profiles: Sequence[MigProfileShape]) -> list[str]:
    """``mig-profile`` lines; the library answers the profile and placement calls from them."""
    out: list[str] = []
    for p in profiles:
        sizes = {size for _, size in p.placements}
        if not p.placements or len(sizes) != 1 or not all(0 <= s <= 7 for s, _ in p.placements):
            raise ValueError(
                f"{where}: MIG profile {p.name!r}: placements {p.placements} are not one size at 0..7"
            )
        starts = ",".join(str(s) for s, _ in p.placements)
        pid = _GI_PROFILE_IDS.get(p.profile, 32 + p.profile)
        name = _token(p.name, f"{where}: MIG profile name")
        out.append(
            f"mig-profile {p.profile} {pid} {name} {p.slice_count} {p.multiprocessors} {p.memory_mib} "
            f"{sizes.pop()}@{starts}"
        )
    return out


def _pair_value(value: int | None, allowed: Iterable[int], what: str) -> str:
    if value is not None and value not in allowed:
        raise ValueError(f"{what} {value} is not a value NVML reports")
    return _opt(value)


def _event_line(e: ScheduledEvent, count: int) -> str:
    if e.kind not in EVENT_KINDS:
        raise ValueError(f"event kind {e.kind!r}; known: {', '.join(EVENT_KINDS)}")
    if e.index is not None and not 0 <= e.index < count:
        raise ValueError(f"event on GPU {e.index}, which the shape does not have")
    if e.after_s < 0 or e.data < 0:
        raise ValueError(f"event {e}: negative delay or data")
    return f"event {_opt(e.index)} {e.kind} {e.data} {round(e.after_s * 1000)}"


def shape_text(shape: MachineShape, events: Iterable[ScheduledEvent] = ()) -> str:
    """The shape file for a recorded machine, with events to deliver.

    Raises:
        ValueError: the shape holds something NVML cannot report (a fractional temperature, power
            that is not whole milliwatts, no memory in use, a malformed bus id, ...), so the
            library could not reproduce it.
    """
    gpus = list(shape.gpus)
    if [g.index for g in gpus] != list(range(len(gpus))):
        raise ValueError(f"shape {shape.name!r}: GPU indices must be 0, 1, ... in order")
    if len(shape.nvlinks) != len(gpus):
        raise ValueError(f"shape {shape.name!r}: {len(shape.nvlinks)} NVLink lists for {len(gpus)} GPUs")
    readings = {t.index: t for t in shape.telemetry}
    tag = _token(f"fake-{shape.name}", "shape name")
    lines = [
        f"# the agent's fake:{shape.name} shape, for hack/fake-nvml/fakenvml.c",
        HEADER,
        f"driver {tag}",
        f"nvml {tag}",
    ]
    for g in gpus:
        if g.index not in readings:
            raise ValueError(f"shape {shape.name!r}: no telemetry for GPU {g.index}")
        lines += _gpu_lines(g, readings[g.index], shape.nvlinks[g.index])
    for a in range(len(gpus)):
        for b in range(len(gpus)):
            if a == b:
                continue
            level = _pair_value(shape.levels[a][b], _LEVELS, f"GPUs {a},{b}: level")
            p2p = _pair_value(shape.p2p[a][b], _P2P_STATUSES, f"GPUs {a},{b}: P2P status")
            lines.append(f"pair {a} {b} {level} {p2p} {p2p}")
    lines += [_event_line(e, len(gpus)) for e in events]
    return "\n".join(lines) + "\n"


def write_shape(shape: MachineShape, path: Path, events: Iterable[ScheduledEvent] = ()) -> Path:
    """Write ``shape_text(shape, events)`` to ``path``; returns ``path``.

    Raises:
        ValueError: see ``shape_text``.
    """
    path.write_text(shape_text(shape, events), encoding="ascii")
    return path


def cache_root() -> Path:
    """``$GPUSLICE_CACHE_DIR/fake-nvml`` (default ``~/.cache/gpuslice/fake-nvml``)."""
    root = os.environ.get("GPUSLICE_CACHE_DIR") or str(Path.home() / ".cache" / "gpuslice")
    return Path(root) / "fake-nvml"


def build_library(dest_dir: Path | None = None, *, source: Path = SOURCE, compiler: str = "gcc") -> Path:
    """Compile the fake library unless this source is already built; returns its path.

    The library lands in ``<dest_dir>/<hash>/libnvidia-ml.so.1``, the hash covering the source and
    the flags, moved into place by an atomic rename (concurrent builds cannot leave a torn file).

    Args:
        dest_dir: the cache directory; default ``cache_root()``.
        source: the C file.
        compiler: the C compiler, looked up on ``PATH``.

    Raises:
        FakeNvmlError: the source is unreadable, the compiler is missing, or compiling failed.
    """
    try:
        code = source.read_bytes()
    except OSError as e:
        raise FakeNvmlError(f"cannot read the fake NVML source {source}: {e}") from e
    digest = hashlib.sha256(b"\0".join([code, *(flag.encode() for flag in CFLAGS)])).hexdigest()[:16]
    target = (dest_dir if dest_dir is not None else cache_root()) / digest / LIBRARY_NAME
    if target.is_file():
        # Readable by every user, as a driver's library is: containers that mount it (the node
        # agent runs as 65532) must be able to map it. Older caches were made 0711.
        target.chmod(0o755)
        return target
    cc = shutil.which(compiler)
    if cc is None:
        raise FakeNvmlError(
            f"{compiler} not found on PATH: the fake NVML library is C, compiled on first use "
            "(install a C compiler, e.g. apt-get install gcc)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".libnvidia-ml.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run(  # noqa: S603 - a compiler found on PATH, fixed flags
            [cc, *CFLAGS, "-o", tmp, str(source)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise FakeNvmlError(
                f"{compiler} failed on {source} (exit status {proc.returncode}):\n{proc.stderr.strip()}"
            )
        os.chmod(tmp, 0o755)  # mkstemp made it 0600
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return target


def agent_env(library: Path, shape_file: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: empty) with the library first on ``LD_LIBRARY_PATH`` and the shape file set.

    The dynamic loader reads ``LD_LIBRARY_PATH`` when a process starts, so this is for a new
    process (``gpuslice agent --backend nvml``), not the current one.
    """
    env = dict(base or {})
    paths = [str(library.parent), *filter(None, env.get("LD_LIBRARY_PATH", "").split(":"))]
    env["LD_LIBRARY_PATH"] = ":".join(paths)
    env[SHAPE_ENV] = str(shape_file)
    return env
