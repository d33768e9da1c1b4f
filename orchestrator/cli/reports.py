"""CLI verbs backed by the catalog package: export, tables, mlflow."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from phaselab.orchestrator.cli.common import (
    CATALOG,
    JSON,
    RUNS,
    emit,
    fail,
    make_console,
    no_catalog,
    open_store,
)

FORMAT = typer.Option("parquet", "--format", help="parquet | csv")
OUT = typer.Option(Path(".phaselab/export"), "--out", help="Output folder (hive-partitioned by grid, stage kind).")
TABLE_NAMES = typer.Argument(None, help="Table names (default: every table whose grid is in the catalog); "
                             "with --metric, the one grid to pivot.")
METRIC = typer.Option(None, "--metric", help="Pivot this metric of GRID (e.g. ppl) instead of the paper tables.")
ROWS = typer.Option("", "--rows", help="Row fields, comma-separated: axes of the grid (pe, lr) or metric fields "
                    "(context_len, depth, task, split, role = stage name, stage_kind).")
COLS = typer.Option("", "--cols", help="Column fields, comma-separated (as --rows).")
WHERE = typer.Option(None, "--where", help="Keep metric rows with FIELD=VALUE (repeatable), e.g. split=test.")
SEED_AXIS = typer.Option("seed", "--seed-axis", help="The axis averaged over (mean ± std; missing seeds flagged).")
BETTER = typer.Option(None, "--better", help="min | max: which mean is bold (default: min for loss-like metrics).")
DECIMALS = typer.Option(2, "--decimals", help="Digits after the point.")
FIG_OUT = typer.Option(Path("figures"), "--out", help="Folder for <grid>_<kind>.png/.pdf.")
TABLE_FORMAT = typer.Option("md", "--format", help="md | latex | csv")
TABLE_OUT = typer.Option(None, "--out", help="Also write <name>.<ext> files here.")
CHECK_STALE = typer.Option(False, "--check-stale", help="Fail if an input stage re-ran or changed since the last build.")
FROM_EXPORT = typer.Option(None, "--from-export", help="Render the named paper tables from a Parquet export "
                           "folder (`phaselab export`, e.g. docs/results/<grid>/export) instead of a catalog.")
FIG_FROM_EXPORT = typer.Option(None, "--from-export", help="Draw from a Parquet export folder (`phaselab "
                               "export`, e.g. docs/results/<grid>/export) instead of a catalog.")
FIG_MARK = typer.Option(None, "--mark", help="Mark a length with a labelled vertical line, LENGTH=LABEL "
                        "(repeatable), e.g. --mark '2048=continued pretraining length 2048'; replaces the "
                        "lengths read from the stages (a pretraining and a continued-pretraining length).")
FIG_TITLE = typer.Option(None, "--title", help="Figure title (default: GRID: METRIC by context length).")
FIG_NAME = typer.Option(None, "--name", help="File name without extension (default: <grid>_<kind>).")


def register(app: typer.Typer) -> None:
    @app.command()
    def export(grid: str = typer.Argument(..., help="Grid name in the catalog."), fmt: str = FORMAT,
               out: Path = OUT, catalog: str = CATALOG, as_json: bool = JSON) -> None:
        """Partitioned Parquet (or CSV) export of a grid's metrics and stages, with provenance."""
        from phaselab.catalog.reports.export import export_grid

        store = open_store(catalog, create=False)
        if store is None:
            fail(as_json, no_catalog(catalog))
        try:
            summary = export_grid(store, grid, fmt, out)
        except ValueError as err:
            fail(as_json, str(err))
        emit(as_json, {"ok": True, **summary, "out": str(out)})
        if not as_json:
            make_console().print(f"exported {summary['metric_rows']} metric rows and {summary['stage_rows']} "
                             f"stage rows of {grid} to {out} ({fmt})")

    @app.command()
    def tables(names: list[str] = TABLE_NAMES, fmt: str = TABLE_FORMAT, out: Path = TABLE_OUT,
               check_stale: bool = CHECK_STALE, metric: str = METRIC, rows: str = ROWS, cols: str = COLS,
               where: list[str] = WHERE, seed_axis: str = SEED_AXIS, better: str = BETTER,
               decimals: int = DECIMALS, catalog: str = CATALOG, from_export: Path = FROM_EXPORT,
               as_json: bool = JSON) -> None:
        """Regenerate paper tables from the catalog (or from a committed export), or pivot any
        metric of a grid over any axes (`phaselab tables GRID --metric ppl --rows pe --cols
        context_len`): mean ± std over seeds, holes shown."""

        store = None if from_export is not None else open_store(catalog, create=False)
        if store is None and from_export is None:
            fail(as_json, no_catalog(catalog))
        try:
            if metric is not None:
                rendered, figures = [_pivot(store, names, metric, rows, cols, where, seed_axis, better,
                                            decimals, fmt, out, from_export)], []
            elif from_export is not None:
                rendered, figures = _export_tables(names, from_export, fmt, out), []
            elif check_stale:
                _check_stale(store, names, as_json)
            else:
                rendered, figures = _paper_tables(store, names, fmt, out)
        except ValueError as err:
            fail(as_json, str(err))
        emit(as_json, {"ok": True, "tables": [{"name": r.name, "text": r.text, "skipped": r.skipped,
                                               "path": str(r.path) if r.path else None} for r in rendered],
                        "figures": [str(p) for p in figures]})
        if not as_json:
            for r in rendered:   # plain stdout: a console would wrap CSV lines at 80 columns when piped
                text = r.text if r.text is not None else f"{r.name}: skipped ({r.skipped})"
                sys.stdout.write(text if text.endswith("\n") else text + "\n")
            for path in figures:
                sys.stdout.write(f"figure: {path}\n")

    def _export_tables(names: list[str] | None, export_dir: Path, fmt: str, out: Path | None) -> list[Any]:
        from phaselab.catalog.reports.tables import get_spec, render_from_export

        if not names:
            raise ValueError("--from-export needs the table names to render (e.g. pope_indirect_indexing)")
        if not export_dir.is_dir():
            raise ValueError(f"--from-export: no folder {export_dir}")
        return [render_from_export(get_spec(n), export_dir, fmt, out_dir=out) for n in names]

    @app.command()
    def figures(grid: str = typer.Argument(..., help="Grid name in the catalog (or the export)."),
                kind: str = typer.Option("length", "--kind", help="length (a metric vs context length) | "
                                         "curves (learning curves) | niah (NIAH heat maps)"),
                metric: str = typer.Option(None, "--metric", help="Default: niah_acc (niah); for length the "
                                           "first the grid has of ppl, nll, acc (a metric measured at no "
                                           "context length is drawn as bars)."),
                rows: str = typer.Option(None, "--rows", help="One line (panel) per value of these fields "
                                         "(default: pe, else the grid's axes but the seed; fields that tell "
                                         "two values of a line apart are added)."),
                where: list[str] = WHERE, seed_axis: str = SEED_AXIS,
                train_len: int = typer.Option(None, "--train-len", help="Mark this training length "
                                              "(without it and --mark: the lengths read from the stages "
                                              "above the evaluations, pretraining and continued "
                                              "pretraining)."),
                mark: list[str] = FIG_MARK, title: str = FIG_TITLE, name: str = FIG_NAME,
                out: Path = FIG_OUT, from_export: Path = FIG_FROM_EXPORT,
                runs_root: Path = RUNS, catalog: str = CATALOG, as_json: bool = JSON) -> None:
        """Publication figures of any grid: ppl vs context length, learning curves, NIAH heat maps."""
        from phaselab.catalog.reports import grid_figures as gf

        try:
            source = gf.read_export(from_export, grid) if from_export is not None else None
        except ValueError as err:
            fail(as_json, str(err))
        if source is None:
            source = open_store(catalog, create=False)
            if source is None:
                fail(as_json, no_catalog(catalog))
        try:
            options = FigureOptions(metric=metric, rows=rows, where=where, seed_axis=seed_axis,
                                    train_len=train_len, marks=parse_marks(mark), title=title)
            paths = _figure(source, grid, kind, options, out / figure_name(name, grid, kind), runs_root)
        except ValueError as err:
            fail(as_json, str(err))
        emit(as_json, {"ok": True, "figures": [str(p) for p in paths]})
        if not as_json:
            for path in paths:
                sys.stdout.write(f"figure: {path}\n")

    @app.command()
    def verify(stage: str = typer.Argument(..., help="Hash (prefix) of a SUCCEEDED training stage."),
               steps: int = typer.Option(20, "--steps", help="Re-run this many steps."),
               rtol: float = typer.Option(1e-4, "--rtol", help="Allowed relative difference of the loss."),
               catalog: str = CATALOG, as_json: bool = JSON) -> None:
        """Re-run the first K steps of a training stage and compare its losses with the stored run."""
        from phaselab.catalog.store.schema import STATES
        from phaselab.orchestrator.engine.verify import verify_stage

        store = open_store(catalog, create=False)
        rows = [r for r in (store.stages_in_state(STATES) if store is not None else [])
                if r.stage_hash.startswith(stage)]
        if len(rows) != 1:
            fail(as_json, f"{len(rows)} stored stages match {stage!r}; give a longer hash prefix")
        try:
            res = verify_stage(store, rows[0].stage_hash, steps=steps, rtol=rtol)
        except ValueError as err:
            fail(as_json, str(err))
        emit(as_json, {"stage": rows[0].stage_hash, **res})
        if not as_json:
            for s, a, b, rel in res["compared"]:
                make_console().print(f"step {s:>6}: stored {a:.6f}  re-run {b:.6f}  rel {rel:.2e}")
            make_console().print(("[green]OK[/]" if res["ok"] else "[red]MISMATCH[/]") +
                             f" max rel {res['max_rel']:.2e} (rtol {rtol:g})")
        raise typer.Exit(0 if res["ok"] else 1)

    @app.command()
    def mlflow(host: str = typer.Option("127.0.0.1", help="Bind address (127.0.0.1 unless you mean it)."),
               port: int = typer.Option(5000), catalog: str = CATALOG,
               allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-loopback "
                                                 "--host: the MLflow UI has no authentication."),
               as_json: bool = JSON) -> None:
        """Serve the MLflow UI on the tracking store beside the catalog (stopped with the
        command, by Ctrl-C or SIGTERM); once it answers, print each grid's deep links: its
        comparison figure and its runs table."""
        from phaselab.catalog.tracking.mlflow_server import serve

        try:   # a non-loopback host or a bad port is refused before anything starts
            code = serve(host=host, port=port, catalog_url=catalog, block=True, allow_remote=allow_remote,
                         on_start=lambda: emit(as_json, {"ok": True, "url": f"http://{host}:{port}"}),
                         on_ready=lambda url: _print_links(url, as_json))
        except ValueError as err:
            fail(as_json, str(err))
        raise typer.Exit(0 if code == 0 else 1)


def _print_links(url: str, as_json: bool) -> None:
    """Each grid's deep links on a server that just came up (one JSON line per grid with --json)."""
    from phaselab.catalog.tracking import mlflow_summary

    names = mlflow_summary.grids(url)
    if not names and not as_json:
        sys.stdout.write(f"MLflow at {url}: no phaselab grid tracked yet (`phaselab run GRID` first)\n")
    for grid in names:
        found = mlflow_summary.links(url, grid, ui=url)
        if found is None:
            continue
        if as_json:
            sys.stdout.write(json.dumps({"grid": grid, "experiment": found.experiment,
                                         "comparison": found.comparison}) + "\n")
        else:
            if found.comparison:
                sys.stdout.write(f"{grid}: compare  {found.comparison}\n")
            sys.stdout.write(f"{grid}: runs     {found.experiment}\n")
        sys.stdout.flush()


@dataclass(frozen=True)
class FigureOptions:
    """What ``phaselab figures`` draws, beside the grid, kind and source."""

    metric: str | None = None
    rows: str | None = None
    where: list[str] | None = None
    seed_axis: str = "seed"
    train_len: int | None = None
    marks: dict[int, str] | None = None
    title: str | None = None


def _figure(source: Any, grid: str, kind: str, opt: FigureOptions, base: Path, runs_root: Path | None) -> list[Path]:
    """The files of one ``phaselab figures`` call; ``source`` is a catalog or an export."""
    from phaselab.catalog.reports import grid_figures as gf

    if kind == "curves":
        from phaselab.orchestrator.engine.controller import default_runs_root

        return gf.learning_curves(source, grid, runs_root or default_runs_root(), base)
    if kind not in ("length", "niah"):
        raise ValueError(f"--kind must be length, curves or niah, got {kind!r}")
    if opt.train_len is not None and opt.train_len <= 0:
        raise ValueError(f"--train-len must be a positive length, got {opt.train_len}")
    metric = opt.metric or (gf.default_metric(source, grid) if kind == "length" else "niah_acc")
    rows = opt.rows or ",".join(gf.default_rows(source, grid, opt.seed_axis))
    pivot = tbl_pivot(grid, metric, rows, opt.where, opt.seed_axis)
    if kind == "niah":
        return gf.niah_heatmaps(source, pivot, base, title=opt.title)
    return gf.length_curves(source, pivot, base, train_len=opt.train_len, marks=opt.marks, title=opt.title)


def figure_name(name: str | None, grid: str, kind: str) -> str:
    """The figure's file name without extension: ``name``, a plain file name (no folder, no
    leading dot), or ``<grid>_<kind>``; ValueError otherwise."""
    if name is None:
        return f"{grid}_{kind}"
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name):
        raise ValueError(f"--name takes a file name without folders (letters, digits, _ . -), got {name!r}")
    return name


def parse_marks(items: list[str] | None) -> dict[int, str] | None:
    """``--mark LENGTH=LABEL`` options as {length: label} (None without any); ValueError, naming
    the item, for anything but a positive whole length and a non-empty label."""
    if not items:
        return None
    marks: dict[int, str] = {}
    for item in items:
        length, sep, label = item.partition("=")
        length, label = length.strip(), label.strip()
        if not sep or not re.fullmatch(r"[0-9]+", length) or int(length) <= 0 or not label:
            raise ValueError(f"--mark takes LENGTH=LABEL with a positive whole length and a label, e.g. "
                             f"--mark '2048=continued pretraining length 2048'; got {item!r}")
        if int(length) in marks:
            raise ValueError(f"--mark: length {int(length)} is marked twice")
        marks[int(length)] = label
    return marks


def _fields(text: str, flag: str) -> tuple[str, ...]:
    out = tuple(f.strip() for f in text.split(",") if f.strip())
    if not out:
        raise ValueError(f"{flag} needs at least one field (an axis such as pe, or context_len, task, role)")
    return out


def _where(items: list[str] | None) -> dict[str, Any]:
    import yaml

    filters = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--where takes FIELD=VALUE, got {item!r}")
        filters[key.strip()] = yaml.safe_load(value)   # 64 -> int, 0.5 -> float, test -> str
    return filters


def tbl_pivot(grid: str, metric: str, rows: str, where: list[str] | None, seed_axis: str) -> Any:
    """The Pivot of a figure (its columns are set by the figure)."""
    from phaselab.catalog.reports import tables as tbl

    return tbl.Pivot(grid=grid, metric=metric, rows=_fields(rows, "--rows"), cols=("context_len",),
                     where=_where(where), seed_axis=seed_axis)


def _pivot(store: Any, names: list[str] | None, metric: str, rows: str, cols: str, where: list[str] | None,
           seed_axis: str, better: str | None, decimals: int, fmt: str, out: Path | None,
           from_export: Path | None = None) -> Any:
    from phaselab.catalog.reports import tables as tbl

    if not names or len(names) != 1:
        raise ValueError(f"--metric pivots one grid: give its name (got {names or 'none'})")
    if better not in (None, "min", "max"):
        raise ValueError(f"--better must be min or max, got {better!r}")
    filters = _where(where)
    pivot = tbl.Pivot(grid=names[0], metric=metric, rows=_fields(rows, "--rows"), cols=_fields(cols, "--cols"),
                      where=filters, seed_axis=seed_axis, better=better, decimals=decimals)
    if from_export is not None:
        return tbl.render_pivot_from_export(pivot, from_export, fmt, out_dir=out)
    return tbl.render_pivot(store, pivot, fmt, out_dir=out)


def _check_stale(store: Any, names: list[str] | None, as_json: bool) -> None:
    from phaselab.catalog.reports import tables as tbl

    report = tbl.check_stale(store, names or None)
    stale = {k: v for k, v in report.items() if v}
    emit(as_json, {"ok": not stale, "stale": stale, "checked": sorted(report)})
    if not as_json:
        for name, reasons in report.items():
            make_console().print(f"{name}: " + ("[red]stale[/]\n  " + "\n  ".join(reasons)
                                              if reasons else "[green]up to date[/]"))
    raise typer.Exit(1 if stale else 0)


def _paper_tables(store: Any, names: list[str] | None, fmt: str, out: Path | None) -> tuple[list, list]:
    from phaselab.catalog.reports import tables as tbl

    rendered = tbl.render_all(store, fmt, out_dir=out, names=names or None)
    figures = []
    if out is not None:  # the papers' curves (ppl vs context) beside the tables
        from phaselab.catalog.reports.figures import CURVE_TABLES, render_figures

        wanted = [n for n in CURVE_TABLES if not names or n in names]
        figures = render_figures(store, out, names=wanted)
    return rendered, figures
