"""phaselab.workloads.models."""
