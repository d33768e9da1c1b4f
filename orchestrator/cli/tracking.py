"""``phaselab sync-tracking``: replay the tracker calls spooled while MLflow was unreachable,
then end the cells' parent runs that replay left RUNNING; :func:`settle_tracking` does the same
at the end of ``run`` and ``resume``, and says how many calls are still pending."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from phaselab.orchestrator.cli.common import CATALOG, JSON, RUNS, open_store
from phaselab.orchestrator.cli.common import emit as _emit
from phaselab.orchestrator.cli.common import make_console as _console


def replay_and_end(store: Any, uri: str, runs_root: Path) -> tuple[dict[str, int], dict[str, str]]:
    """Replay the spools under ``runs_root`` into ``uri``; then, if any were replayed, end the
    parent runs of cells with no pending stage in ``store`` (None: no catalog). Returns
    ({spool: calls pending}, {run id: status} of the parent runs ended). Costs one probe when
    MLflow is down, nothing when nothing is spooled."""
    from phaselab.catalog.tracking.mlflow_tracker import end_done_cell_runs, replay_spools

    left = replay_spools(runs_root / "_mlflow_spool", uri)
    ended = end_done_cell_runs(uri, store) if left and store is not None and not any(left.values()) else {}
    return left, ended


def pending_note(uri: str, pending: dict[str, int]) -> str:
    from phaselab.catalog.tracking.mlflow_tracker import reachable, redact

    why = "is unreachable" if not reachable(uri) else "refused or failed some calls"
    return (f"{sum(pending.values())} MLflow call(s) in {len(pending)} spool(s) still pending: MLflow at "
            f"{redact(uri)} {why}; `phaselab sync-tracking` sends them once it answers")


def settle_tracking(store: Any, uri: str, runs_root: Path) -> dict[str, int]:
    """End of ``run``/``resume``: replay what earlier outages spooled (also when every stage was
    cached), end the parent runs that replay left open, and say on stderr how many calls are
    still pending and how to send them. Returns ``{spool: calls pending}`` of those pending."""
    left, _ = replay_and_end(store, uri, Path(runs_root))
    pending = {name: n for name, n in left.items() if n}
    if pending:
        typer.echo(pending_note(uri, pending), err=True)
    return pending


def register(app: typer.Typer) -> None:
    @app.command("sync-tracking")
    def sync_tracking(catalog: str = CATALOG, runs_root: Path = RUNS, as_json: bool = JSON) -> None:
        """Send spooled MLflow calls (metrics, params, run ends) to the tracking server, each
        metric point once, and end the parent runs of finished cells; exits 1 while calls are
        still pending (server still down)."""
        from phaselab.catalog.tracking.mlflow_tracker import default_tracking_uri, redact
        from phaselab.orchestrator.engine.controller import default_runs_root

        uri = default_tracking_uri(catalog)
        root = Path(runs_root or default_runs_root()).resolve()
        store = open_store(catalog, create=False)
        try:
            left, ended = replay_and_end(store, uri, root)
        finally:
            if store is not None:
                store.dispose()
        pending = {name: n for name, n in left.items() if n}
        ok = not pending
        _emit(as_json, {"ok": ok, "tracking_uri": redact(uri), "spools": len(left), "pending": pending,
                        "pending_calls": sum(pending.values()), "ended_cell_runs": len(ended)})
        if not as_json:
            console = _console()
            if not left:
                console.print(f"nothing spooled under {root / '_mlflow_spool'}")
            elif ok:
                console.print(f"replayed {len(left)} spool(s) into {redact(uri)}; ended {len(ended)} cell run(s)")
            else:
                console.print(f"[yellow]{pending_note(uri, pending)}[/]")
        raise typer.Exit(0 if ok else 1)
