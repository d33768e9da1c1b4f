"""Issue 8: DeepSpeed ZeRO data-parallel scaling through Ray Train V2 (real ``ray_entry.fit``).

For each (model preset, encoding, ZeRO stage, world size) this runs one training stage with
``phaselab.workloads.train.ray_entry.fit`` and derives, from the per-step lines rank 0 writes to
``out_dir/metrics.jsonl`` (``log_every=1``):

- tokens/s per GPU, warm-up steps and the step right after the mid-run checkpoint excluded:
  ``n * tokens_per_step / sum(1 / steps_per_s)`` over the kept steps, divided by the world size;
- scaling efficiency 1 -> N: ``tokens/s(N) / (N * tokens/s(1))``;
- checkpoint save time: the step after the mid-run checkpoint minus the median step (the loop
  resets its timer before ``save``, so that step's window holds the blocking part of the save:
  DeepSpeed shards, the consolidated model.pt, the barrier and ``ray.train.report``);
- peak memory per GPU: NOT logged by the loop; on CUDA we poll ``nvidia-smi`` (device memory in
  use, CUDA context and allocator cache included) and say so;
- restore time and resume correctness (by default for ZeRO-3 at the largest world): run the same
  spec under a new run name with ``stop_after`` (a kill after the mid-run checkpoint), re-run
  ``fit`` with the same run name (Ray Train V2 resumes it, DESIGN §5.3) and compare its losses
  with the uninterrupted run. The restore time is the difference of the times to the first
  metrics line of the resumed and the fresh run (so it carries Ray start-up jitter).

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
import dataclasses
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # plot_loss_curves beside this file

# KINDS.md: NVLink multicast must stay off on the lent multi-GPU machines (also in Ray workers).
NCCL_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# rope -> cuDNN/flash SDPA; pope/tapa -> the fused Triton kernels (issue 3). CPU: the reference.
CUDA_BACKENDS = {"rope": "sdpa", "pope": "triton", "tapa": "triton"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
    preset: str
    encoding: str
    zero_stage: int
    world: int

    @property
    def key(self) -> str:
        return f"{self.preset}-{self.encoding}-z{self.zero_stage}-w{self.world}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bench:
    """Settings shared by every case. ``max_world`` fixes ``grad_accum * world`` (module doc)."""

    device: str
    steps: int
    warmup_steps: int
    batch_size: int
    max_world: int
    block_size: int
    ckpt_at: int
    lr: float

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"--device must be cpu or cuda, got {self.device!r}")
        if not 0 < self.ckpt_at < self.steps - 2:
            raise ValueError(f"need 0 < ckpt_at={self.ckpt_at} < steps-2={self.steps - 2}")
        if self.warmup_steps + 2 >= self.steps:
            raise ValueError(f"--warmup-steps {self.warmup_steps} leaves no measured step of {self.steps}")
        if self.batch_size % self.max_world:
            raise ValueError(f"--batch {self.batch_size} is not divisible by max(--workers)={self.max_world}")

    @property
    def micro_batch(self) -> int:
        return self.batch_size // self.max_world

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.block_size


def build_spec(case: Case, bench: Bench) -> dict:
    """The training spec ``fit`` gets (CONTRACTS §3.4)."""
    from phaselab.workloads.config import to_dict
    from phaselab.workloads.models.presets import preset

    if bench.device == "cuda":
        model = preset(case.preset, block_size=bench.block_size,
                       pe={"kind": case.encoding}, attention={"backend": CUDA_BACKENDS[case.encoding]})
        data = {"kind": "text", "block_size": bench.block_size, "text": {"tokenizer": "gpt2"}}
        precision = "bf16"
    else:
        model = preset(case.preset, block_size=bench.block_size, pe={"kind": case.encoding})
        data = {"kind": "text", "block_size": bench.block_size, "text": {"tokenizer": "char"}}
        precision = "fp32"
    train = {"steps": bench.steps, "batch_size": bench.batch_size,
             "grad_accum": bench.max_world // case.world, "lr": bench.lr, "min_lr": bench.lr / 10,
             "warmup": min(5, bench.steps // 4), "eval_every": 0, "eval_batches": 2,
             "eval_batch_size": bench.micro_batch, "final_eval_batches": 2, "final_eval_splits": ["valid"],
             "ckpt_every": bench.ckpt_at, "keep_checkpoints": 2, "precision": precision, "seed": 0,
             "log_every": 1, "zero_stage": case.zero_stage}
    return {"model": to_dict(model), "data": data, "train": train}


class LineWatcher(threading.Thread):
    """Timestamps (monotonic) the lines appended to a metrics.jsonl while a fit runs."""

    def __init__(self, path: Path, t0: float) -> None:
        super().__init__(daemon=True)
        self.path, self.t0, self.arrivals = Path(path), t0, []
        self._halt = threading.Event()

    def run(self) -> None:
        seen = 0
        while not self._halt.is_set():
            self._poll(seen)
            seen = len(self.arrivals)
            time.sleep(0.01)
        self._poll(len(self.arrivals))

    def _poll(self, seen: int) -> None:
        if self.path.exists():
            n = sum(1 for line in self.path.read_text().splitlines() if line.strip())
            self.arrivals += [time.monotonic() - self.t0] * (n - seen)

    def stop(self) -> float | None:
        """Stop; seconds from fit start to the first line (None if none arrived)."""
        self._halt.set()
        self.join()
        return self.arrivals[0] if self.arrivals else None


class GpuMemPoller(threading.Thread):
    """Peak ``nvidia-smi`` memory.used per GPU (MiB) while a fit runs; inactive without nvidia-smi."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_mib: dict[int, float] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used",
                                      "--format=csv,noheader,nounits"], capture_output=True,
                                     text=True, timeout=5, check=True).stdout
            except (OSError, subprocess.SubprocessError):
                return
            for line in out.strip().splitlines():
                idx, used = (float(x) for x in line.split(","))
                self.peak_mib[int(idx)] = max(self.peak_mib.get(int(idx), 0.0), used)
            time.sleep(0.2)

    def stop(self) -> dict[int, float]:
        self._halt.set()
        self.join()
        return dict(self.peak_mib)


def step_seconds(lines: Sequence[dict]) -> dict[int, float]:
    """``{step: seconds}`` of the steps whose line carries a throughput (log_every=1: one step each)."""
    return {int(m["step"]): 1.0 / m["train/steps_per_s"] for m in lines
            if "train/steps_per_s" in m and m["train/steps_per_s"] > 0}


def throughput(lines: Sequence[dict], *, bench: Bench, world: int, after_ckpt: int | None) -> dict:
    """tokens/s (total and per GPU) over the steps after the warm-up, the checkpoint step excluded."""
    secs = step_seconds(lines)
    kept = {s: t for s, t in secs.items() if s > bench.warmup_steps and s != after_ckpt}
    if not kept:
        raise ValueError(f"no measured step left (lines for steps {sorted(secs)}, warm-up {bench.warmup_steps})")
    total = len(kept) * bench.tokens_per_step / sum(kept.values())
    return {"tokens_per_s": total, "tokens_per_s_per_gpu": total / world,
            "step_ms_median": 1e3 * statistics.median(kept.values()), "steps_measured": len(kept)}


def save_seconds(lines: Sequence[dict], *, ckpt_at: int, warmup_steps: int) -> float | None:
    """Blocking checkpoint time: the step after the mid-run save minus the median measured step."""
    secs = step_seconds(lines)
    if ckpt_at + 1 not in secs:
        return None
    normal = [t for s, t in secs.items() if s > warmup_steps and s != ckpt_at + 1]
    return secs[ckpt_at + 1] - statistics.median(normal) if normal else None


def timed_fit(spec: dict, *, out_dir: Path, run_name: str, storage: Path, case: Case, device: str,
              stop_after: int | None = None) -> dict:
    """One ``fit`` with its wall time, time to the first metrics line and GPU memory peak."""
    from phaselab.workloads.train.ray_entry import fit, read_metrics

    t0 = time.monotonic()
    watcher, mem = LineWatcher(out_dir / "metrics.jsonl", t0), GpuMemPoller()
    watcher.start()
    if device == "cuda":
        mem.start()
    error = None
    try:
        outcome = fit(spec, out_dir=out_dir, run_name=run_name, storage_path=storage,
                      num_workers=case.world, use_gpu=device == "cuda", max_failures=0,
                      stop_after=stop_after)
    except Exception as exc:  # noqa: BLE001 - one failed case must not lose the other cases
        outcome, error = None, f"{type(exc).__name__}: {str(exc)[:2000]}"
    wall = time.monotonic() - t0
    first_line = watcher.stop()
    peak = mem.stop() if device == "cuda" else {}
    return {"wall_s": wall, "first_line_s": first_line, "error": error,
            "peak_mib_by_gpu": peak, "lines": read_metrics(out_dir / "metrics.jsonl"),
            "metrics": outcome.metrics if outcome else {}}


def run_case(case: Case, bench: Bench, work: Path, tag: str) -> dict:
    """The uninterrupted run of one case and the numbers derived from its metrics.jsonl."""
    out_dir = work / f"{case.key}-{tag}"
    r = timed_fit(build_spec(case, bench), out_dir=out_dir, run_name=f"scal-{case.key}-{tag}",
                  storage=work / "ray_train", case=case, device=bench.device)
    row = {**dataclasses.asdict(case), "metrics_path": str(out_dir / "metrics.jsonl"),
           "micro_batch": bench.micro_batch, "grad_accum": bench.max_world // case.world,
           "wall_s": r["wall_s"], "first_line_s": r["first_line_s"], "error": r["error"]}
    if r["error"]:
        return row
    train = [m for m in r["lines"] if "train/loss" in m]
    row |= throughput(train, bench=bench, world=case.world, after_ckpt=bench.ckpt_at + 1)
    row["ckpt_save_s"] = save_seconds(train, ckpt_at=bench.ckpt_at, warmup_steps=bench.warmup_steps)
    row["first_loss"], row["final_loss"] = train[0]["train/loss"], train[-1]["train/loss"]
    row["losses"] = {str(int(m["step"])): m["train/loss"] for m in train}  # plots without the run folder
    row["valid_loss"] = r["metrics"].get("valid/loss")
    peaks = r["peak_mib_by_gpu"]
    row["peak_mem_gib_max_gpu"] = max(peaks.values()) / 1024 if peaks else None
    row["peak_mem_gib_by_gpu"] = {str(k): v / 1024 for k, v in sorted(peaks.items())} or None
    return row


def run_resume(case: Case, bench: Bench, work: Path, tag: str, reference: dict) -> dict:
    """Kill after the mid-run checkpoint (``stop_after``), resume by re-running ``fit`` with the
    same run name, and compare the resumed losses with the uninterrupted ``reference`` run."""
    from plot_loss_curves import load_losses, max_rel_diff

    spec, name = build_spec(case, bench), f"scal-{case.key}-{tag}-resume"
    kill_at = bench.ckpt_at + 2
    killed = timed_fit(spec, out_dir=work / f"{case.key}-{tag}-killed", run_name=name,
                       storage=work / "ray_train", case=case, device=bench.device, stop_after=kill_at)
    row = {**dataclasses.asdict(case), "killed_after_step": kill_at, "checkpoint_step": bench.ckpt_at,
           "kill_error": killed["error"]}
    if killed["error"]:
        return row
    resumed_dir = work / f"{case.key}-{tag}-resumed"
    resumed = timed_fit(spec, out_dir=resumed_dir, run_name=name, storage=work / "ray_train",
                        case=case, device=bench.device)
    row["resume_error"] = resumed["error"]
    if resumed["error"]:
        return row
    steps = sorted(load_losses(resumed_dir / "metrics.jsonl"))
    row["resumed_first_step"] = steps[0]
    row["resumed_last_step"] = steps[-1]
    row["restored_from_checkpoint"] = steps[0] == bench.ckpt_at + 1
    ref = {int(k): v for k, v in reference["losses"].items()}
    row |= {f"vs_uninterrupted_{k}": v for k, v in max_rel_diff(
        ref, load_losses(resumed_dir / "metrics.jsonl")).items()}
    if killed["first_line_s"] and resumed["first_line_s"]:
        # the killed run is the same spec, world and run name started just before: its time to
        # the first line is the resumed run's minus the restore (both include one warm-up step)
        row["restore_s_est"] = resumed["first_line_s"] - killed["first_line_s"]
    row["resumed_wall_s"] = resumed["wall_s"]
    return row


def add_efficiency(rows: list[dict]) -> list[dict]:
    """Efficiency 1 -> N for every case that has a 1-worker partner."""
    base = {(r["preset"], r["encoding"], r["zero_stage"]): r for r in rows
            if r["world"] == 1 and not r["error"]}
    out = []
    for r in rows:
        b = base.get((r["preset"], r["encoding"], r["zero_stage"]))
        if r["world"] > 1 and b is not None and not r["error"]:
            eff = r["tokens_per_s"] / (r["world"] * b["tokens_per_s"])
            r["efficiency_vs_1"] = eff
            out.append({"preset": r["preset"], "encoding": r["encoding"], "zero_stage": r["zero_stage"],
                        "from": 1, "to": r["world"], "efficiency": eff})
    return out


def loss_curve_checks(results: dict, out_dir: Path, stem: str) -> dict:
    from plot_loss_curves import compare, groups_from_results

    checks = {}
    for key, runs in groups_from_results(results).items():
        png = out_dir / f"{stem}-loss-{key}.png"
        diffs = compare(runs, png, title=f"{key}: same global batch ({results['card']})")
        checks[key] = {"png": str(png.relative_to(ROOT) if png.is_relative_to(ROOT) else png),
                       **{label: d for label, d in diffs.items()}}
    return checks


def card(device: str) -> str:
    if device == "cuda":
        try:
            names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=10, check=True).stdout.split("\n")
            names = [n for n in names if n.strip()]
            return f"{len(names)} x {names[0]}" if names else "cuda (no nvidia-smi names)"
        except (OSError, subprocess.SubprocessError):
            return "cuda (nvidia-smi unavailable)"
    return f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def _fmt(v, spec: str = ".3g") -> str:
    return "—" if v is None else format(v, spec)


COLUMNS = ("preset", "PE", "ZeRO", "workers", "micro x accum", "tokens/s/worker", "eff 1->N",
           "step ms", "peak mem GiB", "ckpt save s", "loss first->last")


def table_rows(results: dict) -> list[list[str]]:
    rows = []
    for r in results["cases"]:
        if r.get("error"):
            rows.append([r["preset"], r["encoding"], str(r["zero_stage"]), str(r["world"]), "", "FAILED",
                         "", "", "", "", r["error"][:60]])
            continue
        rows.append([r["preset"], r["encoding"], str(r["zero_stage"]), str(r["world"]),
                     f"{r['micro_batch']} x {r['grad_accum']}", f"{r['tokens_per_s_per_gpu']:,.0f}",
                     _fmt(r.get("efficiency_vs_1"), ".1%"), f"{r['step_ms_median']:.1f}",
                     _fmt(r.get("peak_mem_gib_max_gpu"), ".1f"), _fmt(r.get("ckpt_save_s"), ".2f"),
                     f"{r['first_loss']:.3f} -> {r['final_loss']:.3f}"])
    return rows


def print_table(results: dict) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text without rich
        print(" | ".join(COLUMNS))
        for row in table_rows(results):
            print(" | ".join(row))
        return
    t = Table(title=f"{results['title']} — {results['card']}")
    for c in COLUMNS:
        t.add_column(c)
    for row in table_rows(results):
        t.add_row(*row)
    Console().print(t)


def markdown(results: dict) -> str:
    lines = [f"# {results['title']}", "", f"- Card: {results['card']}", f"- Date: {results['date']}",
             f"- Command: `{results['command']}`", f"- Software: {results['software']}",
             f"- Setup: {results['setup']}", ""]
    lines += [f"> {n}" for n in results["notes"]] + [""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    if results["resume"]:
        lines += ["", "## Kill and resume (same world size)", "",
                  ("| preset | PE | ZeRO | workers | killed after | resumed from step | restore s (est.) "
                  "| max rel. loss diff vs uninterrupted | error |"), "|---|---|---|---|---|---|---|---|---|"]
        for r in results["resume"]:
            err = r.get("kill_error") or r.get("resume_error") or ""
            lines.append(f"| {r['preset']} | {r['encoding']} | {r['zero_stage']} | {r['world']} | "
                         f"{r['killed_after_step']} | {r.get('resumed_first_step', '—')} | "
                         f"{_fmt(r.get('restore_s_est'), '.2f')} | "
                         f"{_fmt(r.get('vs_uninterrupted_max_rel_diff'), '.2e')} | {err[:80]} |")
    if results["loss_curves"]:
        lines += ["", "## Loss curves, same global batch (reference: 1 worker)", ""]
        for key, chk in results["loss_curves"].items():
            parts = [f"{label}: max rel. diff {d['max_rel_diff']:.2e} at step {int(d['at_step'])}"
                     for label, d in chk.items() if label != "png"]
            plot = f" ![{key}]({Path(chk['png']).name})" if chk.get("png") else ""
            lines.append(f"- {key}: {'; '.join(parts)}{plot}")
    if results["missing"]:
        lines += ["", "## Not measured", ""] + [f"- {m}" for m in results["missing"]]
    return "\n".join(lines) + "\n"


def _software() -> str:
    import importlib.metadata as md

    parts = [f"python {platform.python_version()}"]
    for pkg in ("torch", "ray", "deepspeed", "triton"):
        try:
            parts.append(f"{pkg} {md.version(pkg)}")
        except md.PackageNotFoundError:
            pass
    return ", ".join(parts)


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


def describe(args: argparse.Namespace, bench: Bench, command: str) -> dict:
    """Everything in the results file except the per-case numbers."""
    cpu = args.device == "cpu"
    return {
        "title": "Scaling, CPU SMOKE (not H200 results)" if cpu else "Scaling: DeepSpeed ZeRO on Ray Train V2",
        "device": args.device, "card": card(args.device),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command, "software": _software(),
        "setup": (f"global batch {bench.batch_size} x {bench.block_size} tokens, micro-batch "
                  f"{bench.micro_batch}, grad_accum = {bench.max_world}/world, {bench.steps} steps, "
                  f"first {bench.warmup_steps} steps and step {bench.ckpt_at + 1} (after the mid-run "
                  f"checkpoint) excluded, {'fp32/gloo' if cpu else 'bf16/NCCL'}, "
                  f"data: Tiny Shakespeare ({'char' if cpu else 'GPT-2 BPE'})"),
        "bench": dataclasses.asdict(bench),
        "notes": ([("CPU smoke: tiny model, fp32, gloo, Ray workers sharing a 2-core machine with other "
                    "jobs. These numbers check the measuring machinery; they say NOTHING about GPU "
                    "scaling (the 2 workers compete for the same cores).")] if cpu else [])
                 + ["tokens/s per worker = global tokens/s / world (rank 0's wall clock, log_every=1).",
                    ("ckpt save s = the step after the mid-run checkpoint minus the median step "
                     "(blocking part: shards, consolidated model.pt, barrier, ray.train.report with "
                     "async upload)."),
                    ("restore s (est.) = time to the first metrics line of the resumed fit minus that "
                     "of the killed fit (same spec and world, started just before): includes Ray "
                     "start-up jitter (seconds on a loaded CPU).")],
        "missing": [
            ("Peak memory per GPU from the training loop: loop.train logs no memory. "
             + ("Measured here from nvidia-smi memory.used (context + allocator cache). " if not cpu
                else "Not measured on CPU. ")
             + "To add: in loop.train's log_every metrics, `train/peak_mem_gib = "
               "torch.cuda.max_memory_allocated(device) / 2**30` on CUDA (and reset_peak_memory_stats "
               "after the first step)."),
            ("Checkpoint save/load times are not logged by the loop/ray_entry; to add: time "
             "`_report` (save) and the `engine.load` block in train_loop_per_worker and log them as "
             "`ckpt/save_s` / `ckpt/load_s` to metrics.jsonl (rank 0).")],
    }


def write_results(results: dict, out: Path, *, plots: bool) -> None:
    """Efficiency and loss-curve checks from the cases, then ``out``.json and ``out``.md."""
    from plot_loss_curves import groups_from_results, max_rel_diff

    results["efficiency"] = add_efficiency(results["cases"])
    if plots:
        results["loss_curves"] = loss_curve_checks(results, out.parent, out.name)
    else:  # the numbers without the PNGs (device runs: at most 8 files come back)
        results["loss_curves"] = {}
        for key, runs in groups_from_results(results).items():
            labels = list(runs)
            results["loss_curves"][key] = {"png": "", **{
                lab: max_rel_diff({int(k): v for k, v in runs[labels[0]].items()},
                                  {int(k): v for k, v in runs[lab].items()}) for lab in labels[1:]}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    out.with_suffix(".md").write_text(markdown(results))


def merge(files: Sequence[Path], out: Path, *, plots: bool) -> dict:
    """Several result files of one study (one per device call) -> one; later cases replace
    earlier ones with the same (preset, encoding, zero, world)."""
    docs = [json.loads(Path(f).read_text()) for f in files]
    merged = {k: v for k, v in docs[0].items() if k not in ("cases", "resume", "efficiency", "loss_curves")}
    cases: dict[tuple, dict] = {}
    resume: dict[tuple, dict] = {}
    for d in docs:
        if d["device"] != merged["device"] or d["setup"] != merged["setup"]:
            raise ValueError(f"cannot merge results of different setups: {d['setup']!r} vs {merged['setup']!r}")
        for r in d["cases"]:
            cases[(r["preset"], r["encoding"], r["zero_stage"], r["world"])] = r
        for r in d["resume"]:
            resume[(r["preset"], r["encoding"], r["zero_stage"], r["world"])] = r
    merged["command"] = " ; ".join(d["command"] for d in docs)
    merged["date"] = ", ".join(sorted({d["date"] for d in docs}))
    merged["cases"], merged["resume"] = list(cases.values()), list(resume.values())
    write_results(merged, out, plots=plots)
    return merged


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
            "tokens_per_s_per_gpu", "ckpt_save_s", "peak_mem_gib_max_gpu", "wall_s", "error")}), flush=True)
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
