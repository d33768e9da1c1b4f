"""What every ``phaselab`` command module shares: the common options (``--json``,
``--catalog``, ``--runs-root``) and the output, error and catalog helpers. The command modules
(cli, cli_catalog, cli_maint, cli_train, cli_tracking) import it; it imports none of them.

Heavy imports (rich, sqlalchemy, the catalog) happen inside the helpers, so ``phaselab --help``
stays fast.
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import typer

JSON = typer.Option(False, "--json", help="Machine-readable output.")
CATALOG = typer.Option(None, "--catalog", help="Catalog URL (default: $PHASELAB_CATALOG_URL or "
                       "sqlite:///<cwd>/.phaselab/catalog.db).")
RUNS = typer.Option(None, "--runs-root", help="Stage outputs root (default ./.phaselab/runs).")


def make_console() -> Any:
    from rich.console import Console

    return Console(highlight=False)


def emit(as_json: bool, obj: Any) -> None:
    """``obj`` as one JSON document on stdout when ``as_json`` (the ``--json`` contract)."""
    from phaselab.orchestrator.views import dumps

    if as_json:
        sys.stdout.write(dumps(obj) + "\n")


def fail(as_json: bool, message: str) -> NoReturn:
    """Report ``message`` (as ``{"ok": false, "error"}`` with ``--json``) and exit 1."""
    if as_json:
        emit(True, {"ok": False, "error": message})
    else:
        from rich.markup import escape

        # escaped: error text quotes labels like 'pretrain[pe=alibi,seed=0]', which rich would
        # otherwise read as markup tags and drop
        make_console().print(f"[red]error:[/] {escape(message)}", markup=True)
    raise typer.Exit(1)


def open_store(catalog: str | None, *, create: bool) -> Any:
    """The catalog; ``create=False`` returns None when the default SQLite file does not exist
    (``plan`` has no side effects)."""
    from phaselab.catalog import db
    from phaselab.catalog.store import CatalogStore

    url = db.normalize_url(catalog or db.default_url())
    path = db.sqlite_path(url)
    if not create and path is not None and not path.exists():
        return None
    store = CatalogStore(url)
    if create:
        store.upgrade()   # once, from the controller process (DESIGN §5.1), never from workers
    return store
