"""Small models at GPU speed: steps/s and GPU busy fraction of the papers' small models.

Part 1 (one process): the Indirect Indexing model (``ii-8l512``, batch 64 x 48) and the JSB model
(``jsb-6l256``, batch 4 x 2048) for RoPE (sdpa), PoPE and TAPA (triton), each with three steps:
``eager`` (TorchEngine), ``compiled`` (TorchEngine, ``train.compile``) and ``graphs`` (the
graph-captured step, ``train.cuda_graphs``). Every row runs the real loop
(``workloads.train.loop.train``: batch building, H2D copies, NaN/Inf checks, clip, AdamW, δ
projection) for ``--steps`` steps; steps/s is the median of the loop's own ``train/steps_per_s``
windows after the first two. GPU busy is NVML's utilisation (the fraction of time a kernel ran),
sampled every 50 ms over the middle 60 % of the run.

Part 2 (``--pack 1,2,4``): N Indirect Indexing stages (the paper's model, graphs on) packed on one
GPU through ``phaselab run`` (``resources.gpus: 1/N``, Ray Train, one process and CUDA context per
stage). Aggregate steps/s = the sum over stages of each stage's median ``train/steps_per_s``
while all N ran; wall = the ``phaselab run`` command's seconds, start-up included.

``--profile N``: after a graph row's timed run, N more replays of its captured step timed by CUDA
events (the wall time per step), then N + 1 replays under torch.profiler (``step_profile.py``):
the device time of the kernels the graph replays, by category and the kernels that take it,
against that wall time. Both read the last window's batches again.

Usage (GPU; results in benchmarks/results/small-models-h200.{json,md}):
    python benchmarks/small_models.py --steps 400 --pack 1,2,4 --out benchmarks/results/small-models-h200
    python benchmarks/small_models.py --device cpu --tiny --steps 12 --out /tmp/sm   # CPU smoke
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Self

import step_profile
import torch

from phaselab.catalog.tracking import RecordingTracker
from phaselab.orchestrator.plan.dag import stage_config
from phaselab.workloads.data import build_dataset
from phaselab.workloads.train.api import build_model, parse_spec
from phaselab.workloads.train.fast_step import engine_for
from phaselab.workloads.train.loop import resolve_device, train
from phaselab.workloads.train.optim import build_optimizer

# model -> (shipped grid, training stage, axes of the cell whose config is taken); the encoding
# is then set on that config, so every encoding runs the paper's configuration from the grid
GRIDS = {"ii-8l512": ("pope_indirect_indexing", "train", {"variant": "pope"}),
         "jsb-6l256": ("pope_jsb", "train", {"pe": "pope"})}
BACKEND = {"rope": "sdpa", "pope": "triton", "tapa": "triton"}
# mode -> overrides of the grid config's sections; graphs-thread builds batches in the trainer's own
# background thread (data.num_workers 0) instead of worker processes, to show what they buy
MODES = {"eager": {}, "compiled": {"train": {"compile": True}}, "graphs": {"train": {"cuda_graphs": True}},
         "graphs-thread": {"train": {"cuda_graphs": True}, "data": {"num_workers": 0}},
         "graphs-compiled": {"train": {"cuda_graphs": True, "compile": True}}}


class BusySampler:
    """NVML GPU utilisation every ``period`` s in a thread (None off CUDA or without pynvml)."""

    def __init__(self, period: float = 0.05) -> None:
        self.samples: list[int] = []
        self.period, self._stop = period, threading.Event()
        try:
            import pynvml
            pynvml.nvmlInit()
            index = torch.cuda.current_device() if torch.cuda.is_available() else None
            self._handle = None if index is None else pynvml.nvmlDeviceGetHandleByIndex(index)
            self._nvml = pynvml
        except Exception:  # noqa: BLE001 (no NVML: busy is reported as None)
            self._handle = None

    def __enter__(self) -> Self:
        if self._handle is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def busy(self) -> float | None:
        n = len(self.samples)
        middle = self.samples[n // 5: n - n // 5]
        return statistics.fmean(middle) / 100 if middle else None


def spec_for(name: str, encoding: str, mode: str, *, steps: int, tiny: bool) -> dict[str, Any]:
    """``encoding`` is ``pe`` or ``pe:backend`` (e.g. ``tapa:reference``; default BACKEND[pe])."""
    pe, _, backend = encoding.partition(":")
    grid, stage, axes = GRIDS[name]
    config = stage_config(grid, stage, **axes)
    spec = {k: json.loads(json.dumps(config[k])) for k in ("model", "data", "train") if k in config}
    spec["model"]["pe"]["kind"] = pe
    spec["train"] |= {"steps": steps, "decay_steps": steps, "warmup": 10, "eval_every": 0,
                      "eval_batches": 1, "final_eval_batches": 1, "ckpt_every": 0,
                      "log_every": max(5, steps // 20)} | MODES[mode].get("train", {})
    spec["data"] = dict(spec["data"]) | MODES[mode].get("data", {})
    spec["model"] = dict(spec["model"]) | {"attention": {"backend": backend or BACKEND[pe]}}
    if tiny:   # CPU smoke: the same loop on a model a 2-core machine runs in seconds
        spec["model"] |= {"n_layer": 1, "d_model": 64, "n_head": 2, "attention": {"backend": "reference"}}
        spec["data"] = dict(spec["data"]) | ({"block_size": 256} if name.startswith("jsb") else {})
        spec["model"]["block_size"] = spec["data"].get("block_size", spec["model"]["block_size"])
    return spec


def profile_replays(engine: Any, steps: int) -> dict[str, Any] | None:
    """Wall time of ``steps`` more replays of the captured step (CUDA events, no profiler), then the
    same replays under torch.profiler: the kernels the graph runs and the device time they take.
    None without a graph."""
    graph = getattr(engine, "graph", None)
    if graph is None or steps <= 0 or steps > engine.window_cap:
        return None
    dev = engine.device
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(dev)
    engine.cursor.zero_()
    start.record()
    for _ in range(steps):
        graph.replay()
    stop.record()
    torch.cuda.synchronize(dev)
    wall_ms = start.elapsed_time(stop) / steps
    engine.cursor.zero_()
    prof = step_profile.make_profiler(dev, skip=0, steps=steps)
    with prof:
        for _ in range(steps + 1):
            graph.replay()
            # each step's kernels finish inside its own profiler step: replays are queued ahead
            # of the GPU, so without this the recorded window is shifted by the queue
            torch.cuda.synchronize(dev)
            prof.step()
    engine.cursor.zero_()
    return step_profile.summary(prof, device=dev, steps=steps, wall_ms_per_step=wall_ms, top=16)


def measure(name: str, pe: str, mode: str, *, steps: int, tiny: bool, device: str,
            profile: int = 0) -> dict[str, Any]:
    """One row of part 1: the real loop for ``steps`` steps; median windowed steps/s."""
    spec = spec_for(name, pe, mode, steps=steps, tiny=tiny)
    spec["train"]["device"] = device
    parsed = parse_spec(spec)
    cfg = parsed.train
    dev = resolve_device(cfg.device)
    dataset = build_dataset(parsed.data)
    model = build_model(parsed, dataset, None).to(dev)
    optimizer = build_optimizer(model, cfg.optim)
    engine = engine_for(model, optimizer, cfg, device=dev, block_size=dataset.block_size,
                        batch_workers=parsed.data.num_workers)
    tracker = RecordingTracker()
    t0 = time.perf_counter()
    with BusySampler() as sampler:
        train(engine, dataset, cfg, tracker=tracker, start_step=0, save=lambda step, metrics: None)
    wall = time.perf_counter() - t0
    rates = [m["train/steps_per_s"] for _, m in tracker.metrics if "train/steps_per_s" in m]
    steady = rates[2:] or rates
    prof = profile_replays(engine, profile)
    return {"model": name, "pe": pe.partition(":")[0], "backend": spec["model"]["attention"]["backend"],
            "mode": mode, "steps": steps, "batch_workers": getattr(engine, "batch_workers", None),
            "steps_per_s": statistics.median(steady) if steady else None,
            "gpu_busy": sampler.busy(), "wall_s": wall,
            "final_loss": next((m["train/loss"] for _, m in reversed(tracker.metrics) if "train/loss" in m), None),
            **({"profile": prof} if prof else {})}


PACK_GRID = """grid: pack{n}
description: {n} Indirect Indexing stages packed on one GPU (benchmarks/small_models.py)
seeds: {seeds}
defaults:
  model: {{preset: ii-8l512, pe: {{kind: rope}}, attention: {{backend: sdpa}}}}
  data: {{kind: indirect_indexing, block_size: 48}}
  train: {{steps: {steps}, batch_size: 64, lr: 2.0e-4, min_lr: 2.0e-5, warmup: 100,
          eval_every: 0, eval_batches: 1, final_eval_batches: 1, ckpt_every: 0, log_every: 200,
          cuda_graphs: true, compile: {compile}}}
  resources: {{gpus: {gpus}, cpus: 1, memory_gb: 4, num_workers: 1}}
  launcher: ray_train
stages:
  train:
    kind: pretrain
"""


def packed(n: int, *, steps: int, work: Path, mode: str = "graphs-compiled") -> dict[str, Any]:
    """Part 2: ``n`` stages of one grid on one GPU through ``phaselab run``, each with the graph step
    (``mode`` "graphs") or the graph step and ``torch.compile`` ("graphs-compiled")."""
    root = work / f"pack{n}"
    root.mkdir(parents=True, exist_ok=True)
    grid = root / "grid.yaml"
    compile_ = MODES[mode]["train"].get("compile", False)
    grid.write_text(PACK_GRID.format(n=n, seeds=list(range(n)), steps=steps, gpus=round(1 / n, 4),
                                     compile=str(compile_).lower()))
    cmd = [sys.executable, "-m", "phaselab.orchestrator.cli.main", "run", str(grid), "--no-mlflow",
           "--catalog", f"sqlite:///{root}/catalog.db", "--runs-root", str(root / "runs")]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    rates = []
    for path in sorted((root / "runs").rglob("metrics.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        r = [row["train/steps_per_s"] for row in rows if "train/steps_per_s" in row]
        if r:
            rates.append(statistics.median(r[1:-1] or r))
    return {"stages": n, "steps": steps, "mode": mode, "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")),
            "returncode": proc.returncode, "wall_s": wall,
            "per_stage_steps_per_s": rates, "aggregate_steps_per_s": sum(rates) if rates else None,
            "tail": proc.stdout[-800:] + proc.stderr[-1500:] if proc.returncode else ""}


def markdown(rows: list[dict], packs: list[dict], meta: dict) -> str:
    lines = [f"# Small-model training steps ({meta['card']}, {meta['date']})", "",
             f"Command: `{meta['command']}`; commit {meta['commit']}; torch {meta['torch']}.", "",
             "| model | pe | backend | step | steps/s | x eager | GPU busy | final loss |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    eager = {(r["model"], r["pe"]): r["steps_per_s"] for r in rows if r["mode"] == "eager"}
    for r in rows:
        base = eager.get((r["model"], r["pe"]))
        ratio = f"{r['steps_per_s'] / base:.2f}" if base and r["steps_per_s"] else ""
        busy = "" if r["gpu_busy"] is None else f"{r['gpu_busy']:.0%}"
        rate = "" if r["steps_per_s"] is None else f"{r['steps_per_s']:.1f}"
        loss = "" if r["final_loss"] is None else f"{r['final_loss']:.3f}"
        mode = r["mode"] + (f" ({r['batch_workers']} batch workers)" if r.get("batch_workers") else "")
        lines.append(f"| {r['model']} | {r['pe']} | {r['backend']} | {mode} | {rate} | {ratio} | "
                     f"{busy} | {loss} |")
    if packs:
        one = packs[0]["aggregate_steps_per_s"]
        lines += ["", f"Packed on one GPU through `phaselab run` (ii-8l512, RoPE, {packs[0].get('mode', 'graphs')}):", "",
                  "| stages | MPS | gpus each | aggregate steps/s | x one | per stage | wall s |",
                  "|---:|---|---:|---:|---:|---|---:|"]
        for p in packs:
            agg = p["aggregate_steps_per_s"]
            ratio = f"{agg / one:.2f}" if agg and one else ""
            per = ", ".join(f"{r:.0f}" for r in p["per_stage_steps_per_s"])
            mps = "yes" if p.get("mps") else "no"
            lines.append(f"| {p['stages']} | {mps} | {1 / p['stages']:.2f} | {agg or 0:.1f} | {ratio} | {per} | "
                         f"{p['wall_s']:.0f} |")
    for r in rows:
        if r.get("profile"):
            case = f"{r['model']} {r['pe']} ({r['backend']}) {r['mode']}"
            if r["profile"]["top"]:
                lines += ["", step_profile.markdown(case, r["profile"])]
            else:
                lines += ["", (f"### {case}: wall {r['profile']['wall_ms_per_step']:.2f} ms/step over "
                          f"{r['profile']['steps']} replays; the profiler recorded no device events in "
                          "this process, so there is no kernel breakdown")]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(GRIDS))
    ap.add_argument("--encodings", default="rope,pope,tapa")
    ap.add_argument("--modes", default="eager,compiled,graphs")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--pack", default="", help="comma list of stage counts for part 2, e.g. 1,2,4")
    ap.add_argument("--pack-steps", type=int, default=3000)
    ap.add_argument("--pack-mode", default="graphs-compiled", choices=("graphs", "graphs-compiled"),
                    help="the step of each packed stage")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke: 1-layer models")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="profile N replays of each graph row's captured step after its timed run")
    ap.add_argument("--budget-s", type=float, default=1e9, help="skip the remaining rows after this")
    ap.add_argument("--out", required=True, type=Path, help="path prefix of the .json and .md")
    args = ap.parse_args()
    t_start, rows = time.perf_counter(), []
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            for pe in args.encodings.split(","):
                if time.perf_counter() - t_start > args.budget_s:
                    print(f"[small_models] budget reached: skipping {name} {pe} {mode}", flush=True)
                    continue
                row = measure(name, pe, mode, steps=args.steps, tiny=args.tiny, device=args.device,
                              profile=args.profile)
                rows.append(row)
                print(f"[small_models] {json.dumps(row)}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="phaselab-pack-"))
    packs = []
    for n in [int(v) for v in args.pack.split(",") if v]:
        packs.append(packed(n, steps=args.pack_steps, work=work, mode=args.pack_mode))
        print(f"[small_models] {json.dumps(packs[-1])}", flush=True)
    card = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    meta = {"card": card, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
            "commit": os.environ.get("PHASELAB_GIT_COMMIT", "unknown")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows, "packed": packs}, indent=1))
    table = markdown(rows, packs, meta)
    args.out.with_suffix(".md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
