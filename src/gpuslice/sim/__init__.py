"""gpuslice.sim."""
