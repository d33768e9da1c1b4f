"""Where a grid's time goes when it runs through ``phaselab run``: per stage wall time split into
start-up, setup, train, eval, checkpoint and other, each stage's share in training steps, the
grid's wall time and its GPU efficiency.

Each repeat runs ``phaselab run GRID [OVERRIDES]`` as a subprocess (a fresh Python, a fresh local
Ray cluster) in a fresh temporary folder that holds its catalog, MLflow store and run folders,
so nothing is cached and nothing of the caller's project is read or written. Then it reads the
catalog that run wrote:

- a stage's wall time is its attempt's start (the controller's claim) to its finish in the
  catalog; start-up is that minus the training loop's own total (scheduling, the worker process,
  imports, the tracker); the loop's phases are its ``time/*_s`` metrics
  (``workloads/train/session.time_breakdown``);
- the grid's wall time is the ``phaselab run`` command's, process start to exit (Ray start-up and
  MLflow included); "span" is the first stage's start to the last one's finish;
- GPU efficiency is the stages' training-step time over their wall time, summed over the stages
  that held a GPU (over all stages on a CPU-only run), as ``phaselab status`` reports it.

With ``--repeat N`` the table is the median repeat's (by grid wall time) and the JSON has all.

    python benchmarks/grid_efficiency.py quickstart --repeat 3
    python benchmarks/grid_efficiency.py pope_jsb 'seeds=[0,1,2]' --out benchmarks/results/grid-efficiency-h200-pope-jsb
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
import time
from pathlib import Path
from typing import Any

COLUMNS = ("wall", "startup", "setup", "train", "eval", "ckpt", "other")


def run_grid(grid: str, overrides: list[str], work: Path, *, mlflow: bool, num_cpus: int | None) -> dict[str, Any]:
    """One ``phaselab run`` in ``work`` (its catalog, runs and MLflow store): returncode, wall
    seconds and the output's tail when it failed."""
    work.mkdir(parents=True, exist_ok=True)
    catalog = f"sqlite:///{work}/.phaselab/catalog.db"
    cmd = [sys.executable, "-m", "phaselab.orchestrator.cli.main", "run", grid, *overrides,
           "--catalog", catalog, "--runs-root", str(work / ".phaselab" / "runs"),
           "--mlflow" if mlflow else "--no-mlflow", *(["--num-cpus", str(num_cpus)] if num_cpus else [])]
    env = {**os.environ, "PHASELAB_HOME": str(work), "COLUMNS": "160"}
    env.pop("RAY_ADDRESS", None)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    return {"catalog": catalog, "returncode": proc.returncode, "wall_s": wall,
            "tail": "" if proc.returncode == 0 else (proc.stdout[-1500:] + proc.stderr[-2500:])}


def read_catalog(catalog: str, grid: str) -> dict[str, Any]:
    """Per stage (label, kind, state, gpu, times) and the grid's efficiency, from the catalog."""
    from phaselab.catalog.store.api import CatalogStore
    from phaselab.orchestrator.cli.timing import TIME_PREFIX, efficiency, stage_times

    store = CatalogStore(catalog)
    try:
        meta = store.reads.get_grid(grid)
        if meta is None:
            raise RuntimeError(f"grid {grid!r} is not in the catalog {catalog}")
        rows = store.stages_for_grid(meta["id"])
        metrics = store.reads.final_metrics([r.stage_hash for r in rows], TIME_PREFIX)
        stages = []
        for r in rows:
            wall = (r.finished_at - r.started_at).total_seconds() if r.started_at and r.finished_at else None
            cells = store.reads.cells_for_stage(r.stage_hash)
            label = f"{r.name}[{cells[0]['cell_key']}]" if cells else r.name
            stages.append({"stage": label, "kind": r.kind, "hash": r.stage_hash[:12], "state": r.state,
                           "gpu": bool(r.gpu_seconds), "seconds": wall,
                           "started": r.started_at.timestamp() if r.started_at else None,
                           "finished": r.finished_at.timestamp() if r.finished_at else None,
                           "times": stage_times(wall, metrics.get(r.stage_hash))})
    finally:
        store.dispose()
    starts = [s["started"] for s in stages if s["started"]]
    ends = [s["finished"] for s in stages if s["finished"]]
    return {"stages": stages, "efficiency": efficiency(stages),
            "span_s": max(ends) - min(starts) if starts and ends else None}


def card() -> str:
    """The GPU's name (nvidia-smi), else the CPU's model and the cores this process may use."""
    from phaselab.orchestrator.plan.placement import local_gpu

    gpu = local_gpu()
    if gpu is not None:
        return gpu["name"]
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {len(os.sched_getaffinity(0))} cores"


def _commit() -> str:
    """PHASELAB_GIT_COMMIT where set (a copied working tree's .git may be another commit's, as on
    the GPU machines), else git's HEAD with +dirty, else "unknown"."""
    if os.environ.get("PHASELAB_GIT_COMMIT"):
        return os.environ["PHASELAB_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False,
                             cwd=Path(__file__).resolve().parent)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=False, cwd=Path(__file__).resolve().parent)
        if out.returncode == 0:
            return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except OSError:
        pass
    return "unknown"


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.1f}"


def markdown(result: dict[str, Any]) -> str:
    meta, best = result["meta"], result["runs"][result["median_run"]]
    lines = [f"# Grid efficiency: {meta['grid']} ({meta['card']}, {meta['date']})", "",
             (f"Command: `{meta['command']}`; commit {meta['commit']}; "
             f"{'MLflow on' if meta['mlflow'] else 'MLflow off'}."), "",
             "| stage | state | GPU | " + " | ".join(COLUMNS) + " | train % |",
             "|---|---|---|" + "---:|" * (len(COLUMNS) + 1)]
    for s in best["stages"]:
        t = s["times"] or {}
        share = f"{100 * t['train'] / t['wall']:.0f}%" if t.get("wall") else ""
        wall = t.get("wall", s["seconds"])
        lines.append(f"| {s['stage']} | {s['state']} | {'yes' if s['gpu'] else 'no'} | {_fmt(wall)} | "
                     + " | ".join(_fmt(t.get(c)) for c in COLUMNS[1:]) + f" | {share} |")
    eff = best["efficiency"] or {}
    walls = ", ".join(f"{r['wall_s']:.1f}" for r in result["runs"])
    lines += ["", (f"Grid wall time (the `phaselab run` command): **{best['wall_s']:.1f} s** "
              f"(median of {len(result['runs'])}: {walls} s); first stage start to last finish "
              f"{_fmt(best['span_s'])} s."),
              (f"{'GPU efficiency' if eff.get('scope') == 'gpu' else 'Training-step share (no GPU stage)'}: "
              f"**{100 * eff.get('value', 0.0):.1f} %** ({_fmt(eff.get('train_s'))} s of training steps over "
              f"{_fmt(eff.get('wall_s'))} s of stage wall time, {eff.get('stages', 0)} stages).")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grid", help="shipped grid name or grid file")
    ap.add_argument("overrides", nargs="*", help="phaselab overrides (key=value, e.g. 'seeds=[0,1,2]')")
    ap.add_argument("--repeat", type=int, default=1, help="runs, each in a fresh folder (default 1)")
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false", help="run with --no-mlflow")
    ap.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray cluster")
    ap.add_argument("--work", type=Path, default=None, help="keep the run folders here (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    work = args.work or Path(tempfile.mkdtemp(prefix="phaselab-grid-eff-"))
    runs = []
    for i in range(args.repeat):
        run = run_grid(args.grid, args.overrides, work / f"run{i}", mlflow=args.mlflow, num_cpus=args.num_cpus)
        if run["returncode"] != 0:
            print(f"[grid_efficiency] phaselab run exited {run['returncode']}:\n{run['tail']}", file=sys.stderr)
            return 1
        grid = _grid_name(args.grid)
        run |= read_catalog(run["catalog"], grid)
        runs.append(run)
        print(f"[grid_efficiency] run {i}: {run['wall_s']:.1f} s, efficiency "
              f"{json.dumps(run['efficiency'])}", flush=True)
    order = sorted(range(len(runs)), key=lambda i: runs[i]["wall_s"])
    meta = {"grid": args.grid, "overrides": args.overrides, "card": card(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%MZ"),
            "command": " ".join(shlex.quote(a) for a in ["python", "benchmarks/grid_efficiency.py",
                                                         *(sys.argv[1:] if argv is None else argv)]),
            "commit": _commit(),
            "mlflow": args.mlflow, "python": platform.python_version(), "versions": _versions(),
            "env": {k: os.environ[k] for k in ("CUDA_MPS_PIPE_DIRECTORY",
                                               "PHASELAB_GPU_MEMORY_GB") if k in os.environ}}
    result = {"meta": meta, "runs": runs, "median_run": order[len(order) // 2],
              "median_wall_s": statistics.median(r["wall_s"] for r in runs)}
    text = markdown(result)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        args.out.with_suffix(".md").write_text(text)
    return 0


def _grid_name(grid: str) -> str:
    """The ``grid:`` name of a shipped grid or a grid file."""
    from phaselab.orchestrator.plan.dag import load_grid

    return load_grid(grid, [])[0].grid


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("torch", "triton", "ray"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


if __name__ == "__main__":
    sys.exit(main())
