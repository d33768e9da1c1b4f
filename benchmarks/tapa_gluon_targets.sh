#!/usr/bin/env bash
# The measurements behind the Gluon TAPA kernels' targets (kernels/attention/README.md, "TAPA on
# the Gluon core": D = 128, bf16, causal, ratios to cuDNN in one process), on one sm_90 GPU in one
# command, after run_on_gpu.sh's setup; the commit the results describe comes from the caller (a
# copy of the checkout without .git has none of its own):
#
#   PHASELAB_GIT_COMMIT=SHA benchmarks/run_on_gpu.sh -- bash benchmarks/tapa_gluon_targets.sh [--dry-run] [STEP ...]
#
# Steps, in the order given (default: all; seconds each took on an H100, benchmarks/results/
# gpu-tests-h100.md and the H100 results files, then the limit each runs under):
#   tests     the GPU tests of the Gluon TAPA and plain kernels and the attention ops, 8 at a time,
#             but the one that takes 40 GB (~175 s and ~40 s as two runs, 330) -> gpu-tests-CARD.log
#   tests40   that one, alone (~30 s, 120) -> gpu-tests-40gb-CARD.log
#   rows      attention.py at 4k and 16k, forward and forward+backward, 3 interleaved rounds of
#             cuDNN and TAPA (~100 s, 240)
#             -> attention-CARD-tapa-gluon.{md,json}
#   rows128k  attention.py at 128k, batch 1 (~40 s, 150) -> attention-CARD-tapa-gluon-128k.*
#   train1k   train_throughput.py --compile, RoPE and TAPA at 1k context (~60 s, 180)
#             -> train-CARD-tapa-gluon-1k.*
#   train8k   the same at 8k context, batch 4 (~50 s, 180) -> train-CARD-tapa-gluon-8k.*
#   tiles     gluon_tapa_tiles.py: each kernel's default tile against its candidates, D = 128 and
#             64 at 4k and 16k (D = 128 alone ~90 s; limit 420) -> gluon-tapa-tiles-CARD.*
# All of them take longer than a machine with a 10-minute command limit allows: name the steps that
# fit. Results go to $OUT
# (default benchmarks/results), each step's output to NAME.log in $LOGS (default: beside them; a
# folder of its own keeps the logs apart from the files to commit); a failed step does not
# stop the rest, and the exit status is the number of failed steps. CARD is the GPU's short name
# (h100, h200; "gpu" where nvidia-smi is missing). --dry-run prints the commands without running them.
set -uo pipefail

dry=0
if [[ "${1:-}" == "--dry-run" ]]; then dry=1; shift; fi
ALL=(tests tests40 rows rows128k train1k train8k tiles)
steps=("$@")
(( ${#steps[@]} )) || steps=("${ALL[@]}")
for s in "${steps[@]}"; do
  [[ " ${ALL[*]} " == *" $s "* ]] || { echo "tapa_gluon_targets.sh: unknown step $s (steps: ${ALL[*]})" >&2; exit 2; }
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-benchmarks/results}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 \
       | sed -E 's/^NVIDIA //; s/ .*//' | tr '[:upper:]' '[:lower:]' || true)
card=${card:-gpu}
ROWS=(--untuned --head-dims 128 --methods sdpa-cudnn tapa-gluon)
TRAIN=(--compile --encodings rope,tapa)
GPU_TESTS=(tests/kernels/tapa/test_gluon_tapa.py tests/kernels/tapa/test_gluon_tapa_bwd.py
           tests/kernels/tapa/test_tapa_core.py tests/kernels/attention tests/kernels/flash/test_gluon_hopper.py
           tests/kernels/flash/test_gluon_hopper_bwd.py)

plan() {  # limit (seconds), name (the results' stem, also the log's) and cmd of step $1
  case $1 in
    tests)    limit=330 name=gpu-tests-$card
              cmd=(python3 -m pytest -m gpu -n 8 --timeout 150 -q -p no:cacheprovider "${GPU_TESTS[@]}"
                   -k "not backward_distances_beyond_fp32_integers") ;;
    tests40)  limit=120 name=gpu-tests-40gb-$card
              cmd=(python3 -m pytest -m gpu --timeout 100 -q -p no:cacheprovider tests/kernels/tapa
                   -k backward_distances_beyond_fp32_integers) ;;
    rows)     limit=240 name=attention-$card-tapa-gluon
              cmd=(python3 benchmarks/attention.py "${ROWS[@]}" --lengths 4096 16384 --rounds 3 --out "$out/$name") ;;
    rows128k) limit=150 name=attention-$card-tapa-gluon-128k
              cmd=(python3 benchmarks/attention.py "${ROWS[@]}" --lengths 131072 --tokens 131072 --iters 10
                   --out "$out/$name") ;;
    train1k)  limit=180 name=train-$card-tapa-gluon-1k
              cmd=(python3 benchmarks/train_throughput.py "${TRAIN[@]}" --out "$out/$name") ;;
    train8k)  limit=180 name=train-$card-tapa-gluon-8k
              cmd=(python3 benchmarks/train_throughput.py "${TRAIN[@]}" --seq-len 8192 --batch-size 4 --out "$out/$name") ;;
    tiles)    limit=420 name=gluon-tapa-tiles-$card
              cmd=(python3 benchmarks/gluon_tapa_tiles.py --dims 128 64 --lengths 4096 16384 --out "$out/$name") ;;
  esac
}

failed=0
logs=${LOGS:-$out}
[[ $dry == 1 ]] || mkdir -p "$out" "$logs"
for s in "${steps[@]}"; do
  plan "$s"
  if [[ $dry == 1 ]]; then printf '%q ' timeout "$limit" "${cmd[@]}"; echo "> $logs/$name.log"; continue; fi
  start=$SECONDS
  timeout "$limit" "${cmd[@]}" > "$logs/$name.log" 2>&1
  rc=$?
  echo "$s: exit $rc after $((SECONDS - start)) s ($logs/$name.log)"
  (( rc == 0 )) || failed=$((failed + 1))
done
exit $failed
