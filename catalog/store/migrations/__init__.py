"""phaselab.catalog.store.migrations."""
