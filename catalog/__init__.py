"""phaselab.catalog."""
