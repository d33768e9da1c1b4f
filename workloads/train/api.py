"""``run_training``: one training stage on one process; the public names of training.

The run itself (setup, loop, checkpoints, final evaluation) is ``session.TrainSession``, which
the Ray Train worker (``ray_entry``) runs too; this module adds the one-process checkpoint folder.
The spec's parsing lives in ``spec`` and the starting model in ``model_init``; their public
names are importable from here too (``__all__``).

    outcome = run_training(spec, out_dir=Path("runs/x"), tracker=NullTracker(), init_from=None)
    outcome.checkpoint   # runs/x/checkpoints/step_0001000/model.pt  (what run_eval loads)
    outcome.metrics      # {"step": 1000, "train/loss": ..., "valid/loss": ..., "valid/acc": ...}
    outcome.records      # MetricRecord rows: loss [nats/token] and acc [fraction] per eval split
    outcome.best         # runs/x/best: best-validation weights (eval.select: best_valid), or None

``spec = {"model": {...}, "data": {...}, "train": {...}, "extend": {...} | None}`` (CONTRACTS §3.4):
ModelConfig, DataConfig, TrainConfig and ContextExtension mappings, converted strictly
(unknown keys are ``ConfigError`` naming the dotted path).

Continued pretraining and fine-tunes (``init_from`` = a ``model.pt`` or a checkpoint folder):
the model config comes from the checkpoint (``spec["model"]``, when given, must match it apart from
``block_size``); ``block_size`` becomes ``extend.block_size`` if set, else the dataset's; the
weights are loaded strictly; ``extend`` is applied through ``model.extended`` (PI / NTK / YaRN
factor + original length, or a new RoPE base); the optimiser and schedule start fresh.

Re-running with the same ``out_dir`` resumes from the newest complete checkpoint in
``out_dir/checkpoints`` (bitwise on CPU); a finished run only re-evaluates. A resume logs
``ckpt/load_s`` (wall seconds of the restore) at the resumed step; the loop logs ``ckpt/save_s``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phaselab.catalog.tracking import MetricRecord, Tracker, run_folder
from phaselab.workloads.config import flatten
from phaselab.workloads.paths import check_path, check_run_folder
from phaselab.workloads.train.checkpoint import CheckpointDir
from phaselab.workloads.train.loop import resolve_device
from phaselab.workloads.train.model_init import build_model, resolve_model_file
from phaselab.workloads.train.session import Ranks, TrainSession
from phaselab.workloads.train.spec import (
    EVAL_SPLITS,
    SPEC_KEYS,
    TrainSpec,
    parse_eval_splits,
    parse_spec,
    periodic_splits,
    with_eval_splits,
)

__all__ = ["EVAL_SPLITS", "SPEC_KEYS", "TrainOutcome", "TrainSpec", "best_folder", "build_model",
           "parse_eval_splits", "parse_spec", "periodic_splits", "resolve_model_file", "run_training",
           "with_eval_splits"]


@dataclass
class TrainOutcome:
    """Result of a training stage (CONTRACTS §3.4). ``checkpoint`` is the final ``model.pt``;
    ``best`` the folder of best-validation weights (checkpoint.BestKeeper), None without
    periodic validation (``train.eval_every`` 0)."""

    metrics: dict[str, float]
    checkpoint: Path
    records: list[MetricRecord]
    best: Path | None = None


def best_folder(out_dir: Path) -> Path | None:
    """``out_dir/best`` when a training run kept best-validation weights there, else None."""
    path = Path(out_dir) / run_folder.BEST_DIR
    return path if path.is_dir() and any(path.iterdir()) else None


def run_training(spec: Mapping[str, Any], *, out_dir: Path, tracker: Tracker,
                 init_from: Path | None = None, stop_after: int | None = None,
                 trace_batches: Path | None = None) -> TrainOutcome:
    """Train (or resume, or just re-evaluate a finished run) on one process: the one-process
    adapter of :class:`~phaselab.workloads.train.session.TrainSession`.

    Args:
        spec: see the module docstring.
        out_dir: the stage's folder; checkpoints go to ``out_dir/checkpoints``. Refused
            (``paths.PathRefused``) when it is no usable folder path or a symlink in it leads
            outside it.
        tracker: receives params, per-step metrics and the final MetricRecords.
        init_from: pretrained ``model.pt`` / checkpoint folder for CPT and fine-tunes.
        stop_after: debug/test only — stop after this many steps without a final checkpoint or
            evaluation (a simulated kill); the outcome's ``checkpoint`` is then the newest saved one.
        trace_batches: tests only — record every training batch read under this folder
            (``session.BatchTrace``).
    Raises:
        TrainingDiverged: NaN/Inf loss or gradient norm.
        TrainingPreempted: SIGTERM arrived; a checkpoint of the current step was saved first.
    """
    parsed = parse_spec(spec)
    cfg = parsed.train
    if cfg.zero_stage is not None:
        raise ValueError(f"train.zero_stage={cfg.zero_stage} runs through ray_entry.fit (DeepSpeed); "
                         "run_training is the single-process reference path")
    out_dir = check_path(out_dir, what="out_dir", expect="new_dir")
    check_run_folder(out_dir)   # no symlink in it may lead the checkpoints and metrics elsewhere
    out_dir.mkdir(parents=True, exist_ok=True)
    session = TrainSession(parsed, spec, out_dir=out_dir, tracker=tracker, init_from=init_from and Path(init_from),
                           device=resolve_device(cfg.device), ranks=Ranks(), trace_batches=trace_batches)
    tracker.log_params(flatten(session.resolved) | {"init_from": str(init_from)})
    ckpts = CheckpointDir(out_dir / run_folder.CHECKPOINTS_DIR, keep=cfg.keep_checkpoints)
    latest = ckpts.latest()
    if latest is not None:
        session.resume(contextlib.nullcontext(latest))
    result = session.run(lambda step, _, write: str(ckpts.save(step, write)), stop_after=stop_after)
    final = ckpts.latest()
    if result.stopped == "stop_after":
        return TrainOutcome(metrics={"step": float(result.step), **result.metrics},
                            checkpoint=(final / run_folder.MODEL_FILE) if final else out_dir, records=[])
    if final is None:
        raise RuntimeError(f"training finished but {ckpts.root} holds no checkpoint")
    done = session.finish(result)
    tracker.log_metrics(done.evaluated, step=result.step)
    tracker.log_records(done.records)
    return TrainOutcome(metrics=done.metrics, checkpoint=final / run_folder.MODEL_FILE, records=done.records,
                        best=best_folder(out_dir))
