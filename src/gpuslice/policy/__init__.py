"""gpuslice.policy."""
