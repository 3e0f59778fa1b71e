"""What the server install holds, checked on the wheel the Dockerfile installs.

The image itself is built by ``hack/image/build.sh`` and run on real nodes by the node tier
(``tests/node/test_image.py``: user, read-only root, no pip or compiler, every subcommand). This
test checks the package the Dockerfile's steps install, quickly and in detail, outside a container:
copy the build context the Dockerfile copies, build the wheel with the pinned setuptools
(``--no-build-isolation``), create a fresh venv without pip, install the wheel under ``--constraint
requirements.lock`` (the server install: no ``sim`` extra), then run the server commands from that
venv. It needs no control plane; it lives in the integration tier because it installs packages (pip
downloads on a cold cache, hence the long timeout).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]

CONTEXT = ("pyproject.toml", "README.md", "requirements.lock", "src")
"""The paths the Dockerfile copies from the build context (and .dockerignore lets through)."""

SIM_MESSAGE = "gpuslice simulate needs the sim extra: pip install 'gpuslice[sim]'"

SERVER_COMMANDS = ("serve", "agent", "render")
"""Subcommands the image must run; every other installed subcommand but ``simulate`` is checked too."""


@dataclass(frozen=True)
class Installed:
    """The fresh venv holding the wheel, as the image's /opt/gpuslice."""

    venv: Path
    wheel: Path
    workdir: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def gpuslice(self) -> Path:
        return self.venv / "bin" / "gpuslice"


def _env(home: Path | None) -> dict[str, str]:
    """Nothing pointing at the dev venv; with ``home``, the variables the image sets.

    pip keeps the real HOME: its cache there makes a warm install fast.
    """
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}}
    if home is not None:
        env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1", HOME=str(home))
    return env


def _run(
    argv: Sequence[str | Path], workdir: Path, *, image_env: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv],
        cwd=workdir,
        env=_env(workdir if image_env else None),
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )


def _explain(proc: subprocess.CompletedProcess[str]) -> str:
    return (
        f"$ {' '.join(proc.args)}\nexit {proc.returncode}\n"
        f"--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
    )


def _ok(
    argv: Sequence[str | Path], workdir: Path, *, image_env: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = _run(argv, workdir, image_env=image_env)
    assert proc.returncode == 0, _explain(proc)
    return proc


def _pip(*args: str | Path) -> list[str | Path]:
    """The dev venv's pip (the image's /opt/build), as ``python -m pip``."""
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return _normalize(match.group(0))


def _lock() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"requirements.lock: not an exact pin: {line!r}"
            pins[_normalize(name)] = version.strip()
    return pins


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("package")
    context = base / "context"
    context.mkdir()
    for name in CONTEXT:
        source = ROOT / name
        if source.is_dir():
            skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
            shutil.copytree(source, context / name, ignore=skip)
        else:
            shutil.copy2(source, context / name)
    wheels = base / "wheels"
    _ok(
        _pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", wheels, context),
        base,
        image_env=False,
    )
    (wheel,) = wheels.glob("gpuslice-*.whl")
    target = base / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(target)
    workdir = base / "work"
    workdir.mkdir()
    result = Installed(target, wheel, workdir)
    _ok(
        _pip("--python", result.python, "install", "--constraint", context / "requirements.lock", wheel),
        base,
        image_env=False,
    )
    yield result


def _probe(installed: Installed, code: str) -> object:
    """Run ``code`` (which prints one JSON value) in the installed venv and return the value."""
    proc = _ok([installed.python, "-c", code], installed.workdir)
    return json.loads(proc.stdout)


def test_the_dockerfile_copies_exactly_the_context_this_test_builds() -> None:
    copied: set[str] = set()
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            copied.update(w.rstrip("/").removeprefix("./") for w in words[1:-1])
    assert copied == set(CONTEXT)


def test_requirements_lock_pins_every_declared_dependency() -> None:
    declared: list[str] = []
    # gpuslice's, and the development harness's (gpuslice-dev, installed from the same lock)
    for pyproject in (ROOT / "pyproject.toml", ROOT / "dev" / "pyproject.toml"):
        project = tomllib.loads(pyproject.read_text())["project"]
        declared.extend(project["dependencies"])
        for extra in project.get("optional-dependencies", {}).values():
            declared.extend(extra)
    pins = _lock()
    missing = sorted({_requirement_name(r) for r in declared} - pins.keys() - {"gpuslice"})
    assert not missing, f"add exact pins to requirements.lock for {missing}"


def test_pip_check_passes(installed: Installed) -> None:
    _ok(_pip("--python", installed.python, "check"), installed.workdir, image_env=False)


def test_every_installed_distribution_is_pinned_by_the_lock(installed: Installed) -> None:
    code = (
        "import importlib.metadata as m, json;"
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    )
    found = _probe(installed, code)
    assert isinstance(found, dict)
    pins = _lock()
    unpinned = {
        name: version
        for name, version in found.items()
        if name != "gpuslice" and pins.get(_normalize(name)) != version
    }
    assert not unpinned, f"installed but not pinned at that version by requirements.lock: {unpinned}"


def test_the_server_install_has_no_sim_extra_and_no_build_tools(installed: Installed) -> None:
    code = (
        "import importlib.util, json;"
        "print(json.dumps([n for n in ('matplotlib', 'rich', 'pip', 'setuptools', 'wheel')"
        " if importlib.util.find_spec(n) is not None]))"
    )
    assert _probe(installed, code) == []
    for module in ("matplotlib", "rich"):
        proc = _run([installed.python, "-c", f"import {module}"], installed.workdir)
        assert proc.returncode == 1 and "ModuleNotFoundError" in proc.stderr, _explain(proc)


def test_the_package_is_imported_from_the_venv_with_its_data_files(installed: Installed) -> None:
    code = (
        "import gpuslice, json, pathlib;"
        "root = pathlib.Path(gpuslice.__file__).parent;"
        "print(json.dumps([str(root), (root / 'py.typed').is_file(),"
        " sorted(p.name for p in (root / 'data').glob('*.csv'))]))"
    )
    found = _probe(installed, code)
    assert isinstance(found, list)
    root, typed, csvs = found
    assert Path(root).is_relative_to(installed.venv), root
    assert typed is True
    assert csvs == sorted(p.name for p in (ROOT / "src" / "gpuslice" / "data").glob("*.csv"))
    assert csvs, "no data/*.csv in the source tree"


def test_the_install_is_precompiled_for_a_read_only_root(installed: Installed) -> None:
    code = (
        "import importlib.util, json, pathlib, gpuslice;"
        "root = pathlib.Path(gpuslice.__file__).parent;"
        "print(json.dumps(sorted(str(p.relative_to(root)) for p in root.rglob('*.py')"
        " if not pathlib.Path(importlib.util.cache_from_source(str(p))).is_file())))"
    )
    assert _probe(installed, code) == []


def test_every_server_subcommand_answers_help(installed: Installed) -> None:
    code = "import json; from gpuslice import cli; print(json.dumps(sorted(cli.SUBCOMMANDS)))"
    names = _probe(installed, code)
    assert isinstance(names, list)
    assert set(SERVER_COMMANDS) <= set(names), names
    failures = []
    for name in names:
        if name == "simulate":
            continue
        proc = _run([installed.gpuslice, name, "--help"], installed.workdir)
        if proc.returncode != 0 or "usage: gpuslice" not in proc.stdout:
            failures.append(_explain(proc))
    assert not failures, "\n\n".join(failures)


def test_render_scheduler_config(installed: Installed) -> None:
    url = "http://127.0.0.1:8888"
    proc = _ok([installed.gpuslice, "render", "scheduler-config", "--url", url], installed.workdir)
    assert "kind: KubeSchedulerConfiguration" in proc.stdout, _explain(proc)
    assert url in proc.stdout, _explain(proc)


def test_simulate_without_the_sim_extra_is_one_clear_line(installed: Installed) -> None:
    proc = _run([installed.gpuslice, "simulate", "--help"], installed.workdir)
    assert proc.returncode == 2, _explain(proc)
    assert proc.stderr == SIM_MESSAGE + "\n", _explain(proc)
    assert proc.stdout == "", _explain(proc)
