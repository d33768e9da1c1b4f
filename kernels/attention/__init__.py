"""phaselab.kernels.attention: the front door. One call routes a score modification to a backend.

- `function`: the `triton` backend (dispatch by score mod to kernels/flash, kernels/pope,
  kernels/tapa, kernels/relbias);
- `sdpa`: the `sdpa` backend (cuDNN / flash SDPA, FlexAttention);
- `reference`: the generic reference (scores by score mod, masking, softmax, GQA, positions; PoPE's
  and TAPA's scores from kernels/pope and kernels/tapa) and the `reference` backend.

The operators live beside it, one folder each (kernels/flash, kernels/pope, kernels/tapa,
kernels/relbias), and what they share is in kernels/common. See README.md in this folder for the
score table, the backend support matrix and the measurements. Submodules are imported explicitly
(nothing here), so importing this package does not pull in the Triton kernels.
"""
