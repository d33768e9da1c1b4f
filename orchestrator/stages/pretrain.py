"""Training stages: ``pretrain`` (from scratch); ``cpt`` and ``finetune`` subclass it and start
from their upstream's checkpoint (CONTRACTS §3.4).

Two launchers, chosen per stage in the grid (never as a fallback):
- ``ray_train`` (default): ``ray_entry.fit`` — Ray Train V2 TorchTrainer, run name = stage hash,
  storage under the runs root, so relaunching resumes (DESIGN §5.3). Costs ~25-30 s of trainer
  start-up per stage on CPU (STACK.md).
- ``ray_task``: ``api.run_training`` inside the stage's Ray task — one process, no trainer
  start-up; re-running with the same out_dir resumes from the newest checkpoint. Used by the
  CPU quickstart, where trainer start-up would dominate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phaselab.catalog.tracking import MetricRecord
from phaselab.orchestrator.stages.base import Stage, StageContext, StageResult, normalize_data


class PretrainStage(Stage):
    kind = "pretrain"
    sections = ("model", "data", "train")

    def normalize(self, sections: Mapping[str, Any]) -> dict[str, Any]:
        sections = {**sections, "data": sections.get("data") or {}}
        out = super().normalize(sections)
        out["data"] = normalize_data(sections["data"])
        return out

    def init_from(self, ctx: StageContext) -> Path | None:
        return None

    def spec(self, ctx: StageContext) -> dict[str, Any]:
        return {k: ctx.config[k] for k in ("model", "data", "train", "extend") if k in ctx.config}

    def run(self, ctx: StageContext) -> StageResult:
        spec, init_from = self.spec(ctx), self.init_from(ctx)
        if ctx.launcher == "ray_train":
            from phaselab.workloads.train.ray_entry import fit

            out = fit(spec, out_dir=ctx.out_dir, run_name=ctx.stage_hash,
                      storage_path=str(ctx.runs_root / "ray_train"),
                      num_workers=ctx.resources.num_workers, use_gpu=ctx.resources.gpus > 0,
                      init_from=init_from)
        else:
            from phaselab.workloads.train.api import run_training

            out = run_training(spec, out_dir=ctx.out_dir, tracker=ctx.tracker, init_from=init_from)
        records = list(out.records)
        named = {r.name for r in records} | {f"{r.split}/{r.name}" for r in records if r.split}
        for k, v in out.metrics.items():   # scalars not already in the records (e.g. tokens/s)
            if k not in named and isinstance(v, (int, float)) and math.isfinite(v):
                records.append(MetricRecord(name=k, value=float(v)))
        return StageResult(status="succeeded", metrics=dict(out.metrics),
                           artifacts={"checkpoint": Path(out.checkpoint)}, records=records)


class ContinuedStage(PretrainStage):
    """Starts from the upstream training stage's checkpoint; the model config comes from it."""

    sections = ("data", "train", "extend")

    def init_from(self, ctx: StageContext) -> Path | None:
        return ctx.upstream_artifact("checkpoint", "checkpoint")
