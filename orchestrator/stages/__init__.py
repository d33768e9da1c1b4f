"""phaselab.orchestrator.stages."""
