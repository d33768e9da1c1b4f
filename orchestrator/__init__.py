"""phaselab.orchestrator."""
