"""Where the repository checkout is: the one place the harness finds ``hack/`` and ``charts/``.

``gpuslice-dev`` is only ever installed editable from a checkout (``make venv`` runs
``pip install -e dev``), never as a wheel: it builds the control plane, the node binaries and the
images with the scripts under ``hack/``, installs ``charts/gpuslice`` and reads the repository's
``Dockerfile`` and ``pyproject.toml``. So its files stay in the checkout, at
``dev/src/gpuslice_dev/``, and the repository root is ``parents[3]`` of this file
(``paths.py`` -> ``gpuslice_dev`` -> ``src`` -> ``dev`` -> the root).
"""

from __future__ import annotations

from pathlib import Path


class CheckoutNotFoundError(RuntimeError):
    """gpuslice_dev runs outside a gpuslice checkout (no ``hack/`` where the repository root should be)."""


def _repo_root() -> Path:
    here = Path(__file__).resolve()
    root = here.parents[3]
    if not (root / "hack").is_dir():
        raise CheckoutNotFoundError(
            f"gpuslice_dev runs from a gpuslice checkout (pip install -e dev), but {root} has no hack/ "
            f"directory: {here.parent} is not a checkout's dev/src/gpuslice_dev"
        )
    return root


REPO_ROOT = _repo_root()
"""The repository root of the checkout this package is installed from (module docstring)."""
