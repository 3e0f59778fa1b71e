"""``python -m gpuslice``: the command-line entry point."""

from gpuslice import cli

raise SystemExit(cli.main())
