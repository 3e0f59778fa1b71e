"""The ``gpuslice-dev`` command: a small dispatcher that imports each subcommand's module lazily.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``main(args) -> int``;
only the module of the subcommand actually run is imported, so ``gpuslice-dev --help`` loads neither
the control plane nor the device plugin's gRPC stack.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "dev-cluster": (
        "gpuslice_dev.devcluster",
        "local control plane + kube-scheduler + gpuslice + fake GPU nodes",
    ),
    "device-plugin": (
        "gpuslice_dev.deviceplugin.cli",
        "HAMi-compatible NVIDIA device plugin on kubelet's device-plugin API (v1beta1)",
    ),
}
"""Subcommand name -> (module, one-line help). Other development tools add their line here."""


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run one subcommand; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="gpuslice-dev", description="gpuslice's development harness (run from a checkout)."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    args, rest = parser.parse_known_args(argv)
    module_name, text = SUBCOMMANDS[args.command]
    module = importlib.import_module(module_name)
    full = argparse.ArgumentParser(prog=f"gpuslice-dev {args.command}", description=text)
    module.add_arguments(full)
    code: int = module.main(full.parse_args(rest))
    return code
