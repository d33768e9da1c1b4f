"""Training stages: ``pretrain`` (from scratch); ``cpt`` and ``finetune`` subclass it and start
from their upstream's checkpoint (CONTRACTS §3.4).

Two launchers, named per stage in the grid or, where it names none, chosen by
:meth:`PretrainStage.launcher_for` (never as a fallback after a failure): ``ray_train`` for a
stage with several workers or DeepSpeed ZeRO, ``ray_task`` for one process, where Ray Train adds
only its start-up (~30 s a stage on the H200, ~25-30 s on CPU):
- ``ray_train``: ``ray_entry.fit`` — Ray Train V2 TorchTrainer, run name = stage hash,
  storage under the runs root, so relaunching resumes (DESIGN §5.3). Costs ~25-30 s of trainer
  start-up per stage on CPU (STACK.md). Rank 0 writes per-step metrics to
  ``out_dir/metrics.jsonl`` (workers hold no MLflow run); the stage replays that file into its
  tracker when ``fit`` returns or raises (:func:`replay_metrics`), so the MLflow child run gets the
  same curves as a single-process stage.
- ``ray_task``: ``api.run_training`` inside the stage's Ray task — one process, no trainer
  start-up; re-running with the same out_dir resumes from the newest checkpoint. Used by the
  CPU quickstart, where trainer start-up would dominate. Its per-step metrics go to the stage's
  tracker and to ``out_dir/metrics.jsonl`` too, so a run without MLflow keeps its learning
  curves (deploy/gpu/pack.py reads them from there).

Artifacts: ``checkpoint`` (the final model.pt) and, when the run validated periodically
(``train.eval_every`` > 0), ``best`` (the ``out_dir/best`` folder of best-validation weights that
evals with ``select: best_valid`` load; workloads.train.checkpoint.BestKeeper).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from phaselab.catalog.tracking import FanoutTracker, MetricRecord, Tracker, run_folder
from phaselab.orchestrator.stages.base import Resources, Stage, StageContext, StageResult, normalize_data

log = logging.getLogger(__name__)


def _replay_state(out_dir: Path) -> dict[str, Any]:
    path = Path(out_dir) / run_folder.REPLAY_STATE_FILE   # {"lines": replayed lines, "records": bool}
    return json.loads(path.read_text()) if path.is_file() else {"lines": 0, "records": False}


def _save_replay_state(out_dir: Path, state: Mapping[str, Any]) -> None:
    path = Path(out_dir) / run_folder.REPLAY_STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(state), sort_keys=True))
    tmp.replace(path)   # atomic: a kill leaves the old or the new state, never half of one


def _points(rows: list[dict[str, Any]], seen: set[tuple[int, str]]) -> list[tuple[int, dict[str, float]]]:
    """``(step, metrics)`` of ``rows`` without the (step, name) pairs in ``seen`` (updated)."""
    out = []
    for row in rows:
        step = int(row["step"])
        fresh = {k: v for k, v in row.items() if k != "step" and (step, k) not in seen}
        seen |= {(step, k) for k in fresh}
        if fresh:
            out.append((step, fresh))
    return out


def replay_metrics(out_dir: Path, tracker: Tracker) -> int:
    """Send the lines of ``out_dir/metrics.jsonl`` that were not replayed yet to ``tracker``, each
    at its own step. The file is append-only; ``out_dir/metrics.replayed.json`` keeps how many of
    its lines were replayed, so a retried or resumed stage sends only what is new. A resumed Ray
    Train run rewrites the steps after its checkpoint: a (step, metric) pair is sent once, the
    first value wins (as in ``verify.stored_losses``). Returns the number of points sent.
    """
    out_dir = Path(out_dir)
    state = _replay_state(out_dir)
    steps = run_folder.steps_path(out_dir)
    try:
        rows = run_folder.read_steps(steps)
    except ValueError as err:   # a malformed line before the last (a torn last one is skipped there)
        log.warning("cannot replay %s: %s", steps, err)
        return 0
    done = int(state["lines"])
    if done > len(rows):   # the file was replaced (a wiped stage folder): start over
        log.warning("%s has %d lines, %d were replayed; replaying it anew", steps, len(rows), done)
        done = 0
    seen: set[tuple[int, str]] = set()
    _points(rows[:done], seen)
    points = _points(rows[done:], seen)
    for step, metrics in points:
        tracker.log_metrics(metrics, step=step)
    if len(rows) != int(state["lines"]):
        _save_replay_state(out_dir, {**state, "lines": len(rows)})
    return sum(len(m) for _, m in points)


def log_records_once(out_dir: Path, tracker: Tracker, records: list[MetricRecord]) -> bool:
    """The final evaluation's records into ``tracker`` (``run_training`` logs them itself on the
    single-process path), at most once per stage folder. Returns whether they were logged now."""
    state = _replay_state(out_dir)
    if state["records"] or not records:
        return False
    tracker.log_records(records)
    _save_replay_state(out_dir, {**state, "records": True})
    return True


def resources_per_worker(res: Resources) -> dict[str, float]:
    """Ray Train's ``resources_per_worker`` of a ``ray_train`` stage: its declared per-worker
    ``cpus``/``gpus`` (spec.ResourcesSpec) and, when set, its ``accelerator`` as the resource
    Ray's own ``accelerator_type`` option asks for (``accelerator_type:<type>``: 0.001, the
    same constraint the controller checks before it launches a stage). ``memory_gb`` is not passed:
    the controller does not check it against the cluster for ray_train stages, and a reservation
    no node can meet would leave the workers pending forever instead of failing. Resources are
    not in the cache key, so none of this changes a stage hash."""
    out: dict[str, float] = {"CPU": res.cpus}
    if res.gpus > 0:
        out["GPU"] = res.gpus
    if res.accelerator:
        out[f"accelerator_type:{res.accelerator}"] = 0.001
    return out


def _replay_quietly(ctx: StageContext) -> None:
    """Replay without masking ``fit``'s own error: the curves are lineage, not the result."""
    try:
        replay_metrics(ctx.out_dir, ctx.tracker)
    except Exception as exc:  # noqa: BLE001
        log.warning("stage %s: replaying %s failed: %s", ctx.name, run_folder.STEPS_FILE, exc)


class PretrainStage(Stage):
    kind = "pretrain"
    sections = ("model", "data", "train")
    starts_from = "scratch"
    output = "checkpoint"
    default_launcher = "ray_train"
    storage_roots = ("ray_train",)   # Ray Train's run storage, one folder per stage hash

    def launcher_for(self, resources: Mapping[str, Any], sections: Mapping[str, Any]) -> str:
        """``ray_train`` when the stage trains on several workers or under ZeRO, else
        ``ray_task`` (one process: Ray Train's worker group would add its start-up and nothing
        else; the controller retries and resumes a ray_task stage from its checkpoints)."""
        workers = resources.get("num_workers", 1)
        zero = (sections.get("train") or {}).get("zero_stage") if isinstance(sections.get("train"), Mapping) else None
        several = not isinstance(workers, int) or isinstance(workers, bool) or workers > 1
        return "ray_train" if several or zero is not None else "ray_task"

    def normalize(self, sections: Mapping[str, Any]) -> dict[str, Any]:
        sections = {**sections, "data": sections.get("data") or {}}
        out = super().normalize(sections)
        out["data"] = normalize_data(sections["data"])
        return out

    def training_spec(self, config: Mapping[str, Any]) -> dict[str, Any] | None:
        return {k: config[k] for k in ("model", "data", "train", "extend") if k in config}

    def ray_options(self, res: Resources, launcher: str) -> dict[str, Any]:
        if launcher == "ray_train":   # the task is the driver only; Ray Train schedules the workers
            return {"num_cpus": 0, "num_gpus": 0}
        return super().ray_options(res, launcher)

    def intermediate_checkpoints(self, runs_root: Path, stage_hash: str) -> list[Path]:
        ray = runs_root / "ray_train" / stage_hash
        return [*(runs_root / stage_hash).glob("checkpoints/step_*"), *ray.glob("step_*"), *ray.glob("checkpoint_*")]

    def init_from(self, ctx: StageContext) -> Path | None:
        return None

    def spec(self, ctx: StageContext) -> dict[str, Any]:
        return self.training_spec(ctx.config) or {}

    def fit_kwargs(self, ctx: StageContext) -> dict[str, Any]:
        """The arguments of ``ray_entry.fit`` for this stage: ``fit(**self.fit_kwargs(ctx))``."""
        res = ctx.resources
        return {"spec": self.spec(ctx), "out_dir": ctx.out_dir, "run_name": ctx.stage_hash,
                "storage_path": str(ctx.runs_root / "ray_train"), "num_workers": res.num_workers,
                "use_gpu": res.gpus > 0, "init_from": self.init_from(ctx),
                "resources_per_worker": resources_per_worker(res)}

    def run(self, ctx: StageContext) -> StageResult:
        if ctx.launcher == "ray_train":
            from phaselab.workloads.train.ray_entry import fit

            try:
                out = fit(**self.fit_kwargs(ctx))
            finally:   # also after a failure: the steps that did run belong in the run's curves
                _replay_quietly(ctx)
            log_records_once(ctx.out_dir, ctx.tracker, list(out.records))
        else:
            from phaselab.workloads.train.api import run_training
            from phaselab.workloads.train.ray_entry import JsonlTracker

            tracker = FanoutTracker(ctx.tracker, JsonlTracker(run_folder.steps_path(ctx.out_dir)))
            out = run_training(self.spec(ctx), out_dir=ctx.out_dir, tracker=tracker,
                               init_from=self.init_from(ctx))
        records = list(out.records)
        named = {r.name for r in records} | {f"{r.split}/{r.name}" for r in records if r.split}
        for k, v in out.metrics.items():   # scalars not already in the records (e.g. tokens/s)
            if k not in named and isinstance(v, (int, float)) and math.isfinite(v):
                records.append(MetricRecord(name=k, value=float(v)))
        artifacts = {"checkpoint": Path(out.checkpoint)}
        if out.best is not None:   # best-validation weights, for evals with select: best_valid
            artifacts["best"] = Path(out.best)
        return StageResult(status="succeeded", metrics=dict(out.metrics), artifacts=artifacts,
                           records=records)


class ContinuedStage(PretrainStage):
    """Starts from the upstream training stage's checkpoint; the model config comes from it."""

    sections = ("data", "train", "extend")
    starts_from = "checkpoint"
    notes: ClassVar[Mapping[str, str]] = {"model": "its model comes from the upstream checkpoint"}

    def init_from(self, ctx: StageContext) -> Path | None:
        return ctx.upstream_artifact("checkpoint", "checkpoint")
