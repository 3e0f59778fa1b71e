"""gpuslice.extender.binding."""
