"""phaselab.kernels: the math core (torch, triton only; imports nothing else of ours).

- `registry`: attention backends by name (lazy "module:Class"; importing it does not import torch).
- `attention`: `score_mod` (ScoreMod), `reference` (the spec), `sdpa`, Triton kernels (`function`).
- `rotary`: `config.RopeConfig` (torch-free), `reference.apply_rotary` and `scaling` (RoPE, PI,
  NTK, dynamic NTK, YaRN).
- `testing`: assert_close, calibrated_close (the 2x rule), shape_id.

Nothing is imported here, so `import phaselab.kernels.registry` stays torch-free (DESIGN §2).
"""
