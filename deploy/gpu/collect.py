"""Copy what ``run_grid.sh`` packed on the GPU machine into ``docs/results/<grid>/``.

    .venv/bin/python deploy/gpu/collect.py /work/.device/<call>/   # the call's files_at

Unpacks ``export.tar`` (the Parquet export) into ``export/`` and ``figures.tar`` beside the
tables, copies ``tables.md``, ``run.json``, ``curves.jsonl.gz`` and ``log.txt.gz``, and writes a
README.md with the command, card, date, commit, stage states and links to every table and figure.
A ``run.json`` that names another grid than an existing folder's is refused (``--force``
overwrites).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
COPIED = ("run.json", "tables.md", "curves.jsonl.gz", "log.txt.gz")


def find_packed(src: Path) -> Path:
    """The folder holding run.json: ``src`` itself or one level below (``$OUT`` subfolders)."""
    if (src / "run.json").is_file():
        return src
    found = sorted(p.parent for p in src.glob("*/run.json"))
    if len(found) != 1:
        raise SystemExit(f"{src}: expected one run.json (found {len(found)})")
    return found[0]


def safe_extract(archive: Path, dest: Path) -> list[str]:
    """Extract a tar whose members all stay under ``dest``; returns the member paths."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        for m in members:
            target = (dest / m.name).resolve()
            if not target.is_relative_to(dest.resolve()):
                raise SystemExit(f"{archive}: member {m.name!r} leaves {dest}")
        tar.extractall(dest, members=members, filter="data")
    return sorted(m.name for m in members)


def readme(info: dict[str, Any], figures: list[str], exported: list[str]) -> str:
    states = ", ".join(f"{k} {v}" for k, v in sorted((info.get("states") or {}).items())) or "none"
    ver = info.get("versions") or {}
    lines = [f"# {info['grid']}: results from one `phaselab run` on {info.get('card', '?')}", "",
             "| | |", "|---|---|",
             f"| command | `{info.get('command', '')}` |",
             f"| card | {info.get('card', '?')} |",
             f"| date (UTC) | {info.get('date', '?')} |",
             f"| commit | `{info.get('git_commit') or 'unknown'}` (sources sha256 `{info.get('source_sha256', '')[:16]}`) |",
             f"| wall time | {info.get('wall_seconds')} s (`phaselab run`), exit code {info.get('run_exit_code')} |",
             f"| stages | {states} |",
             f"| MLflow | {'SQLite store on the machine' if info.get('mlflow') else 'off (--no-mlflow)'} |",
             "| versions | " + ", ".join(f"{k} {v}" for k, v in ver.items() if v) + " |", ""]
    if info.get("error"):
        lines += [f"**Packing error:** {info['error']}", ""]
    lines += ["## Tables", "", "[tables.md](tables.md) (rendered by `phaselab tables` from the catalog): "
              + (", ".join(f"`{t}`" for t in info.get("tables", [])) or "the run's results pivot"), ""]
    if figures:
        lines += ["## Figures", ""]
        lines += [f"![{f}]({f})" if f.endswith(".png") else f"[{f}]({f})" for f in figures]
        lines.append("")
    lines += ["## Data", "",
              (f"- `export/`: `phaselab export {info['grid']} --format parquet` ({len(exported)} files; "
               "read with `phaselab.catalog.reports.export.read_metrics`)"),
              "- `curves.jsonl.gz`: learning curves, one JSON line per (training stage, logged step)",
              "- `run.json`: everything above plus per-stage states; `log.txt.gz`: the console log", ""]
    return "\n".join(lines)


def collect(src: Path, results: Path, *, force: bool = False) -> Path:
    packed = find_packed(src)
    info = json.loads((packed / "run.json").read_text())
    dest = results / info["grid"]
    if dest.exists() and any(dest.iterdir()) and not force:
        old = dest / "run.json"
        if old.is_file() and json.loads(old.read_text()).get("grid") != info["grid"]:
            raise SystemExit(f"{dest} holds another grid's results; pass --force")
    if (dest / "export").exists():
        shutil.rmtree(dest / "export")        # a re-export replaces the old partitions
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        if (packed / name).is_file():
            shutil.copyfile(packed / name, dest / name)
    figures = safe_extract(packed / "figures.tar", dest) if (packed / "figures.tar").is_file() else []
    exported = safe_extract(packed / "export.tar", dest / "export") if (packed / "export.tar").is_file() else []
    figures += learning_curves(dest)
    text = readme(info, figures, exported)
    if (dest / "FINDINGS.md").is_file():   # written by hand: what the numbers mean, kept across re-collects
        text += "\n## Findings\n\n[FINDINGS.md](FINDINGS.md): how these numbers compare with the paper's, and why.\n"
    (dest / "README.md").write_text(text)
    return dest


def axes_by_stage(export_dir: Path) -> dict[str, dict[str, Any]]:
    """{stage hash: cell axes} from the export's metric rows (every row carries its cell)."""
    import pyarrow.dataset as ds

    if not (export_dir / "metrics").is_dir():
        return {}
    table = ds.dataset(export_dir / "metrics", partitioning="hive").to_table(
        columns=["stage_hash", "axes_json"])
    return {row["stage_hash"]: json.loads(row["axes_json"]) for row in table.to_pylist()}


def learning_curves(dest: Path) -> list[str]:
    """``learning_curves.{png,pdf}`` from ``curves.jsonl.gz`` (training and validation loss, and
    validation accuracy when logged), labelled by the cells' axes; [] without curves."""
    from phaselab.catalog.reports.curves import (
        ACC_THRESHOLDS,
        crossings,
        crossings_markdown,
        plot_learning_curves,
        read_points,
    )

    curves = dest / "curves.jsonl.gz"
    axes_of = axes_by_stage(dest / "export")
    if not curves.is_file() or not axes_of:
        return []
    points = read_points(curves)
    if not points:   # e.g. ray_task stages of a run without MLflow before they wrote metrics.jsonl
        return []
    metrics = ["train/loss", "valid/loss"] + (["valid/acc"] if any("valid/acc" in p for p in points) else [])
    paths = plot_learning_curves(points, axes_of, dest / "learning_curves", metrics=metrics)
    if "valid/acc" in metrics:   # when each run left its plateau (Indirect Indexing's slow seeds)
        rows = crossings(points, axes_of, "valid/acc", ACC_THRESHOLDS)
        (dest / "crossings.md").write_text(crossings_markdown(rows, "valid/acc"))
        paths.append(dest / "crossings.md")
    return [p.name for p in paths]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path, help="folder with what came back (run.json, tables.md, ...)")
    p.add_argument("--results", type=Path, default=ROOT / "docs" / "results")
    p.add_argument("--force", action="store_true")
    args = p.parse_args(argv)
    dest = collect(args.src, args.results, force=args.force)
    print(f"collected into {dest}: {sorted(p.name for p in dest.iterdir())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
