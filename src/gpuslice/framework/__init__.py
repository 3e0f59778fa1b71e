"""The pure scheduling framework: policy registry, profile, per-pod cycle, and the verbs' pure halves.

No I/O, no clock, no HTTP (the import contracts in ``pyproject.toml`` hold it to that); the
extender, the simulator and ``gpuslice explain`` are adapters around it (docs/architecture.md).
"""
