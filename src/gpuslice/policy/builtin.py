"""Imports every module that registers a built-in policy, so the registry sees them all."""

from gpuslice.policy import (
    balanced,  # noqa: F401
    fill,  # noqa: F401
    fragmentation,  # noqa: F401
    lookahead,  # noqa: F401
    paper,  # noqa: F401
    topology,  # noqa: F401
)
