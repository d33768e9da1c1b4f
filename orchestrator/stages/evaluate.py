"""``eval``: one evaluation suite on the upstream training stage's checkpoint, as a Ray task
calling ``workloads.evals.api.run_eval`` (CONTRACTS §3.5).

An optional ``extend`` section (a ``ContextExtension``, the same schema as cpt/finetune stages:
rule, factor, original_max_seq_len, base, attention_factor, block_size) re-builds the
checkpoint's RoPE with that scaling rule before the suite runs, weights unchanged: PI / YaRN
applied at inference without fine-tuning (TAPA Table 2, EXPERIMENTS §6 #22). It is part of the
typed config, so it enters the stage's cache key; an eval without it hashes as before.

``eval.select`` (``last`` | ``best_valid`` | {rule, metric, mode}; workloads.evals.api.SelectConfig)
picks the upstream's final checkpoint or its best-validation weights (the training stage's
``best`` artifact; EXPERIMENTS §2.2 "Reporting"). The default ``last`` is left out of the typed
config, so an eval without ``select`` hashes as before; the records of a best_valid eval name
the selected step (``select/step``) and the criterion's value there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from phaselab.catalog.tracking import run_folder
from phaselab.orchestrator.stages.base import Stage, StageContext, StageResult, normalize_eval
from phaselab.orchestrator.stages.digest import canonical_json, package_root, sha256_hex


class EvalStage(Stage):
    kind = "eval"
    sections = ("data", "eval", "extend")
    required = ("eval",)
    not_from_defaults: ClassVar[Mapping[str, str]] = {"extend": "it would rescale RoPE at inference in every eval stage"}
    starts_from = "checkpoint"
    relation = "evaluates"
    notes: ClassVar[Mapping[str, str]] = {"train": "it evaluates its upstream's checkpoint"}
    scores = True

    def normalize(self, sections: Mapping[str, Any]) -> dict[str, Any]:
        out = super().normalize(sections)
        out["eval"] = normalize_eval(sections.get("eval") or {}, out.pop("data", None))
        return out

    def data_inputs(self, config: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
        return {"eval_data": config["eval"]["data"]} if "data" in config["eval"] else {}

    def key_digests(self, config: Mapping[str, Any]) -> dict[str, str]:
        """lm-eval reads the task YAMLs shipped under workloads/evals/tasks: their bytes count."""
        if config["eval"].get("suite") != "lm-eval":
            return {}
        tasks = package_root("phaselab.workloads.evals") / "tasks"
        files = sorted(p for p in tasks.rglob("*") if p.is_file()) if tasks.is_dir() else []
        return {"eval_tasks": sha256_hex(canonical_json(
            {str(p.relative_to(tasks)): sha256_hex(p.read_bytes()) for p in files}))}

    def run(self, ctx: StageContext) -> StageResult:
        from phaselab.workloads.evals.api import ExtensionNotApplicable, NoBestCheckpoint, run_eval

        checkpoint = ctx.upstream_artifact("checkpoint", "checkpoint")
        best = ctx.upstream_artifact("checkpoint", "best", required=False)
        try:
            records = run_eval(ctx.config["eval"], checkpoint=checkpoint, out_dir=ctx.out_dir,
                               tracker=ctx.tracker, extend=ctx.config.get("extend"), best=best)
        except (ExtensionNotApplicable, NoBestCheckpoint) as err:
            raise ValueError(f"stage {ctx.name!r}: {err}") from err
        artifacts = {"records": ctx.out_dir / run_folder.RECORDS_FILE}
        metrics = {r.key(): r.value for r in records}
        return StageResult(status="succeeded", metrics=metrics, artifacts=artifacts, records=list(records))
