"""CLI verbs that maintain the catalog and the runs root: ``gc`` and ``db upgrade``."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    from phaselab.orchestrator.cli import CATALOG, JSON, RUNS, _console, _emit, _store

    db_app = typer.Typer(no_args_is_help=True, help="Catalog database maintenance.")
    app.add_typer(db_app, name="db")

    @app.command()
    def gc(catalog: str = CATALOG, runs_root: Path = RUNS,
           dry_run: bool = typer.Option(False, "--dry-run", help="List what would be deleted."),
           as_json: bool = JSON) -> None:
        """Delete checkpoints nothing references: folders of stages unknown to the catalog and
        intermediate checkpoints of SUCCEEDED stages (never a stage's committed artifacts, never
        outputs of stages that may resume)."""
        from phaselab.orchestrator.gc import collect, delete

        store = _store(catalog, create=False)
        victims = collect(store, runs_root)
        freed = sum(v["bytes"] for v in victims)
        if not dry_run:
            delete(victims)
        _emit(as_json, {"ok": True, "dry_run": dry_run, "paths": victims, "bytes": freed})
        if not as_json:
            for v in victims:
                _console().print(f"{'would delete' if dry_run else 'deleted'} {v['path']} ({v['bytes']} B): {v['why']}")
            _console().print(f"{'would free' if dry_run else 'freed'} {freed / 2**20:.1f} MiB")

    @db_app.command("upgrade")
    def db_upgrade(catalog: str = CATALOG, as_json: bool = JSON) -> None:
        """Apply the catalog's Alembic migrations (alembic upgrade head)."""
        store = _store(catalog, create=True)
        _emit(as_json, {"ok": True, "revision": store.revision()})
        if not as_json:
            _console().print(f"catalog at revision {store.revision()}")
