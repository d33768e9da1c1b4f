"""``run_training``: one training stage on one process, and the spec parsing every launcher shares.

The run itself (setup, loop, checkpoints, final evaluation) is ``session.TrainSession``, which
the Ray Train worker (``ray_entry``) runs too; this module adds the one-process checkpoint folder.

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
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from phaselab.catalog.tracking import MetricRecord, Tracker
from phaselab.workloads.config import ConfigError, flatten, from_dict, to_dict
from phaselab.workloads.data import DataConfig
from phaselab.workloads.models.config import ContextExtension, ModelConfig
from phaselab.workloads.paths import PathRefused, check_path, check_run_folder, shown
from phaselab.workloads.train.checkpoint import BEST, LATEST, CheckpointDir
from phaselab.workloads.train.loop import TrainConfig, resolve_device
from phaselab.workloads.train.session import EVAL_SPLITS, MODEL_FILE, Ranks, TrainSession

SPEC_KEYS = ("model", "data", "train", "extend")


@dataclass
class TrainOutcome:
    """Result of a training stage (CONTRACTS §3.4). ``checkpoint`` is the final ``model.pt``;
    ``best`` the folder of best-validation weights (checkpoint.BestKeeper), None without
    periodic validation (``train.eval_every`` 0)."""

    metrics: dict[str, float]
    checkpoint: Path
    records: list[MetricRecord]
    best: Path | None = None


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """The typed form of a training spec (model None = take it from ``init_from``)."""

    model: ModelConfig | None = None
    data: DataConfig
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    extend: ContextExtension | None = None


def parse_spec(spec: Mapping[str, Any]) -> TrainSpec:
    """Strictly convert a spec mapping (CONTRACTS §3.1 rules); raises ConfigError.
    ``train.eval_splits`` is read by :func:`periodic_splits`, not by TrainConfig."""
    if not isinstance(spec, Mapping):
        raise TypeError(f"training spec must be a mapping, got {type(spec).__name__}")
    if "data" not in spec:
        raise ConfigError("data: required section of a training spec is missing")
    periodic_splits(spec)
    train = spec.get("train")
    if isinstance(train, Mapping) and EVAL_SPLITS in train:
        spec = {**spec, "train": {k: v for k, v in train.items() if k != EVAL_SPLITS}}
    return from_dict(TrainSpec, spec)


# ``train.eval_splits``: the splits evaluated at every periodic validation. The loop validates
# on "valid"; the others are evaluated through its ``on_eval`` hook, logged as ``<split>/loss``
# and ``<split>/acc`` and their minimum loss kept (EXPERIMENTS §2.2: the minimum test NLL over
# evaluations, labelled as such). Default ["valid"], left out of the typed config.


def parse_eval_splits(raw: Any) -> tuple[str, ...]:
    """A list of split names that includes "valid" (ConfigError naming ``train.eval_splits``)."""
    key = f"train.{EVAL_SPLITS}"
    if not isinstance(raw, (list, tuple)) or not all(isinstance(s, str) and s for s in raw):
        raise ConfigError(f"{key}: expected a list of split names like [valid, test], got {raw!r}")
    if "valid" not in raw or len(set(raw)) != len(raw):
        raise ConfigError(f"{key}: must name 'valid' (the loop's own validation) once, and each "
                          f"split once; got {list(raw)!r}")
    return tuple(raw)


def periodic_splits(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The splits of ``train.eval_splits`` besides "valid" (empty by default)."""
    train = spec.get("train")
    if not isinstance(train, Mapping) or EVAL_SPLITS not in train:
        return ()
    return tuple(s for s in parse_eval_splits(train[EVAL_SPLITS]) if s != "valid")


def resolve_model_file(path: Path, *, what: str = "init_from") -> Path:
    """``model.pt`` itself, a checkpoint folder holding one, or a run's ``checkpoints/`` / run
    folder (its newest complete checkpoint). ``paths.PathRefused`` (a ValueError naming ``what``
    and the path) when it is no usable path or holds no checkpoint."""
    path = check_path(path, what=what, expect="exists")
    if path.is_file():
        return path
    for candidate in (path, path / "checkpoints"):
        if (candidate / MODEL_FILE).is_file():
            return candidate / MODEL_FILE
        if (candidate / LATEST).exists() or any(candidate.glob("step_*")):
            latest = CheckpointDir(candidate).latest()
            if latest is not None:
                return latest / MODEL_FILE
    raise PathRefused(f"{what} {shown(path)} holds no model.pt and no complete checkpoint")


def build_model(parsed: TrainSpec, dataset: Any, init_from: Path | None) -> torch.nn.Module:
    """A fresh model from ``parsed.model``, or the ``init_from`` weights re-housed at the new
    block size and extended (module docstring)."""
    from phaselab.workloads.models.transformer import Transformer

    if init_from is None:
        if parsed.model is None:
            raise ConfigError("model: required unless init_from is given")
        if parsed.extend is not None:
            raise ValueError("extend is only meaningful with init_from (a pretrained checkpoint)")
        cfg = parsed.model
        if cfg.block_size < dataset.block_size:
            raise ValueError(f"model.block_size={cfg.block_size} < data block_size={dataset.block_size}")
        if cfg.vocab_size < dataset.vocab_size:
            raise ValueError(f"model.vocab_size={cfg.vocab_size} < dataset vocab_size={dataset.vocab_size}")
        return Transformer(cfg)
    from phaselab.workloads.models.checkpoint_io import load_model

    try:
        source = load_model(resolve_model_file(init_from, what="checkpoint"))
    except PathRefused as err:   # names the file; say that it came from init_from
        raise PathRefused(f"init_from: {err}") from None
    ext = parsed.extend
    block = ext.block_size if ext is not None and ext.block_size is not None else dataset.block_size
    base_cfg = source.cfg
    if parsed.model is not None and dataclasses.replace(parsed.model, block_size=base_cfg.block_size) != base_cfg:
        raise ValueError("spec model differs from the init_from checkpoint's model config apart from "
                         f"block_size: {to_dict(parsed.model)} vs {to_dict(base_cfg)}")
    if block < dataset.block_size:
        raise ValueError(f"extend.block_size={block} < data block_size={dataset.block_size}")
    model = Transformer(dataclasses.replace(base_cfg, block_size=block))
    model.load_state_dict(source.state_dict(), strict=True)
    if ext is not None:
        model.extended(ext)
    return model


def best_folder(out_dir: Path) -> Path | None:
    """``out_dir/best`` when a training run kept best-validation weights there, else None."""
    path = Path(out_dir) / BEST
    return path if path.is_dir() and any(path.iterdir()) else None


def with_eval_splits(resolved: dict[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved spec with ``train.eval_splits`` put back when the spec sets other splits."""
    if not periodic_splits(spec):
        return resolved
    return {**resolved, "train": {**resolved["train"], EVAL_SPLITS: list(spec["train"][EVAL_SPLITS])}}


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
    ckpts = CheckpointDir(out_dir / "checkpoints", keep=cfg.keep_checkpoints)
    latest = ckpts.latest()
    if latest is not None:
        session.resume(contextlib.nullcontext(latest))
    result = session.run(lambda step, _, write: str(ckpts.save(step, write)), stop_after=stop_after)
    final = ckpts.latest()
    if result.stopped == "stop_after":
        return TrainOutcome(metrics={"step": float(result.step), **result.metrics},
                            checkpoint=(final / MODEL_FILE) if final else out_dir, records=[])
    if final is None:
        raise RuntimeError(f"training finished but {ckpts.root} holds no checkpoint")
    done = session.finish(result)
    tracker.log_metrics(done.evaluated, step=result.step)
    tracker.log_records(done.records)
    return TrainOutcome(metrics=done.metrics, checkpoint=final / MODEL_FILE, records=done.records,
                        best=best_folder(out_dir))
