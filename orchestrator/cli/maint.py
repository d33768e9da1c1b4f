"""CLI verbs that maintain the catalog and the runs root (``gc``, ``db upgrade``) and list what
ships with phaselab (``grids``)."""

from __future__ import annotations

from pathlib import Path

import typer

from phaselab.orchestrator.cli.common import CATALOG, JSON, RUNS, emit, make_console, open_store


def register(app: typer.Typer) -> None:
    db_app = typer.Typer(no_args_is_help=True, help="Catalog database maintenance.")
    app.add_typer(db_app, name="db")

    @app.command()
    def gc(catalog: str = CATALOG, runs_root: Path = RUNS,
           dry_run: bool = typer.Option(False, "--dry-run", help="List what would be deleted."),
           as_json: bool = JSON) -> None:
        """Delete checkpoints nothing references: folders of stages unknown to the catalog and
        intermediate checkpoints of SUCCEEDED stages (never a stage's committed artifacts, never
        outputs of stages that may resume)."""
        from phaselab.orchestrator.engine.gc import collect, delete

        store = open_store(catalog, create=False)
        victims = collect(store, runs_root)
        freed = sum(v["bytes"] for v in victims)
        if not dry_run:
            delete(victims)
        emit(as_json, {"ok": True, "dry_run": dry_run, "paths": victims, "bytes": freed})
        if not as_json:
            for v in victims:
                make_console().print(f"{'would delete' if dry_run else 'deleted'} {v['path']} ({v['bytes']} B): {v['why']}")
            make_console().print(f"{'would free' if dry_run else 'freed'} {freed / 2**20:.1f} MiB")

    @app.command()
    def grids(as_json: bool = JSON) -> None:
        """List the shipped grids (run one by name: `phaselab run quickstart`)."""
        from phaselab.orchestrator.language.library import describe_shipped

        rows = describe_shipped()
        emit(as_json, {"ok": True, "grids": rows})
        if not as_json:
            from rich.markup import escape
            from rich.table import Table

            table = Table(title="shipped grids (phaselab run NAME)")
            for col in ("name", "cells", "stages", "description"):
                table.add_column(col, no_wrap=col == "name", justify="right" if col in ("cells", "stages") else "left")
            for r in rows:
                table.add_row(r["name"], str(r["cells"]), str(r["stages"]), escape(r["description"]))
            make_console().print(table)

    @db_app.command("upgrade")
    def db_upgrade(catalog: str = CATALOG, as_json: bool = JSON) -> None:
        """Apply the catalog's Alembic migrations (alembic upgrade head)."""
        store = open_store(catalog, create=True)
        emit(as_json, {"ok": True, "revision": store.revision()})
        if not as_json:
            make_console().print(f"catalog at revision {store.revision()}")
