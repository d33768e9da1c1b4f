#!/usr/bin/env bash
# Run one benchmark (or the GPU tests) on a GPU machine from a plain checkout of this repository.
#
#   benchmarks/run_on_gpu.sh [--dry-run] BENCH [FLAGS...]
#
# BENCH is the name of a script in benchmarks/ (attention, attention_ablation, train_throughput,
# scaling, kernel_sass, ...; benchmarks/README.md lists them) and runs as
#   python3 benchmarks/BENCH.py FLAGS --out $OUT/NAME
# BENCH "pytest" runs `python3 -m pytest FLAGS` instead (e.g. `pytest tests/kernels -m gpu -q`), and
# BENCH "--" runs the rest of the line as a command after the same setup (e.g. `-- phaselab run G`).
#
# What it sets up, in order:
#   1. the environment: unbuffered output, the kernels' cache in /tmp, Ray telemetry off, and NVLink
#      multicast off for NCCL / PyTorch / NVSHMEM (it can take a shared multi-GPU host down);
#   2. packages the machine lacks, if the checkout carries them in .whl/ (wheels, and *.tar.xz of
#      unpacked wheels too large to carry whole), installed into /tmp/site without the network;
#   3. phaselab itself, as an editable install of this checkout (`pip install --no-deps
#      --no-build-isolation --no-index -e .`), so scripts, tests and Ray workers import
#      `phaselab.*` exactly as from an installed package.
# Results: a relative `--out NAME` becomes $OUT/NAME (OUT defaults to benchmarks/results); without
# --out, scripts that take one get $OUT/BENCH-<card>, e.g. attention-h200. The output is also
# written to $OUT/NAME.log. --dry-run prints the commands without running them.
set -euo pipefail

dry=0
if [[ "${1:-}" == "--dry-run" ]]; then dry=1; shift; fi
if [[ $# -lt 1 ]]; then
  sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
bench=$1; shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out_dir=${OUT:-benchmarks/results}
if [[ $bench != pytest && $bench != -- && ! -f benchmarks/$bench.py ]]; then
  echo "run_on_gpu.sh: no benchmark benchmarks/$bench.py" >&2; exit 2
fi

run() { if [[ $dry == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi; }

export PYTHONUNBUFFERED=1 PHASELAB_CACHE_DIR=${PHASELAB_CACHE_DIR:-/tmp/plcache} RAY_USAGE_STATS_ENABLED=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

shopt -s nullglob
wheels=(.whl/*.whl) tarballs=(.whl/*.tar.xz)
if (( ${#wheels[@]} + ${#tarballs[@]} )); then
  run mkdir -p /tmp/site
  for t in "${tarballs[@]}"; do run tar -xJf "$t" -C /tmp/site; done
  if (( ${#wheels[@]} )); then
    run python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "${wheels[@]}"
  fi
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
run python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .

if [[ $bench == pytest ]]; then
  cmd=(python3 -m pytest "$@")
  name=pytest
elif [[ $bench == -- ]]; then
  cmd=("$@")
  name=command
else
  script=benchmarks/$bench.py
  args=() name=""
  while [[ $# -gt 0 ]]; do
    if [[ $1 == --out && $# -ge 2 ]]; then
      name=$(basename "$2"); [[ $2 == /* ]] && args+=(--out "$2") || args+=(--out "$out_dir/$2")
      shift 2
    else
      args+=("$1"); shift
    fi
  done
  if [[ -z $name ]] && grep -q -- '"--out"' "$script"; then
    card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 \
           | sed -E 's/^NVIDIA //; s/ .*//' | tr '[:upper:]' '[:lower:]' || true)
    name=$bench-${card:-gpu}
    args+=(--out "$out_dir/$name")
  fi
  cmd=(python3 "$script" "${args[@]}")
  name=${name:-$bench}
fi

run mkdir -p "$out_dir"
if [[ $dry == 1 ]]; then run "${cmd[@]}"; exit 0; fi
"${cmd[@]}" 2>&1 | tee "$out_dir/$name.log"
