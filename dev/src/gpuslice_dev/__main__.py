"""``python -m gpuslice_dev``: the ``gpuslice-dev`` command."""

from gpuslice_dev import cli

raise SystemExit(cli.main())
