"""phaselab.catalog: the SQL results catalog, MLflow lineage, export, paper tables and figures.

Imports nothing else of phaselab and never torch; sqlalchemy is its only import-time dependency
beyond the standard library (mlflow, pyarrow and matplotlib are imported inside functions).

==================  ==========================================================================
module              what it holds
==================  ==========================================================================
tracking            Tracker protocol + MetricRecord (the only module workloads import)
schema              SQLAlchemy 2 typed tables (DESIGN §5.1); migrations/ holds Alembic
db                  engine (SQLite WAL + BEGIN IMMEDIATE, PostgreSQL via psycopg 3), upgrade
store               CatalogStore: state machine, idempotent transactional writes, reads
rows, store_reads   CatalogStore's value types and read methods (importable from store)
fingerprint         the environment fingerprint per attempt (DESIGN §4)
mlflow_tracker      MlflowTracker (cell parent runs, stage child runs, spool when unreachable)
mlflow_server       ``mlflow server`` on 127.0.0.1 with a SQL store beside the catalog
lineage             catalog rows ↔ MLflow runs; ancestors/descendants of a stage
export              hive-partitioned Parquet/CSV export with provenance metadata
tables/             declarative paper tables → md | latex | csv, ``--check-stale``
figures             perplexity-vs-context curves from the same table specs
==================  ==========================================================================

The CLI verbs (wired by ``phaselab.orchestrator``) call:
``phaselab db upgrade`` → ``CatalogStore(url).upgrade()``;
``phaselab export GRID --format F --out DIR`` → ``export.export_grid(store, GRID, F, DIR)``;
``phaselab tables [--format F] [--out DIR]`` → ``tables.render_all(store, F, out_dir=DIR)``
(and ``figures.render_figures(store, DIR)``); ``--check-stale`` → ``tables.check_stale(store)``
(exit 1 if any list is non-empty); ``phaselab mlflow`` → ``mlflow_server.serve(...)``.
"""
