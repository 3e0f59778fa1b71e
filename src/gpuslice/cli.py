"""The ``gpuslice`` command: a small dispatcher that imports each subcommand's module lazily.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``main(args) -> int``;
only the module of the subcommand actually run is imported, so ``gpuslice simulate`` never loads the
extender's web stack and vice versa.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping, Sequence

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("gpuslice.sim.cli", "replay the Alibaba GPU trace through the placement policies"),
    "agent": ("gpuslice.agent.cli", "node agent: publish GPU topology, health and telemetry from NVML"),
    "serve": ("gpuslice.extender.serve", "run the scheduler extender HTTP service kube-scheduler calls"),
    "render": ("gpuslice.extender.render", "print generated configuration (scheduler-config)"),
    "webhook": ("gpuslice.webhook.serve", "admission webhook: default and validate GPU pods"),
    "explain": ("gpuslice.explaincli", "why a GPU pod fits or not, per node and per card"),
    "shadow": ("gpuslice.sim.shadowreport", "shadow mode: re-play the extender's shadow record (report)"),
}
"""Subcommand name -> (module, one-line help). Other tools add their line here.

What runs in a cluster only: the development harness (``dev-cluster``, ``device-plugin``) is the
``gpuslice-dev`` command of the ``gpuslice-dev`` distribution (``dev/``), which this package never
imports.
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run one subcommand; returns the exit status."""
    return dispatch("gpuslice", "Kubernetes GPU scheduler extender.", SUBCOMMANDS, argv)


def dispatch(
    prog: str, description: str, subcommands: Mapping[str, tuple[str, str]], argv: Sequence[str] | None
) -> int:
    """Run the subcommand ``argv`` names, importing only its module (``gpuslice-dev`` uses it too)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, text) in subcommands.items():
        sub.add_parser(name, help=text, add_help=False)
    args, rest = parser.parse_known_args(argv)
    module_name, text = subcommands[args.command]
    module = importlib.import_module(module_name)
    full = argparse.ArgumentParser(prog=f"{prog} {args.command}", description=text)
    module.add_arguments(full)
    code: int = module.main(full.parse_args(rest))
    return code
