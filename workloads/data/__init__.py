"""phaselab.workloads.data."""
