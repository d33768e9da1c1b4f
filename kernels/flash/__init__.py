"""phaselab.kernels.flash: the plain flash attention core in Triton (q/k width DK, v width DV).

- `reference`: the spec in plain torch (float64-capable), differentiated by autograd;
- `triton_flash`: forward and FA2-style backward kernels; the skeleton (tile loaders, causal block
  bounds, position flags) that the PoPE expand path (kernels/pope) and the bias-table kernel
  (kernels/relbias) run on; its backward has a PoPE mode (the chain rule in its epilogues);
- `function`: the autograd function and the validated `flash_attention`;
- `gluon_hopper`, `gluon_hopper_bwd`: the Hopper (sm_90) core in Gluon (TMA rings, mbarriers,
  asynchronous wgmma), forward and backward, for bf16/fp16 at head dims 64 and 128; the `tl` kernels
  stay the portable path and the cross-check. Not yet routed to by the model (benchmarks/results/
  gluon-fwd-h200.md).

Submodules are imported explicitly (nothing here), so importing one does not pull in the kernels.
"""
