"""The simulator's optional dependencies: ``pip install 'gpuslice[sim]'`` adds rich and matplotlib.

``pip install gpuslice`` is the server install the container image holds (extender, node agent,
webhook); the simulator's progress bar, tables and plot need the ``sim`` extra on top of it. A command
that needs the extra calls :func:`require` before importing anything from it, so a server-only
install answers with one line instead of a traceback.
"""

from __future__ import annotations

import importlib.util
import sys

MODULES = ("rich", "matplotlib")
"""The top-level modules the ``sim`` extra in pyproject.toml installs."""

EXIT_MISSING = 2
"""Exit status when the extra is missing (the same as a usage error)."""


def missing() -> list[str]:
    """The modules of the ``sim`` extra that cannot be imported here."""
    return [name for name in MODULES if importlib.util.find_spec(name) is None]


def message(command: str) -> str:
    """The one line printed when ``command`` runs without the extra."""
    return f"{command} needs the sim extra: pip install 'gpuslice[sim]'"


def require(command: str) -> None:
    """Return if the ``sim`` extra is installed; otherwise print :func:`message` and exit 2."""
    if missing():
        print(message(command), file=sys.stderr)
        raise SystemExit(EXIT_MISSING)
