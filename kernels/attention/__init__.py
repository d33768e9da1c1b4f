"""phaselab.kernels.attention."""
