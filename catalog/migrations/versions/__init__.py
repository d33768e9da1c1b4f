"""phaselab.catalog.migrations.versions."""
