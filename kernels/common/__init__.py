"""phaselab.kernels.common: what every attention operator shares; it imports no other room of kernels.

- `options` (AttentionOptions), `score_mod` (ScoreMod): torch-free configuration and the score spec
  an encoding hands to the kernels;
- `checks`: the fused wrappers' input checks; `ops`: what the custom ops share (density, vmap fold);
- `reference_common`: the checks, GQA, visibility and masked softmax every reference shares;
- `triton_common`: shared Triton jit helpers and tune defaults.

Submodules are imported explicitly (nothing here), so importing `score_mod` does not pull in Triton.
"""
