"""``analysis``: model analyses that are not scores (frequency usage, δ heat maps; EXPERIMENTS
§2.6) — the ``freq`` suite of ``run_eval`` on the upstream checkpoint."""

from __future__ import annotations

from phaselab.orchestrator.stages.evaluate import EvalStage


class AnalysisStage(EvalStage):
    kind = "analysis"
