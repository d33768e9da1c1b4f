"""phaselab.workloads.recipes."""
