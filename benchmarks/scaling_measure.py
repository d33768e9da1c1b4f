"""Scaling study (benchmarks/scaling.py): one timed ``ray_entry.fit`` per case and the numbers derived from
the lines rank 0 writes to its ``metrics.jsonl`` (the method is described in
``benchmarks/scaling.py``'s docstring): per step ``train/loss``, ``train/steps_per_s`` and, on
CUDA, ``train/peak_mem_gib``; per checkpoint ``ckpt/save_s``; on a resume ``ckpt/load_s``.
"""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from scaling_cases import Bench, Case, build_spec


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

    def stop(self) -> list[float]:
        """Stop; seconds from fit start to each line, in file order."""
        self._halt.set()
        self.join()
        return list(self.arrivals)


def first_train_line_s(lines: Sequence[dict], arrivals: Sequence[float]) -> float | None:
    """Seconds to the first ``train/loss`` line (a resumed run writes ``ckpt/load_s`` before it)."""
    for line, t in zip(lines, arrivals):
        if "train/loss" in line:
            return t
    return None


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


def logged(lines: Sequence[dict], key: str) -> dict[int, float]:
    """``{step: value}`` of one metric the training loop logged (absent steps are absent)."""
    return {int(m["step"]): float(m[key]) for m in lines if key in m}


def telemetry(lines: Sequence[dict], *, bench: Bench) -> dict:
    """What the loop measured itself: checkpoint save times (blocking part, rank 0) at the mid-run
    and the final checkpoint, and rank 0's peak allocated memory (CUDA only; None on CPU)."""
    saves, peaks = logged(lines, "ckpt/save_s"), logged(lines, "train/peak_mem_gib")
    return {"ckpt_save_s": saves.get(bench.ckpt_at), "ckpt_save_s_final": saves.get(bench.steps),
            "peak_mem_gib_alloc": max(peaks.values()) if peaks else None}


def timed_fit(spec: dict, *, out_dir: Path, run_name: str, storage: Path, case: Case, device: str,
              stop_after: int | None = None) -> dict:
    """One ``fit`` with its wall time, time to the first train line and nvidia-smi memory peak."""
    from phaselab.catalog.tracking.run_folder import read_steps
    from phaselab.workloads.train.ray_entry import fit

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
    arrivals = watcher.stop()
    peak = mem.stop() if device == "cuda" else {}
    lines = read_steps(out_dir / "metrics.jsonl")
    return {"wall_s": wall, "first_line_s": first_train_line_s(lines, arrivals), "error": error,
            "peak_mib_by_gpu": peak, "lines": lines, "metrics": outcome.metrics if outcome else {}}


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
    row |= telemetry(r["lines"], bench=bench)
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
    row["ckpt_load_s"] = logged(resumed["lines"], "ckpt/load_s").get(bench.ckpt_at)
    if killed["first_line_s"] and resumed["first_line_s"]:
        # the killed run is the same spec, world and run name started just before: its time to
        # the first line is the resumed run's minus the restore (both include one warm-up step)
        row["restore_s_est"] = resumed["first_line_s"] - killed["first_line_s"]
    row["resumed_wall_s"] = resumed["wall_s"]
    return row
