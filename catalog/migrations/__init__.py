"""phaselab.catalog.migrations."""
