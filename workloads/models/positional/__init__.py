"""phaselab.workloads.models.positional."""
