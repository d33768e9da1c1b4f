"""phaselab.kernels.loss: the fused linear + cross-entropy loss of the LM head. On the H200 it took
the compiled 124M RoPE model from 37.0 % to 39.5 % MFU (benchmarks/README.md, "Training throughput").

- `reference`: the spec in plain torch (float64-capable), differentiated by autograd.
- `triton_ce`: the per-row Triton kernel (log-sum-exp, then the gradient in place of the logits).
- `function`: the autograd Function and the validated public `linear_cross_entropy`.

Submodules are imported explicitly (nothing here), as in `phaselab.kernels.attention`.
"""
