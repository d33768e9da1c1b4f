"""The ``phaselab`` command line: ``main`` holds the app and the run/plan/status verbs; one module
per group of verbs (``reports``: export, tables, figures, mlflow; ``maint``: gc, db, grids;
``train``: eval and train outside a grid; ``tracking``: sync-tracking; ``data``: data prepare);
``views`` renders what the commands show; ``common`` is what they share; ``demo`` is the offline demo."""
