"""The ``gpuslice-dev`` command: the development subcommands, dispatched lazily like ``gpuslice``'s."""

from __future__ import annotations

import importlib
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslice_dev import cli, paths

pytestmark = pytest.mark.unit


def test_the_subcommands_are_the_development_ones() -> None:
    assert set(cli.SUBCOMMANDS) == {"dev-cluster", "device-plugin"}
    for module_name, _ in cli.SUBCOMMANDS.values():
        module = importlib.import_module(module_name)
        assert callable(module.add_arguments) and callable(module.main), module_name


@pytest.mark.parametrize("name", sorted(cli.SUBCOMMANDS))
def test_each_subcommand_answers_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([name, "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: gpuslice-dev {name}")


def test_python_m_gpuslice_dev_lists_both_and_imports_neither() -> None:
    code = (
        "import runpy, sys; sys.argv = ['gpuslice-dev', '--help'];\n"
        "try:\n    runpy.run_module('gpuslice_dev', run_name='__main__')\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "loaded = [m for m in ('gpuslice_dev.devcluster', 'gpuslice_dev.deviceplugin', 'grpc')"
        " if m in sys.modules]\n"
        "assert not loaded, loaded"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "dev-cluster" in proc.stdout and "device-plugin" in proc.stdout, proc.stdout


def test_the_repository_root_is_this_checkout() -> None:
    assert (paths.REPO_ROOT / "hack" / "control-plane" / "build.sh").is_file()
    assert Path(paths.__file__).resolve() == paths.REPO_ROOT / "dev" / "src" / "gpuslice_dev" / "paths.py"


def test_outside_a_checkout_the_root_lookup_says_so(tmp_path: Path) -> None:
    copy = tmp_path / "site-packages" / "lib" / "gpuslice_dev" / "paths.py"
    copy.parent.mkdir(parents=True)
    shutil.copy2(paths.__file__, copy)
    with pytest.raises(RuntimeError, match=r"runs from a gpuslice checkout .* has no hack/ directory") as err:
        runpy.run_path(str(copy))
    assert type(err.value).__name__ == paths.CheckoutNotFoundError.__name__
