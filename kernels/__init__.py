"""phaselab.kernels."""
