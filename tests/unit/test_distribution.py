"""The ``gpuslice`` wheel carries only what runs in a cluster; the harness is ``gpuslice-dev``.

The wheel is built here as the Dockerfile builds it (``pip wheel --no-deps --no-build-isolation``
with the venv's setuptools, no network), from a copy of the package's sources (so no ``build/``
directory is left in the checkout), in about a second. The development harness (control plane,
nodes, device plugin, chart and image helpers) is the separate ``gpuslice-dev`` distribution in
``dev/``, installed editable from the checkout; neither it nor what only it needs (gRPC, protobuf,
Playwright) may reach the wheel, its requirements or the ``gpuslice`` command.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from gpuslice import cli

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

HARNESS_ONLY = {"grpcio", "protobuf", "playwright", "grpcio-tools", "mypy-protobuf"}
"""Distributions only gpuslice-dev needs (its dependencies and its generator's)."""

DEV_SUBCOMMANDS = {"dev-cluster", "device-plugin"}


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    base = tmp_path_factory.mktemp("wheel")
    context = base / "context"
    context.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, context / name)
    shutil.copytree(ROOT / "src", context / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", "--no-deps"]
        + ["--no-build-isolation", "--no-index", "--wheel-dir", str(base / "wheels"), str(context)],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (path,) = (base / "wheels").glob("gpuslice-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_carries_no_development_harness(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    assert any(n.startswith("gpuslice/extender/") for n in names), names[:20]
    harness = [n for n in names if n.startswith(("gpuslice/devcluster/", "gpuslice_dev/", "gpuslice_dev-"))]
    assert harness == []
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    top = {n.split("/", 1)[0] for n in names}
    assert top == {"gpuslice", f"gpuslice-{version}.dist-info"}, top


def test_the_wheel_carries_the_data_files_the_servers_and_simulator_read(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert "gpuslice/extender/ops/ui.html" in names
    assert "gpuslice/py.typed" in names
    csvs = {f"gpuslice/data/{p.name}" for p in (ROOT / "src" / "gpuslice" / "data").glob("*.csv")}
    assert csvs, "no data/*.csv in the source tree"
    assert csvs <= names, sorted(csvs - names)


def test_the_wheel_requires_none_of_the_harness_dependencies(wheel: zipfile.ZipFile) -> None:
    (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    required = {
        _name(line.removeprefix("Requires-Dist:").strip())
        for line in wheel.read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist:")
    }
    assert "numpy" in required, required
    assert not required & HARNESS_ONLY, sorted(required & HARNESS_ONLY)
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert "gpuslice-dev" not in wheel.read(entry_points).decode()


def test_the_harness_is_its_own_distribution_with_those_dependencies() -> None:
    dev = tomllib.loads((ROOT / "dev" / "pyproject.toml").read_text())
    assert dev["project"]["name"] == "gpuslice-dev"
    assert dev["project"]["scripts"] == {"gpuslice-dev": "gpuslice_dev.cli:main"}
    declared = {_name(r) for r in dev["project"]["dependencies"]}
    for extra in dev["project"].get("optional-dependencies", {}).values():
        declared |= {_name(r) for r in extra}
    assert "gpuslice" in declared
    assert HARNESS_ONLY <= declared, sorted(HARNESS_ONLY - declared)


def test_the_gpuslice_command_has_no_development_subcommands() -> None:
    assert not DEV_SUBCOMMANDS & set(cli.SUBCOMMANDS)
    assert not [module for module, _ in cli.SUBCOMMANDS.values() if "devcluster" in module]
