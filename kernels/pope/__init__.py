"""phaselab.kernels.pope: PoPE attention (MATH §3), three implementations of one spec.

- `reference`: the spec in plain torch (amplitude, Cartesian expansion, scores), float64-capable;
- `phase`: the Triton jit helpers every implementation shares (amplitude, phase cos/sin, expansion);
- `triton_pope`: "fused", q/k expanded in registers inside one flash kernel;
- `triton_expand` (+ `triton_expand_bwd`, the pieces the flash core's PoPE-mode backward calls):
  "expand", 2D-wide q_hat/k_hat in device memory on the flash core of kernels/flash;
- `cudnn`: "cudnn", the same prologue and chain rule around cuDNN's attention core;
- `ops`: the `phaselab::pope_fwd/bwd` custom ops; `function`: the validated `pope_attention`.

Measurements and the choice between implementations: kernels/attention/README.md. Submodules are
imported explicitly (nothing here).
"""
