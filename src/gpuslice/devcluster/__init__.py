"""gpuslice.devcluster."""
