"""phaselab.workloads."""
