"""``tune``: a Ray Tune search over a training stage's hyperparameters ("fair tuning": the TAPA
paper trained its RoPE baseline at a 5x larger LR than TAPA, so each encoding deserves its own
LR search).

Tune is used only *inside* this stage (DESIGN §5.2): the catalog, not Tune's experiment state,
is what resumes. Every trial is a real ``run_training`` in its own folder
``<stage out_dir>/trials/<sha256(trial overrides)[:16]>``, so a relaunched tune stage re-creates
the same trials (grid search, or random search with a fixed seed) and each one resumes from its
newest checkpoint or, if finished, only re-evaluates. After the search the controller records
every trial in the catalog as a child stage (kind ``trial``, edge ``uses`` to the tune stage),
and the best *completed* trial's checkpoint is this stage's ``checkpoint`` artifact, which
downstream stages of the cell consume like any training stage's.

Grid YAML::

    tune_lr:
      kind: tune
      tune:
        space: {train.lr: {grid: [3.0e-4, 1.0e-3, 3.0e-3]}, train.warmup: {choice: [10, 100]}}
        metric: valid/loss      # a metric the training logs at each evaluation
        mode: min
        scheduler: asha         # asha (early stopping at evaluations) | fifo
        num_samples: 1          # repeats of the grid / number of random samples
        max_concurrent: 2
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from phaselab.catalog.tracking import MetricRecord, NullTracker
from phaselab.orchestrator.stages.base import (
    Resources,
    SectionError,
    StageContext,
    StageResult,
    convert_section,
)
from phaselab.orchestrator.stages.digest import canonical_json, sha256_hex
from phaselab.orchestrator.stages.pretrain import PretrainStage
from phaselab.workloads.config import flatten, suggest

DISTRIBUTIONS = ("grid", "choice", "uniform", "loguniform", "randint")


@dataclass(frozen=True, kw_only=True)
class TuneSpec:
    """A Ray Tune search over the stage's own training config, one search per cell
    (``docs/TUTORIAL.md`` §6 has a grid). ``space`` maps a dotted key of the stage's config
    (``train.lr``, ``train.warmup``, ``model.dropout``) to one distribution: ``{grid: [...]}``
    (every value; ``num_samples`` repeats the grid), ``{choice: [...]}``, ``{uniform: [lo, hi]}``,
    ``{loguniform: [lo, hi]}`` or ``{randint: [lo, hi]}`` (``num_samples`` draws, seeded by
    ``seed``). Each trial is a real training run; ``metric`` (logged at each evaluation, so the
    stage needs ``train.eval_every`` > 0) and ``mode`` pick the best completed trial, whose
    checkpoint the downstream stages receive. ``scheduler: asha`` stops the worse trials at
    their evaluations once they have had ``grace_period`` of them, keeping 1 in
    ``reduction_factor`` at each rung; ``fifo`` runs every trial to the end.
    ``max_concurrent`` trials run at once."""

    space: dict[str, dict[str, list[Any]]]
    metric: str = "valid/loss"
    mode: Literal["min", "max"] = "min"
    scheduler: Literal["asha", "fifo"] = "asha"
    num_samples: int = 1
    max_concurrent: int = 2
    grace_period: int = 1          # ASHA: evaluations before a trial may be stopped
    reduction_factor: float = 2.0
    seed: int = 0
    tags: dict[str, str] = field(default_factory=dict)


def _check_space(space: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    for path, dist in space.items():
        section = path.split(".", 1)[0]
        node: Any = config
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                raise SectionError(f"tune.space.{path}", f"{path!r} is not a field of this stage's "
                                   f"model/data/train config", suggest(path, flatten(config)))
            node = node[part]
        if section not in ("model", "data", "train"):
            raise SectionError(f"tune.space.{path}", "only model.*, data.* and train.* can be searched")
        if len(dist) != 1 or next(iter(dist)) not in DISTRIBUTIONS:
            raise SectionError(f"tune.space.{path}", f"give exactly one of {', '.join(DISTRIBUTIONS)}, "
                               f"got {sorted(dist)}")
        kind, args = next(iter(dist.items()))
        if kind in ("uniform", "loguniform", "randint") and len(args) != 2:
            raise SectionError(f"tune.space.{path}.{kind}", f"{kind} takes [low, high], got {args!r}")
        if not args:
            raise SectionError(f"tune.space.{path}.{kind}", "needs at least one value")


def set_path(spec: dict, path: str, value: Any) -> None:
    node = spec
    *parents, last = path.split(".")
    for p in parents:
        node = node[p]
    node[last] = value


class _Reporter(NullTracker):
    """Tracker that reports the searched metric to Tune at each evaluation (ASHA's rungs)."""

    def __init__(self, metric: str) -> None:
        self.metric = metric

    def log_metrics(self, metrics: Mapping[str, float], *, step: int) -> None:
        from ray import tune

        if self.metric in metrics and math.isfinite(metrics[self.metric]):
            tune.report({"objective": float(metrics[self.metric]), "step": step, "done": False})


def trial_id(overrides: Mapping[str, Any]) -> str:
    return sha256_hex(canonical_json(dict(overrides)))[:16]


def _trial(config: dict, *, base: dict, trials_dir: str, metric: str) -> None:
    """One Tune trial: the base training spec with the sampled overrides, in its own folder."""
    from ray import tune

    from phaselab.workloads.train.api import run_training

    spec = copy.deepcopy(base)
    for path, value in config.items():
        set_path(spec, path, value)
    out_dir = Path(trials_dir) / trial_id(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "overrides.json").write_text(json.dumps(config, sort_keys=True))
    outcome = run_training(spec, out_dir=out_dir, tracker=_Reporter(metric))
    (out_dir / "outcome.json").write_text(json.dumps({
        "metrics": outcome.metrics, "checkpoint": str(outcome.checkpoint),
        "records": [r.to_dict() for r in outcome.records]}, sort_keys=True))
    tune.report({"objective": float(outcome.metrics[metric]), "step": int(outcome.metrics.get("step", 0)),
                 "done": True})


class TuneStage(PretrainStage):
    """Trains (each trial is a training run) and produces a checkpoint (the best trial's), but is
    not one training run: its own task is Tune's driver, its trials are its child stages."""

    kind = "tune"
    sections = ("model", "data", "train", "tune")
    required = ("tune",)
    default_launcher = "ray_task"   # the trials are Tune's, never a Ray Train run

    def launcher_for(self, resources: Mapping[str, Any], sections: Mapping[str, Any]) -> str:
        return self.default_launcher
    child_kind = "trial"
    storage_roots = ("tune",)       # Tune's experiment state, one folder per stage hash

    def training_spec(self, config: Mapping[str, Any]) -> dict[str, Any] | None:
        return None

    def demand(self, res: Resources, config: Mapping[str, Any]) -> tuple[float, float]:
        n = config["tune"]["max_concurrent"]   # trials run side by side, each with the resources
        return res.cpus * n, res.gpus * n

    def ray_options(self, res: Resources, launcher: str) -> dict[str, Any]:
        return {"num_cpus": 0, "num_gpus": 0}   # the driver only; Tune schedules the trials

    def intermediate_checkpoints(self, runs_root: Path, stage_hash: str) -> list[Path]:
        return list((runs_root / stage_hash).glob("trials/*/checkpoints/step_*"))

    def normalize(self, sections: Mapping[str, Any]) -> dict[str, Any]:
        out = super().normalize({k: v for k, v in sections.items() if k != "tune"})
        tune = convert_section(TuneSpec, sections.get("tune") or {}, "tune")
        _check_space(tune["space"], out)
        out["tune"] = tune
        return out

    def run(self, ctx: StageContext) -> StageResult:
        from ray import tune
        from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
        from ray.tune.search.basic_variant import BasicVariantGenerator

        cfg = ctx.config["tune"]
        base = {k: ctx.config[k] for k in ("model", "data", "train")}
        space = {p: _distribution(tune, d) for p, d in cfg["space"].items()}
        trials_dir = ctx.out_dir / "trials"
        trainable = tune.with_parameters(_trial, base=base, trials_dir=str(trials_dir), metric=cfg["metric"])
        trainable = tune.with_resources(trainable, {"cpu": ctx.resources.cpus, "gpu": ctx.resources.gpus})
        scheduler = (ASHAScheduler(grace_period=cfg["grace_period"], reduction_factor=cfg["reduction_factor"],
                                   max_t=10**9) if cfg["scheduler"] == "asha" else FIFOScheduler())
        tuner = tune.Tuner(trainable, param_space=space, tune_config=tune.TuneConfig(
            metric="objective", mode=cfg["mode"], num_samples=cfg["num_samples"], scheduler=scheduler,
            max_concurrent_trials=cfg["max_concurrent"], search_alg=BasicVariantGenerator(random_state=cfg["seed"])),
            run_config=tune.RunConfig(name=ctx.stage_hash, storage_path=str(ctx.runs_root / "tune"), verbose=0))
        grid = tuner.fit()
        trials = _collect(grid, trials_dir, cfg["mode"])
        done = [t for t in trials if t["completed"]]
        if not done:
            raise RuntimeError(f"tune stage {ctx.name}: no trial completed ({len(trials)} stopped or failed)")
        best = (min if cfg["mode"] == "min" else max)(done, key=lambda t: t["objective"])
        summary = ctx.out_dir / "trials.json"
        summary.write_text(json.dumps({"best": best["id"], "trials": trials}, indent=1, sort_keys=True))
        records = [MetricRecord(**r) for r in best["records"]]
        records.append(MetricRecord(name="trials_completed", value=float(len(done))))
        return StageResult(status="succeeded", metrics={"best_objective": best["objective"]},
                           artifacts={"checkpoint": Path(best["checkpoint"]), "trials": summary},
                           records=records, children=trials)


def _distribution(tune: Any, dist: Mapping[str, list[Any]]) -> Any:
    kind, args = next(iter(dist.items()))
    return {"grid": tune.grid_search, "choice": tune.choice}[kind](list(args)) if kind in ("grid", "choice") \
        else {"uniform": tune.uniform, "loguniform": tune.loguniform, "randint": tune.randint}[kind](*args)


def _collect(grid: Any, trials_dir: Path, mode: str) -> list[dict[str, Any]]:
    """One dict per trial: overrides, completed?, objective, final metrics, checkpoint."""
    out = []
    for result in grid:
        overrides = {k: v for k, v in (result.config or {}).items()}
        tid = trial_id(overrides)
        outcome_path = trials_dir / tid / "outcome.json"
        metrics = result.metrics or {}
        if outcome_path.is_file():
            outcome = json.loads(outcome_path.read_text())
            out.append(_child(tid, overrides, metrics) | {
                "completed": True, "metrics": outcome["metrics"], "checkpoint": outcome["checkpoint"],
                "records": outcome["records"]})
        else:
            error = str(result.error) if result.error else None
            child = _child(tid, overrides, metrics)
            message = (f"stopped by the scheduler at step {metrics.get('step')} (objective "
                       f"{child['objective']:.4g})" + (f": {error}" if error else ""))
            out.append(child | {"completed": False, "step": metrics.get("step"), "error": error, "metrics": {},
                                "checkpoint": None, "records": [], "failure_class": "early_stopped",
                                "message": message})
    return out


def _child(tid: str, overrides: Mapping[str, Any], metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The fields every trial's child-stage dict has (StageResult.children): its id, its config
    in the catalog besides its parent, and its folder under the tune stage's out_dir."""
    return {"id": tid, "overrides": dict(overrides), "config": {"overrides": dict(overrides)},
            "folder": f"trials/{tid}", "objective": float(metrics.get("objective", math.nan))}
