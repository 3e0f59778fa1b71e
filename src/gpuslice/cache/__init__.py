"""gpuslice.cache."""
