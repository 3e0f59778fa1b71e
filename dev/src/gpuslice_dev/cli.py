"""The ``gpuslice-dev`` command: ``gpuslice.cli.dispatch`` imports each subcommand's module lazily.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``main(args) -> int``;
only the module of the subcommand actually run is imported, so ``gpuslice-dev --help`` loads neither
the control plane nor the device plugin's gRPC stack.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuslice import cli

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
    return cli.dispatch(
        "gpuslice-dev", "gpuslice's development harness (run from a checkout).", SUBCOMMANDS, argv
    )
