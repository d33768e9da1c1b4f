"""CLI verbs backed by the catalog package: export, tables, mlflow (issue 7's functions)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    from phaselab.orchestrator.cli import CATALOG, JSON, _emit

    @app.command()
    def mlflow(host: str = typer.Option("127.0.0.1", help="Bind address (127.0.0.1 unless you mean it)."),
               port: int = typer.Option(5000), catalog: str = CATALOG, as_json: bool = JSON) -> None:
        """Serve the MLflow UI on the tracking store beside the catalog."""
        from phaselab.catalog.mlflow_server import serve

        _emit(as_json, {"ok": True, "url": f"http://{host}:{port}"})
        code = serve(host=host, port=port, catalog_url=catalog, block=True)
        raise typer.Exit(0 if code == 0 else 1)

