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
                       "sqlite:///<project home>/.phaselab/catalog.db; the project home is $PHASELAB_HOME, "
                       "else the nearest folder up holding .phaselab/catalog.db or .phaselab/runs, else ./).")
RUNS = typer.Option(None, "--runs-root", help="Stage outputs root (default: $PHASELAB_RUNS_ROOT or "
                    "<project home>/.phaselab/runs).")


# Output that is not a terminal (a pipe, a log, CI) is not cut at rich's default 80 columns:
# lines keep their full length and the reader's viewer wraps them. $COLUMNS still wins.
NON_TTY_WIDTH = 4096


def make_console() -> Any:
    """The console of every command: the terminal's width, or ``NON_TTY_WIDTH`` when stdout is
    not a terminal and ``$COLUMNS`` is unset."""
    import os

    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(highlight=False, width=NON_TTY_WIDTH)
    return console


def emit(as_json: bool, obj: Any) -> None:
    """``obj`` as one JSON document on stdout when ``as_json`` (the ``--json`` contract)."""
    from phaselab.orchestrator.cli.views import dumps

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


_ASKED: dict[str, str | None] = {"catalog": None}   # the --catalog of this command's open_store


def no_catalog(catalog: str | None = None, hint: str = "") -> str:
    """The error for a catalog that does not exist: which one was looked for, and how it was
    found (``catalog/store/home.py``), so a command run from the wrong folder says so."""
    import os

    from phaselab.catalog.store import db, home

    catalog = catalog or _ASKED["catalog"]
    url = db.normalize_url(catalog or db.default_url())
    where = db.sqlite_path(url) or url
    if catalog:
        how = "named by --catalog"
    elif os.environ.get(db.CATALOG_URL_ENV):
        how = f"from ${db.CATALOG_URL_ENV}"
    elif os.environ.get(home.HOME_ENV):
        how = f"under ${home.HOME_ENV}"
    else:
        how = (f"no {home.STATE_DIR}/catalog.db in {os.getcwd()} or any folder above it; "
               f"set ${home.HOME_ENV} or pass --catalog to read another")
    return f"there is no catalog at {where} ({how})" + (f" {hint}" if hint else "")


def open_store(catalog: str | None, *, create: bool) -> Any:
    """The catalog; ``create=False`` returns None when the default SQLite file does not exist
    (``plan`` has no side effects)."""
    from phaselab.catalog.store import db
    from phaselab.catalog.store.api import CatalogStore

    _ASKED["catalog"] = catalog
    url = db.normalize_url(catalog or db.default_url())
    path = db.sqlite_path(url)
    if not create and path is not None and not path.exists():
        return None
    store = CatalogStore(url)
    if create:
        store.upgrade()   # once, from the controller process (DESIGN §5.1), never from workers
    return store
