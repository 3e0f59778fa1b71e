"""gpuslice.framework."""
