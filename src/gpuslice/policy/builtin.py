"""Imports every module that registers a built-in policy, so the registry sees them all."""
from gpuslice.policy import binpack  # noqa: F401
from gpuslice.policy import spread  # noqa: F401
from gpuslice.policy import paper  # noqa: F401
from gpuslice.policy import fragmentation  # noqa: F401
from gpuslice.policy import topology  # noqa: F401
from gpuslice.policy import balanced  # noqa: F401
from gpuslice.policy import lookahead  # noqa: F401
