"""``python -m gpuslice_dev.deviceplugin``: run the device plugin."""

from __future__ import annotations

import argparse
import sys

from gpuslice_dev.deviceplugin import cli


def main() -> int:
    """Parse ``sys.argv`` and run."""
    parser = argparse.ArgumentParser(
        prog="python -m gpuslice_dev.deviceplugin",
        description="A HAMi-compatible NVIDIA device plugin on kubelet's device-plugin API (v1beta1).",
    )
    cli.add_arguments(parser)
    return cli.main(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
