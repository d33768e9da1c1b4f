#!/usr/bin/env bash
# Run any grid through `phaselab run` on a machine without network access (a bare GPU machine
# with CUDA torch and triton), then pack the results into a few small files.
#
#   bash deploy/gpu/run_grid.sh GRID [overrides...] [options]
#
# GRID is a grid file or a shipped grid name; overrides are `phaselab run`'s (key=v, ~key, ...).
# Options:
#   --out DIR        where the packed files go (default: $OUT, else WORK/out)
#   --work DIR       catalog, MLflow store and run folders (default /tmp/phaselab-gpu)
#   --no-install     never install .whl (default: install only when ray/deepspeed/... do not import)
#   --no-mlflow      run without MLflow tracking (also chosen when mlflow does not import)
#   --num-cpus N     CPUs of the local Ray cluster (default: Ray's own count)
#   --budget S       stop `phaselab run` after S seconds, still packing what finished
#   --mps            start an NVIDIA MPS control daemon for the run (stopped at exit), so stages
#                    packed on one GPU (fractional resources.gpus) run their kernels concurrently
#                    instead of time-sliced; see deploy/gpu/README.md for when it pays
# Env: PHASELAB_GIT_COMMIT (recorded in run.json: the copied tree has no .git), PHASELAB_PYTHON.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PHASELAB_PYTHON:-python3}
COMMAND=$(printf '%q ' bash "$0" "$@")
WORK=/tmp/phaselab-gpu
OUTDIR=${OUT:-}
INSTALL=auto
MLFLOW=1
NUM_CPUS=
BUDGET=0
MPS=0
MPS_STARTED=0
GRID=
OVERRIDES=()
while (($#)); do
  case $1 in
    --out) OUTDIR=$2; shift ;;
    --work) WORK=$2; shift ;;
    --no-install) INSTALL=no ;;
    --no-mlflow) MLFLOW=0 ;;
    --num-cpus) NUM_CPUS=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --mps) MPS=1 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    --*) echo "unknown option: $1" >&2; exit 2 ;;
    *) if [[ -z $GRID ]]; then GRID=$1; else OVERRIDES+=("$1"); fi ;;
  esac
  shift
done
[[ -n $GRID ]] || { echo "usage: run_grid.sh GRID [overrides...] [options]" >&2; exit 2; }
[[ $PY == */* && -d $(dirname "$PY") ]] && PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")   # relative to the caller
[[ -f $GRID ]] && GRID=$(cd "$(dirname "$GRID")" && pwd)/$(basename "$GRID")
OUTDIR=${OUTDIR:-$WORK/out}
mkdir -p "$WORK" "$OUTDIR"
WORK=$(cd "$WORK" && pwd)
OUTDIR=$(cd "$OUTDIR" && pwd)
SITE=$WORK/site       # the carried wheels, installed with --target (no root, no network)
PKG=$WORK/pkg         # `phaselab` mapped onto the checkout, importable by every Ray worker
# Python runs from WORK: from the repository root, its phaselab/ folder (two files, without the
# subpackages pyproject maps in) would shadow the mapped package for the driver and Ray workers.
cd "$WORK"
LOG=$WORK/run.log
: > "$LOG"
say() { echo "[run_grid] $*" | tee -a "$LOG"; }
on_exit() {
  # only the daemon this script started (its own pipe folder), never one found running
  ((MPS_STARTED)) && echo quit | nvidia-cuda-mps-control > /dev/null 2>&1
  gzip -c "$LOG" > "$OUTDIR/log.txt.gz"   # the log comes back even when a step fails
}
trap on_exit EXIT

export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 MLFLOW_DISABLE_TELEMETRY=true
# The VM's MemTotal grows as memory is used, so Ray's OOM monitor would act on a wrong total.
export RAY_memory_monitor_refresh_ms=0
export PYTHONPATH=$PKG:$SITE${PYTHONPATH:+:$PYTHONPATH}
# deepspeed is needed by ZeRO stages only (launcher ray_train); a grid of ray_task stages runs
# without it, which leaves 2 MiB of the 64 MiB a call carries to the data the grid reads.
DEPS="import ray, ray.train, sqlalchemy, alembic, pydantic, hjson, tensorboardX"

install_wheels() {
  local tarball
  say "installing $ROOT/.whl into $SITE"
  mkdir -p "$SITE"
  for tarball in "$ROOT"/.whl/ray-*.tar.xz; do
    [[ -e $tarball ]] && tar -xJf "$tarball" -C "$SITE"
  done
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$ROOT"/.whl/*.whl 2>&1 | grep -v "^WARNING: Target directory" | tee -a "$LOG"
}

map_package() {  # the package-dir mapping of pyproject.toml, as symlinks (no build, no network)
  local d f
  mkdir -p "$PKG/phaselab"
  for f in "$ROOT"/phaselab/*.py; do ln -sfn "$f" "$PKG/phaselab/$(basename "$f")"; done
  for d in kernels workloads catalog orchestrator; do ln -sfn "$ROOT/$d" "$PKG/phaselab/$d"; done
}

if [[ $INSTALL == auto ]] && "$PY" -c "$DEPS" 2> /dev/null; then
  say "dependencies import already: no install"
elif [[ $INSTALL != no ]]; then
  install_wheels
fi
"$PY" -c "import phaselab.orchestrator.cli.main" 2> /dev/null || map_package
"$PY" -c "$DEPS; import phaselab.orchestrator.cli.main" 2>&1 | tee -a "$LOG"
((PIPESTATUS[0] == 0)) || { say "dependencies do not import (traceback above)"; exit 3; }
"$PY" -c "import deepspeed" 2> /dev/null || say "deepspeed does not import: stages with launcher ray_train (ZeRO) will fail"
if ((MLFLOW)) && ! "$PY" -c "import mlflow" 2> /dev/null; then
  say "mlflow does not import: running with --no-mlflow (curves only from metrics.jsonl)"
  MLFLOW=0
fi

if ((MPS)); then
  # The daemon's pipe and log folders live under WORK; Ray's raylet and its workers inherit the
  # variables from this shell, so every stage's CUDA context becomes an MPS client.
  export CUDA_MPS_PIPE_DIRECTORY=$WORK/mps CUDA_MPS_LOG_DIRECTORY=$WORK/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || { say "nvidia-cuda-mps-control -d failed"; exit 3; }
  MPS_STARTED=1
  say "MPS control daemon started ($CUDA_MPS_PIPE_DIRECTORY)"
fi

RUN=("$PY" -m phaselab.orchestrator.cli.main run "$GRID" "${OVERRIDES[@]}"
     --catalog "sqlite:///$WORK/catalog.db" --runs-root "$WORK/runs")
((MLFLOW)) || RUN+=(--no-mlflow)
[[ -n $NUM_CPUS ]] && RUN+=(--num-cpus "$NUM_CPUS")
((BUDGET > 0)) && RUN=(timeout --kill-after=20 "$BUDGET" "${RUN[@]}")
say "$(printf '%q ' "${RUN[@]}")"
start=$(date +%s)
"${RUN[@]}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
end=$(date +%s)
say "phaselab run exited $rc after $((end - start)) s"

"$PY" "$ROOT/deploy/gpu/pack.py" --grid "$GRID" --work "$WORK" --out "$OUTDIR" --rc "$rc" \
  --seconds "$((end - start))" --mlflow "$MLFLOW" --command "${COMMAND% }" \
  -- "${OVERRIDES[@]}" 2>&1 | tee -a "$LOG"
prc=${PIPESTATUS[0]}
ls -l "$OUTDIR"
((rc == 0)) && exit "$prc"
exit "$rc"
