"""phaselab.workloads.train."""
