"""phaselab.kernels.rotary."""
