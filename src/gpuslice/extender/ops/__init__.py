"""gpuslice.extender.ops."""
