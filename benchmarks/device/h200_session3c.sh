#!/usr/bin/env bash
# Session 3, third call (2026-12-01): RoPE compiled training at 64 x 1024 tokens per optimiser step,
# as one micro-batch and as 2 x 32 accumulated: the per-step host sync (NaN/Inf check before the
# update) idles the GPU ~8 % of a 32 x 1024 step (train-h200.md profile); a larger step amortises it.
source benchmarks/device/prelude.sh
stage b64 150 python3 benchmarks/train_throughput.py --compile --warmup 10 --steps 40 --encodings rope \
  --batch-size 64 --profile 3 --out "$OUT/train-h200-rope-b64"
stage accum2 150 python3 benchmarks/train_throughput.py --compile --warmup 10 --steps 40 --encodings rope \
  --batch-size 64 --grad-accum 2 --out "$OUT/train-h200-rope-b64-accum2"
grep -E "^\||^#|passed|failed|Error" "$OUT/log.txt" | tail -30
