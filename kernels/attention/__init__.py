"""phaselab.kernels.attention: what every attention call shares, and the registry's backends.

- `options` (AttentionOptions), `score_mod` (ScoreMod): torch-free configuration and spec;
- `reference`: the generic reference (scores by score mod, masking, softmax, GQA, positions; PoPE's
  and TAPA's scores from kernels/pope and kernels/tapa) and the `reference` backend;
  `reference_common`: the checks, GQA, visibility and masked softmax every reference shares;
- `sdpa`: the `sdpa` backend; `function`: the `triton` backend (dispatch by score mod);
- `checks`: the fused wrappers' input checks; `ops`: what the custom ops share;
- `triton_common`: shared Triton jit helpers and tune defaults.

The operators live beside it, one folder each: kernels/flash, kernels/pope, kernels/tapa,
kernels/relbias. See README.md in this folder for the score table, the backend support matrix and
the measurements. Submodules are imported explicitly (nothing here), so importing `score_mod` does
not pull in the Triton kernels.
"""
