"""gpuslice: a Kubernetes GPU scheduler extender with HAMi-compatible fractional GPU placement.

Layers (enforced by import-linter, see pyproject.toml):
``model`` (frozen types) -> ``codec`` / ``policy`` (pure) -> ``cache`` (the only mutable state)
-> ``kube`` (all API I/O) -> ``extender``, ``agent``, ``sim`` -> ``cli``. What runs in a cluster
only: the development harness is the separate ``gpuslice_dev`` package (``dev/``), never imported here.
"""

__version__ = "0.1.0"
