"""phaselab.kernels.rotary: `reference.apply_rotary` (fp32 RoPE rotation) and `scaling` (frequency rules)."""
