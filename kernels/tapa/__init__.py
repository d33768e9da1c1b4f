"""phaselab.kernels.tapa: TAPA attention (MATH §4.2), a fused Triton kernel and its spec.

- `reference`: the scores in plain torch (float64-capable);
- `phase`: the Triton jit helpers of the phase (turns, the series, cos of reduced angles);
- `triton_tapa`: forward and backward kernels on the flash skeleton;
- `ops`: the `phaselab::tapa_fwd/bwd` custom ops; `function`: the validated `tapa_attention`.

Measurements: kernels/attention/README.md. Submodules are imported explicitly (nothing here).
"""
