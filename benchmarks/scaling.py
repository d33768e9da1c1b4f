"""DeepSpeed ZeRO data-parallel scaling through Ray Train V2 (real ``ray_entry.fit``).

For each (model preset, encoding, ZeRO stage, world size) this runs one training stage with
``phaselab.workloads.train.ray_entry.fit`` and derives, from the per-step lines rank 0 writes to
``out_dir/metrics.jsonl`` (``log_every=1``):

- tokens/s per GPU, warm-up steps and the step right after the mid-run checkpoint excluded:
  ``n * tokens_per_step / sum(1 / steps_per_s)`` over the kept steps, divided by the world size;
- scaling efficiency 1 -> N: ``tokens/s(N) / (N * tokens/s(1))``;
- checkpoint save time: ``ckpt/save_s`` the loop logs at the mid-run checkpoint (rank 0's wall
  time of the blocking save: DeepSpeed shards, the consolidated model.pt, the barrier and
  ``ray.train.report`` with async upload); the step after it is excluded from tokens/s;
- peak memory per GPU, two ways: ``train/peak_mem_gib`` the loop logs on CUDA (rank 0's
  ``torch.cuda.max_memory_allocated``, tensors only; max over the run) and ``nvidia-smi``
  memory.used polled on every GPU (CUDA context and allocator cache included);
- restore time and resume correctness (by default for ZeRO-3 at the largest world): run the same
  spec under a new run name with ``stop_after`` (a kill after the mid-run checkpoint), re-run
  ``fit`` with the same run name (Ray Train V2 resumes it, DESIGN §5.3) and compare its losses
  with the uninterrupted run. The restore time is ``ckpt/load_s`` as the resumed run logs it;
  beside it, the difference of the times to the first train line of the resumed and the killed
  run (the restore plus Ray start-up jitter).

Modules: scaling_cases.py (cases, settings, spec), scaling_measure.py (timed fits and what is
derived from them), scaling_report.py (efficiency, loss curves, table, JSON/Markdown, merge).

Every world size uses ``grad_accum = max(--workers) / world`` with the same global batch, so
every run sees the same micro-batches (batch index ``(step*accum + k)*world + rank``) of the
same size: the loss curves of 1 and N GPUs are comparable (plot_loss_curves.py) and per-GPU
work per micro-step is the same.

    python benchmarks/scaling.py --device cuda --workers 1,2 --zero 1,2,3 \\
        --encodings rope,pope,tapa --presets owt-124m,owt-253m --steps 30 \\
        --out benchmarks/results/scaling-h200
    python benchmarks/scaling.py --device cpu --workers 1,2 --zero 2 --encodings rope,pope \\
        --steps 10 --resume-zero 2 --out benchmarks/results/scaling-cpu-smoke

On ``--device cpu`` the model shrinks to the ``tiny`` preset on char-level Tiny Shakespeare
(block 64), fp32, gloo: those numbers exercise the machinery and say nothing about GPU scaling.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # scaling_*.py, plot_loss_curves beside this file

from scaling_cases import NCCL_SAFE_ENV, Bench, Case
from scaling_measure import run_case, run_resume
from scaling_report import describe, merge, print_table, write_results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = lambda s: [int(x) for x in s.split(",") if x]
    strs = lambda s: [x for x in s.split(",") if x]
    p.add_argument("--workers", type=ints, default=[1, 2])
    p.add_argument("--zero", type=ints, default=[1, 2, 3])
    p.add_argument("--encodings", type=strs, default=["rope", "pope", "tapa"])
    p.add_argument("--presets", type=strs, default=["owt-124m", "owt-253m"],
                   help="GPU presets; on --device cpu always the tiny preset")
    p.add_argument("--steps", type=int, default=None, help="default: 30 on cuda, 10 on cpu")
    p.add_argument("--warmup-steps", type=int, default=None, help="excluded steps (default: 5 cuda, 2 cpu)")
    p.add_argument("--batch", type=int, default=None, help="global batch (default: 64 cuda, 8 cpu)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--resume-zero", type=ints, default=[3],
                   help="ZeRO stages whose kill+resume is timed (first encoding, largest world)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/scaling-h200")
    p.add_argument("--work-dir", type=Path, default=ROOT / "runs/scaling")
    p.add_argument("--no-plots", action="store_true", help="no PNGs (device runs: 8 files come back)")
    p.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                   help="merge result files of several calls into --out (no training)")
    args = p.parse_args(argv)
    cpu = args.device == "cpu"
    args.steps = args.steps or (10 if cpu else 30)
    args.warmup_steps = args.warmup_steps if args.warmup_steps is not None else (2 if cpu else 5)
    args.batch = args.batch or (8 if cpu else 64)
    if cpu:
        args.presets = ["tiny"]
    for w in args.workers:
        if w < 1:
            raise ValueError(f"--workers values must be >= 1, got {w}")
    if max(args.workers) % min(args.workers) or any(max(args.workers) % w for w in args.workers):
        raise ValueError(f"every --workers value must divide the largest, got {args.workers}")
    return args


def init_ray(device: str, max_world: int) -> None:
    import ray

    for k, v in NCCL_SAFE_ENV.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env = {k: os.environ[k] for k in (*NCCL_SAFE_ENV, "PYTHONPATH", "TORCH_EXTENSIONS_DIR") if k in os.environ}
    kwargs = {"num_cpus": max(2, max_world)} if device == "cpu" else {}
    ray.init(include_dashboard=False, runtime_env={"env_vars": env}, log_to_driver=True, **kwargs)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        merged = merge(args.merge, args.out, plots=not args.no_plots)
        print_table(merged)
        return 0
    bench = Bench(device=args.device, steps=args.steps, warmup_steps=args.warmup_steps,
                  batch_size=args.batch, max_world=max(args.workers),
                  block_size=64 if args.device == "cpu" else 1024, ckpt_at=args.steps // 2,
                  lr=1e-3 if args.device == "cpu" else 6e-4)
    from phaselab.workloads.train.deepspeed_engine import configure_environment

    configure_environment()  # TORCH_EXTENSIONS_DIR for the workers (JIT comm op cache)
    init_ray(args.device, bench.max_world)
    tag = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:4]
    work = args.work_dir.resolve() / tag  # fresh run names: never an accidental resume
    command = "python benchmarks/scaling.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    results = describe(args, bench, command) | {"cases": [], "resume": []}
    cases = [Case(preset=p, encoding=e, zero_stage=z, world=w) for p in args.presets
             for e in args.encodings for z in args.zero for w in sorted(args.workers)]
    for case in cases:
        print(f"[scaling] {case.key} ...", flush=True)
        row = run_case(case, bench, work, tag)
        results["cases"].append(row)
        print(f"[scaling] {case.key}: " + json.dumps({k: row.get(k) for k in (
            "tokens_per_s_per_gpu", "ckpt_save_s", "peak_mem_gib_alloc", "peak_mem_gib_max_gpu", "wall_s",
            "error")}), flush=True)
        if (case.zero_stage in args.resume_zero and case.world == bench.max_world
                and case.encoding == args.encodings[0] and not row["error"]):
            results["resume"].append(run_resume(case, bench, work, tag, row))
            print(f"[scaling] resume {case.key}: {json.dumps(results['resume'][-1])}", flush=True)
        write_results(results, args.out, plots=False)  # a killed run keeps what it measured
    write_results(results, args.out, plots=not args.no_plots)
    print_table(results)
    print(f"[scaling] wrote {args.out.with_suffix('.json')} and .md", flush=True)
    return 0 if all(not r["error"] for r in results["cases"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
