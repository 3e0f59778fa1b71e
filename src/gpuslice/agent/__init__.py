"""gpuslice.agent."""
