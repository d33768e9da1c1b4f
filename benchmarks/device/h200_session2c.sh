#!/usr/bin/env bash
# Final H200 call of 2026-12-01: TAPA GPU tests (series in the forward only), the attention
# benchmark on the final kernels (D=128 first: TAPA's targets; then D=64: PoPE's), and training
# throughput eager and compiled. At most 8 files come back: logs go to one file. (It ran with
# prelude.sh's lines written out here; they now live in that shared file.)
source benchmarks/device/prelude.sh
stage tests 110 python3 benchmarks/shim.py tests/kernels/test_triton_tapa.py -m gpu -q -x
ATT="python3 benchmarks/attention.py --warmup 5 --iters 20"
stage attn-128 170 $ATT --head-dims 128 --out "$OUT/attention-h200-d128"
stage attn-64 150 $ATT --head-dims 64 --out "$OUT/attention-h200-d64"
stage train-compile 100 python3 benchmarks/train_throughput.py --compile --warmup 15 --out "$OUT/train-h200-compile"
stage train-eager 70 python3 benchmarks/train_throughput.py --out /tmp/train-h200-eager
cp /tmp/train-h200-eager.json "$OUT"/ 2>/dev/null; grep -E "^\||passed|failed" "$OUT/log.txt" | tail -60
