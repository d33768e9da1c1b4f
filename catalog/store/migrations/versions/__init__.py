"""phaselab.catalog.store.migrations.versions."""
