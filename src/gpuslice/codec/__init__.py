"""gpuslice.codec."""
