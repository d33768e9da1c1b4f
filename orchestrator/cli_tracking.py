"""``phaselab sync-tracking``: replay the tracker calls spooled while MLflow was unreachable."""

from __future__ import annotations

from pathlib import Path

import typer

from phaselab.orchestrator.cli_common import CATALOG, JSON, RUNS
from phaselab.orchestrator.cli_common import emit as _emit
from phaselab.orchestrator.cli_common import make_console as _console


def register(app: typer.Typer) -> None:
    @app.command("sync-tracking")
    def sync_tracking(catalog: str = CATALOG, runs_root: Path = RUNS, as_json: bool = JSON) -> None:
        """Send spooled MLflow calls (metrics, params, run ends) to the tracking server, each
        metric point once; exits 1 while calls are still pending (server still down)."""
        from phaselab.catalog.mlflow_tracker import default_tracking_uri, reachable, replay_spools
        from phaselab.orchestrator.controller import default_runs_root

        uri = default_tracking_uri(catalog)
        spool = Path(runs_root or default_runs_root()).resolve() / "_mlflow_spool"
        left = replay_spools(spool, uri)
        pending = {name: n for name, n in left.items() if n}
        ok = not pending
        _emit(as_json, {"ok": ok, "tracking_uri": uri, "spools": len(left), "pending": pending,
                        "pending_calls": sum(pending.values())})
        if not as_json:
            console = _console()
            if not left:
                console.print(f"nothing spooled under {spool}")
            elif ok:
                console.print(f"replayed {len(left)} spool(s) into {uri}")
            else:
                why = "unreachable" if not reachable(uri) else "refused or failed some calls"
                console.print(f"[yellow]{sum(pending.values())} call(s) in {len(pending)} spool(s) still "
                              f"pending[/]: MLflow at {uri} {why}; run `phaselab sync-tracking` again later")
        raise typer.Exit(0 if ok else 1)
