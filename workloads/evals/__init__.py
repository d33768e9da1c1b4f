"""phaselab.workloads.evals."""
