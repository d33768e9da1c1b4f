"""phaselab.catalog.tables."""
