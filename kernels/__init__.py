"""phaselab.kernels: the math core (torch, triton only; imports nothing else of ours).

- `registry`: attention backends by name (lazy "module:Class"; importing it does not import torch).
- `attention`: what every attention call shares: `options`, `score_mod` (ScoreMod), `reference` (the
  generic spec), the backends `sdpa` and `function` (triton), `triton_common`.
- one folder per fused operator, each with its plain-torch `reference` beside its Triton kernels and
  tests mirrored under tests/kernels/: `flash` (the plain flash core), `pope`, `tapa`, `relbias`.
- `rotary`: `config.RopeConfig` (torch-free), `reference.apply_rotary` and `scaling` (RoPE, PI,
  NTK, dynamic NTK, YaRN).
- `testing`: assert_close, calibrated_close (the 2x rule), shape_id.

Nothing is imported here, so `import phaselab.kernels.registry` stays torch-free (DESIGN §2).
"""
