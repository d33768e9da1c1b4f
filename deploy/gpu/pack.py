"""Pack one grid's results after ``run_grid.sh`` into a few small files (deploy/gpu/README.md).

Writes into ``--out``:

- ``run.json``: card, date, command, commit, wall time, stage states, package versions;
- ``tables.md``: the paper tables bound to the grid (``phaselab tables``), else the run's
  results pivot (one row per cell and stage, as ``phaselab run`` prints it);
- ``figures.tar``: the tables' figures (PNG and PDF), when a table draws one;
- ``export.tar``: ``phaselab export GRID --format parquet`` (hive-partitioned metrics and stages
  plus the provenance JSON), unchanged;
- ``curves.jsonl.gz``: every training stage's learning curve, one line per (stage, step), from
  the stage's ``metrics.jsonl`` (launcher ``ray_train``) or else its MLflow run's history.

The device copy of the repository has no ``.git``: the commit comes from ``PHASELAB_GIT_COMMIT``
(or ``git`` where there is a checkout). ``source_sha256`` hashes the Python sources as they
travelled, so a result can be matched to uncommitted code too.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tarfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("phaselab", "kernels", "workloads", "catalog", "orchestrator")
MAX_FILE_BYTES = 16 * 1024 * 1024      # what one returned file may hold
PACKAGES = ("torch", "triton", "ray", "deepspeed", "mlflow", "mlflow-skinny", "sqlalchemy", "numpy")


def grid_name(source: str) -> str:
    import yaml

    from phaselab.orchestrator.language.library import resolve_grid_path

    return str(yaml.safe_load(resolve_grid_path(source).read_text())["grid"])


def card() -> str:
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return f"cpu ({platform.processor() or platform.machine()})"
    names = [n.strip() for n in res.stdout.splitlines() if n.strip()]
    return ", ".join(names) if res.returncode == 0 and names else f"cpu ({platform.machine()})"


def git_commit() -> str | None:
    if os.environ.get("PHASELAB_GIT_COMMIT"):
        return os.environ["PHASELAB_GIT_COMMIT"]
    try:
        res = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    return res.stdout.strip() or None


def source_sha256() -> str:
    h = hashlib.sha256()
    for d in SOURCE_DIRS:
        for p in sorted((ROOT / d).rglob("*.py")):
            h.update(f"{p.relative_to(ROOT)}\0".encode() + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Python's and each distribution's version (None when not installed)."""
    from phaselab.catalog.store.fingerprint import package_versions

    return {"python": platform.python_version(), **package_versions(names)}


def tar_folder(src: Path, dest: Path, *, suffixes: tuple[str, ...] | None = None) -> list[str]:
    """Tar ``src``'s files (only ``suffixes`` if given) with paths relative to ``src``."""
    files = sorted(p for p in src.rglob("*") if p.is_file() and (suffixes is None or p.suffix in suffixes))
    if not files:
        return []
    with tarfile.open(dest, "w") as tar:
        for p in files:
            tar.add(p, arcname=str(p.relative_to(src)))
    return [str(p.relative_to(src)) for p in files]


def tables_for(grid: str) -> list[str]:
    from phaselab.catalog.reports.tables import TABLES, get_spec

    return [name for name in TABLES if grid in get_spec(name).grids]


def write_tables(store: Any, grid: str, work: Path, out: Path) -> dict[str, Any]:
    """Paper tables bound to ``grid`` (+ figures), else the generic results pivot."""
    from phaselab.catalog.reports.figures import CURVE_TABLES, render_figures
    from phaselab.catalog.reports.tables import get_spec, render_table

    names, texts, figures = tables_for(grid), [], []
    for name in names:
        rendered = render_table(store, get_spec(name), "md", out_dir=work / "tables")
        texts.append(rendered.text or f"### {name}\n\nskipped: {rendered.skipped}\n")
    curve_names = [n for n in names if n in CURVE_TABLES]
    if curve_names:
        figures = render_figures(store, work / "figures", names=curve_names)
    if not names:
        texts.append(results_markdown(store.reads.metrics_frame(grid=grid), grid))
    (out / "tables.md").write_text("\n".join(texts))
    packed = tar_folder(work / "figures", out / "figures.tar", suffixes=(".png", ".pdf")) if figures else []
    return {"tables": names, "figures": packed}


def results_markdown(frame: list[dict[str, Any]], grid: str) -> str:
    from phaselab.orchestrator.cli.views import results_table

    cols, rows = results_table(frame)
    head = ["cell", "stage", *cols]
    lines = [f"### {grid}: results", "", "| " + " | ".join(head) + " |",
             "|---|---|" + "|".join("---:" for _ in cols) + "|"]
    for row in rows:
        vals = [f"{row[c]:.4g}" if isinstance(row.get(c), float) else str(row.get(c, "")) for c in cols]
        lines.append("| " + " | ".join([str(row["cell"]), str(row["stage"]), *vals]) + " |")
    return "\n".join(lines) + "\n"


def jsonl_points(path: Path) -> list[dict[str, Any]]:
    points = []
    for line in path.read_text().splitlines():
        try:
            points.append(json.loads(line))
        except json.JSONDecodeError:     # a torn final line of a killed writer
            continue
    return points


def mlflow_points(db: Path, run_id: str) -> list[dict[str, Any]]:
    """Metric history of one MLflow run, read from its SQLite store, one dict per training step.
    Series logged against another axis (``.../by_ctx``: the step is a context length) are not
    learning curves and are left out."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        rows = con.execute("SELECT step, key, value FROM metrics WHERE run_uuid = ? AND key NOT LIKE ? "
                           "ORDER BY step, timestamp", (run_id, "%/by_ctx")).fetchall()
    by_step: dict[int, dict[str, Any]] = {}
    for step, key, value in rows:
        by_step.setdefault(int(step), {"step": int(step)})[key] = value
    return list(by_step.values())


def write_curves(stages: list[Any], work: Path, out: Path) -> dict[str, int]:
    """curves.jsonl.gz: {"stage_hash", "stage", "kind", "source", "step", metrics...} lines."""
    from phaselab.catalog.tracking.run_folder import STEPS_FILE, steps_path

    counts: dict[str, int] = {}
    db = work / "mlflow.db"
    with gzip.open(out / "curves.jsonl.gz", "wt") as f:
        for s in stages:
            if s.kind not in ("pretrain", "cpt", "finetune"):
                continue
            jsonl = steps_path(work / "runs" / s.stage_hash)
            if jsonl.is_file():
                source, points = STEPS_FILE, jsonl_points(jsonl)
            elif s.mlflow_run_id and db.is_file():
                source, points = "mlflow", mlflow_points(db, s.mlflow_run_id)
            else:
                source, points = "none", []
            head = {"stage_hash": s.stage_hash, "stage": s.name, "kind": s.kind, "source": source}
            for p in points:
                f.write(json.dumps({**head, **p}) + "\n")
            counts[s.stage_hash[:12]] = len(points)
    return counts


def pack(args: argparse.Namespace) -> dict[str, Any]:
    from phaselab.catalog.reports.export import export_grid
    from phaselab.catalog.store.api import CatalogStore

    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    grid = grid_name(args.grid)
    info: dict[str, Any] = {
        "grid": grid, "grid_source": args.grid, "overrides": args.overrides, "card": card(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "command": args.command,
        "git_commit": git_commit(), "source_sha256": source_sha256(), "run_exit_code": args.rc,
        "wall_seconds": args.seconds, "mlflow": bool(args.mlflow), "versions": versions()}
    db = work / "catalog.db"
    store = CatalogStore(f"sqlite:///{db}") if db.is_file() else None
    if store is None or store.reads.get_grid(grid) is None:
        info["error"] = f"grid {grid!r} is not in the catalog {db}"
        return info
    info["export"] = export_grid(store, grid, "parquet", work / "export")
    tar_folder(work / "export", out / "export.tar")
    info.update(write_tables(store, grid, work, out))
    stages = store.stages_for_grid(store.reads.get_grid(grid)["id"], current_only=True)
    info["stages"] = [{"hash": s.stage_hash[:12], "kind": s.kind, "name": s.name, "state": s.state,
                       "gpu_seconds": s.gpu_seconds} for s in stages]
    info["states"] = {st: sum(s.state == st for s in stages) for st in sorted({s.state for s in stages})}
    info["curve_points"] = write_curves(stages, work, out)
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--rc", type=int, default=0)
    p.add_argument("--seconds", type=float, default=0.0)
    p.add_argument("--mlflow", type=int, default=1)
    p.add_argument("--command", default="")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    start = time.monotonic()
    info = pack(args)
    info["pack_seconds"] = round(time.monotonic() - start, 1)
    out = Path(args.out)
    (out / "run.json").write_text(json.dumps(info, indent=2, sort_keys=True, default=str) + "\n")
    big = [p.name for p in out.iterdir() if p.is_file() and p.stat().st_size > MAX_FILE_BYTES]
    if big:
        print(f"[pack] over {MAX_FILE_BYTES >> 20} MiB, will not come back: {big}", file=sys.stderr)
    print(f"[pack] {info['grid']}: states {info.get('states')} -> {sorted(p.name for p in out.iterdir())}")
    return 1 if "error" in info or big else 0


if __name__ == "__main__":
    sys.exit(main())
