"""gpuslice.kube."""
