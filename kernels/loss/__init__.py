"""phaselab.kernels.loss: the fused linear + cross-entropy loss of the LM head (issue 4).

- `reference`: the spec in plain torch (float64-capable), differentiated by autograd.
- `triton_ce`: the per-row Triton kernel (log-sum-exp, then the gradient in place of the logits).
- `function`: the autograd Function and the validated public `linear_cross_entropy`.

Submodules are imported explicitly (nothing here), as in `phaselab.kernels.attention`.
"""
