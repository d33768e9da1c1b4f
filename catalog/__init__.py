"""phaselab.catalog: the SQL results catalog, MLflow tracking, export, paper tables and figures.

Imports nothing else of phaselab and never torch; sqlalchemy is its only import-time dependency
beyond the standard library (mlflow, pyarrow and matplotlib are imported inside functions).

==========  =====================================================================================
room        what it holds
==========  =====================================================================================
store/      the SQL catalog: typed tables and Alembic migrations, the engine, ``CatalogStore``
            (state machine, idempotent transactional writes; its queries as ``.reads``), DAG
            walks, the environment fingerprint per attempt (DESIGN §4), the project home
tracking/   the Tracker interface and a stage's run-folder names (the only parts workloads
            import); MLflow: the experiment, stage runs that spool while the server is down, the
            grid's summary run with its comparison, ``mlflow server`` on 127.0.0.1, lineage
reports/    declarative paper tables (md | latex | csv, ``--check-stale``), figures, export
==========  =====================================================================================

The CLI verbs (wired by ``phaselab.orchestrator``) call:
``phaselab db upgrade`` → ``CatalogStore(url).upgrade()``;
``phaselab export GRID --format F --out DIR`` → ``reports.export.export_grid(store, GRID, F, DIR)``;
``phaselab tables [--format F] [--out DIR]`` → ``reports.tables.render_all(store, F, out_dir=DIR)``
(and ``reports.figures.render_figures(store, DIR)``); ``--check-stale`` →
``reports.tables.check_stale(store)`` (exit 1 if any list is non-empty); ``phaselab mlflow`` →
``tracking.mlflow_server.serve(...)``.
"""
