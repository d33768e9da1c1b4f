"""CLI verbs backed by the catalog package: export, tables, mlflow."""

from __future__ import annotations

from pathlib import Path

import typer

from phaselab.orchestrator.cli_common import CATALOG, JSON, emit, fail, make_console, open_store

FORMAT = typer.Option("parquet", "--format", help="parquet | csv")
OUT = typer.Option(Path(".phaselab/export"), "--out", help="Output folder (hive-partitioned by grid, stage kind).")
TABLE_NAMES = typer.Argument(None, help="Table names (default: every table whose grid is in the catalog).")
TABLE_FORMAT = typer.Option("md", "--format", help="md | latex | csv")
TABLE_OUT = typer.Option(None, "--out", help="Also write <name>.<ext> files here.")
CHECK_STALE = typer.Option(False, "--check-stale", help="Fail if an input stage re-ran or changed since the last build.")


def register(app: typer.Typer) -> None:
    @app.command()
    def export(grid: str = typer.Argument(..., help="Grid name in the catalog."), fmt: str = FORMAT,
               out: Path = OUT, catalog: str = CATALOG, as_json: bool = JSON) -> None:
        """Partitioned Parquet (or CSV) export of a grid's metrics and stages, with provenance."""
        from phaselab.catalog.export import export_grid

        store = open_store(catalog, create=False)
        if store is None:
            fail(as_json, "the catalog does not exist yet")
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
               check_stale: bool = CHECK_STALE, catalog: str = CATALOG, as_json: bool = JSON) -> None:
        """Regenerate paper tables from the catalog (mean ± std over seeds, holes shown)."""
        from phaselab.catalog import tables as tbl

        store = open_store(catalog, create=False)
        if store is None:
            fail(as_json, "the catalog does not exist yet")
        try:
            if check_stale:
                report = tbl.check_stale(store, names or None)
                stale = {k: v for k, v in report.items() if v}
                emit(as_json, {"ok": not stale, "stale": stale, "checked": sorted(report)})
                if not as_json:
                    for name, reasons in report.items():
                        make_console().print(f"{name}: " + ("[red]stale[/]\n  " + "\n  ".join(reasons)
                                                        if reasons else "[green]up to date[/]"))
                raise typer.Exit(1 if stale else 0)
            rendered = tbl.render_all(store, fmt, out_dir=out, names=names or None)
            figures = []
            if out is not None:  # the papers' curves (ppl vs context) beside the tables
                from phaselab.catalog.figures import CURVE_TABLES, render_figures
                wanted = [n for n in CURVE_TABLES if not names or n in names]
                figures = render_figures(store, out, names=wanted)
        except ValueError as err:
            fail(as_json, str(err))
        emit(as_json, {"ok": True, "tables": [{"name": r.name, "text": r.text, "skipped": r.skipped,
                                               "path": str(r.path) if r.path else None} for r in rendered],
                        "figures": [str(p) for p in figures]})
        if not as_json:
            for r in rendered:
                make_console().print(r.text if r.text is not None else f"{r.name}: skipped ({r.skipped})",
                                 markup=False)
            for path in figures:
                make_console().print(f"figure: {path}", markup=False)

    @app.command()
    def verify(stage: str = typer.Argument(..., help="Hash (prefix) of a SUCCEEDED training stage."),
               steps: int = typer.Option(20, "--steps", help="Re-run this many steps."),
               rtol: float = typer.Option(1e-4, "--rtol", help="Allowed relative difference of the loss."),
               catalog: str = CATALOG, as_json: bool = JSON) -> None:
        """Re-run the first K steps of a training stage and compare its losses with the stored run."""
        from phaselab.catalog.schema import STATES
        from phaselab.orchestrator.verify import verify_stage

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
               port: int = typer.Option(5000), catalog: str = CATALOG, as_json: bool = JSON) -> None:
        """Serve the MLflow UI on the tracking store beside the catalog."""
        from phaselab.catalog.mlflow_server import serve

        try:   # a non-loopback host or a bad port is refused before anything starts
            code = serve(host=host, port=port, catalog_url=catalog, block=True,
                         on_start=lambda: emit(as_json, {"ok": True, "url": f"http://{host}:{port}"}))
        except ValueError as err:
            fail(as_json, str(err))
        raise typer.Exit(0 if code == 0 else 1)
