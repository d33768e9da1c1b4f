"""``phaselab sync-tracking``: replay the tracker calls spooled while MLflow was unreachable,
then publish the comparison of the grids they belong to; :func:`settle_tracking` replays at the
end of ``run`` and ``resume`` and says how many calls are still pending, and
:func:`comparison_links` publishes the grid's comparison and returns its deep links."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from phaselab.orchestrator.cli.common import CATALOG, JSON, RUNS, open_store
from phaselab.orchestrator.cli.common import emit as _emit
from phaselab.orchestrator.cli.common import make_console as _console


def replay(uri: str, runs_root: Path) -> dict[str, int]:
    """Replay the spools under ``runs_root`` into ``uri``; returns {spool: calls pending}. Costs
    one probe when MLflow is down, nothing when nothing is spooled."""
    from phaselab.catalog.tracking.mlflow_tracker import replay_spools

    return replay_spools(runs_root / "_mlflow_spool", uri)


def spooled_grids(store: Any, spools: Any) -> list[str]:
    """The grids the stages of the spool files (``<stage hash>.jsonl``) belong to."""
    names = {c["grid"] for name in spools for c in store.reads.cells_for_stage(Path(name).stem)}
    return sorted(names)


def pending_note(uri: str, pending: dict[str, int]) -> str:
    from phaselab.catalog.tracking.mlflow_tracker import reachable, redact

    why = "is unreachable" if not reachable(uri) else "refused or failed some calls"
    return (f"{sum(pending.values())} MLflow call(s) in {len(pending)} spool(s) still pending: MLflow at "
            f"{redact(uri)} {why}; `phaselab sync-tracking` sends them once it answers")


def settle_tracking(store: Any, uri: str, runs_root: Path) -> dict[str, int]:
    """End of ``run``/``resume``: replay what earlier outages spooled (also when every stage was
    cached), and say on stderr how many calls are still pending and how to send them. Returns ``{spool: calls pending}`` of those pending."""
    left = replay(uri, Path(runs_root))
    pending = {name: n for name, n in left.items() if n}
    if pending:
        typer.echo(pending_note(uri, pending), err=True)
    return pending


def comparison_links(store: Any, uri: str, grid: str, *, launched: bool) -> Any:
    """End of ``run``/``resume``: the grid's comparison published to MLflow when stages ran (or
    was never published), and its deep links (``catalog.tracking.mlflow_summary``); None when
    MLflow is unreachable or has no experiment of the grid."""
    from phaselab.catalog.tracking import mlflow_summary

    g = store.reads.get_grid(grid)
    if g is None:
        return None
    if launched:
        return mlflow_summary.publish(uri, store, grid)
    found = mlflow_summary.links(uri, grid, g["id"])
    return mlflow_summary.publish(uri, store, grid) if found is not None and found.comparison is None else found


def register(app: typer.Typer) -> None:
    @app.command("sync-tracking")
    def sync_tracking(catalog: str = CATALOG, runs_root: Path = RUNS, as_json: bool = JSON) -> None:
        """Send spooled MLflow calls (metrics, params, run ends) to the tracking server, each
        metric point once, then publish the comparison of the grids they belong to; exits 1
        while calls are still pending (server still down)."""
        from phaselab.catalog.tracking.mlflow_tracker import default_tracking_uri, redact
        from phaselab.orchestrator.engine.controller import default_runs_root

        uri = default_tracking_uri(catalog)
        root = Path(runs_root or default_runs_root()).resolve()
        store = open_store(catalog, create=False)
        published: dict[str, str | None] = {}
        try:
            left = replay(uri, root)
            if left and store is not None and not any(left.values()):
                for grid in spooled_grids(store, left):
                    found = comparison_links(store, uri, grid, launched=True)
                    published[grid] = None if found is None else found.comparison
        finally:
            if store is not None:
                store.dispose()
        pending = {name: n for name, n in left.items() if n}
        ok = not pending
        _emit(as_json, {"ok": ok, "tracking_uri": redact(uri), "spools": len(left), "pending": pending,
                        "pending_calls": sum(pending.values()), "comparisons": published})
        if not as_json:
            console = _console()
            if not left:
                console.print(f"nothing spooled under {root / '_mlflow_spool'}")
            elif ok:
                console.print(f"replayed {len(left)} spool(s) into {redact(uri)}")
                for grid, link in published.items():
                    console.print(f"{grid}: compare  {link or '(no comparison: nothing measured by length)'}",
                                  markup=False, soft_wrap=True)
            else:
                console.print(f"[yellow]{pending_note(uri, pending)}[/]")
        raise typer.Exit(0 if ok else 1)
