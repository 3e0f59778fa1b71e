"""gpuslice.extender."""
