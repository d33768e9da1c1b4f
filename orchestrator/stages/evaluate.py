"""``eval``: one evaluation suite on the upstream training stage's checkpoint, as a Ray task
calling ``workloads.evals.api.run_eval`` (CONTRACTS §3.5)."""

from __future__ import annotations

from phaselab.orchestrator.stages.base import Stage, StageContext, StageResult


class EvalStage(Stage):
    kind = "eval"
    sections = ("data", "eval")

    def run(self, ctx: StageContext) -> StageResult:
        from phaselab.workloads.evals.api import run_eval

        checkpoint = ctx.upstream_artifact("checkpoint", "checkpoint")
        records = run_eval(ctx.config["eval"], checkpoint=checkpoint, out_dir=ctx.out_dir,
                           tracker=ctx.tracker)
        artifacts = {"records": ctx.out_dir / "records.json"}
        metrics = {r.key(): r.value for r in records}
        return StageResult(status="succeeded", metrics=metrics, artifacts=artifacts, records=list(records))
