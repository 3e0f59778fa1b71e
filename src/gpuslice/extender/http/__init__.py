"""gpuslice.extender.http."""
