"""``run_training``: the one entry point of the reference (single-process) training path.

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

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from phaselab.catalog.tracking import MetricRecord, Tracker
from phaselab.workloads.config import ConfigError, from_dict, to_dict
from phaselab.workloads.data import DataConfig, build_dataset
from phaselab.workloads.models.config import ContextExtension, ModelConfig
from phaselab.workloads.train.checkpoint import (
    BEST,
    LATEST,
    BestKeeper,
    CheckpointDir,
    EvalMinima,
    load_train_state,
    rng_state,
    seed_everything,
    set_rng_state,
    write_json,
)
from phaselab.workloads.train.fast_step import engine_for
from phaselab.workloads.train.loop import TrainConfig, evaluate, resolve_device, train
from phaselab.workloads.train.optim import build_optimizer
from phaselab.workloads.train.signals import stop_on_sigterm

SPEC_KEYS = ("model", "data", "train", "extend")
MODEL_FILE, STATE_FILE, SPEC_FILE = "model.pt", "train_state.pt", "spec.json"


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
EVAL_SPLITS = "eval_splits"
MINIMA_FILE = "eval_minima.json"


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


def resolve_model_file(path: Path) -> Path:
    """``model.pt`` itself, a checkpoint folder holding one, or a run's ``checkpoints/`` / run
    folder (its newest complete checkpoint)."""
    path = Path(path)
    if path.is_file():
        return path
    for candidate in (path, path / "checkpoints"):
        if (candidate / MODEL_FILE).is_file():
            return candidate / MODEL_FILE
        if (candidate / LATEST).exists() or any(candidate.glob("step_*")):
            latest = CheckpointDir(candidate).latest()
            if latest is not None:
                return latest / MODEL_FILE
    raise ValueError(f"init_from={str(path)!r} holds no model.pt and no complete checkpoint")


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

    source = load_model(resolve_model_file(init_from))
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


def _write_checkpoint(path: Path, *, model, optimizer, step: int, data_index: int,
                      metrics: Mapping[str, float], spec: Mapping[str, Any]) -> None:
    from phaselab.workloads.models.checkpoint_io import save_model

    save_model(model, path / MODEL_FILE)
    torch.save({"step": step, "data_index": data_index, "optimizer": optimizer.state_dict(),
                "rng": rng_state(), "metrics": dict(metrics)}, path / STATE_FILE)
    write_json(path / SPEC_FILE, spec)


def _restore(ckpt: Path, *, model, optimizer) -> int:
    """Load weights, optimiser and RNG states from a checkpoint folder; return its step."""
    from phaselab.workloads.models.checkpoint_io import load_model

    model.load_state_dict(load_model(ckpt / MODEL_FILE).state_dict(), strict=True)
    state = load_train_state(ckpt / STATE_FILE)
    optimizer.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"])
    return int(state["step"])


def keep_best(out_dir: Path, cfg: TrainConfig, model) -> Callable[[int, Mapping[str, float]], None] | None:
    """The loop's ``on_eval`` that keeps the best-validation weights under ``out_dir/best``
    (``eval.select: best_valid``); None without periodic validation (``eval_every`` 0), where
    the only validation is the final step's and "best" would just be "last"."""
    if not cfg.eval_every:
        return None
    from phaselab.workloads.models.checkpoint_io import save_model

    keeper = BestKeeper(Path(out_dir) / BEST)

    def on_eval(step: int, metrics: Mapping[str, float]) -> None:
        for metric in keeper.update(metrics):
            keeper.save(step, metric, metrics[metric], lambda d: save_model(model, d / MODEL_FILE))

    return on_eval


def track_splits(out_dir: Path, cfg: TrainConfig, splits: tuple[str, ...], *, engine, dataset,
                 tracker: Tracker, batch_size: int, rank: int = 0, reduce: Callable[[float], float] = float
                 ) -> Callable[[int, Mapping[str, float]], None] | None:
    """The ``on_eval`` that evaluates ``splits`` too (every rank: under ZeRO-3 the forward is
    collective), logs them on rank 0 and keeps each split's minimum loss in ``out_dir/eval_minima.json``."""
    if not splits:
        return None
    for split in splits:
        if split not in dataset.splits:
            raise ConfigError(f"train.{EVAL_SPLITS}: dataset {dataset.name!r} has no split {split!r} "
                              f"(splits: {', '.join(dataset.splits)})")
    minima = EvalMinima(Path(out_dir) / MINIMA_FILE)

    def on_eval(step: int, _: Mapping[str, float]) -> None:
        for split in splits:
            ev = evaluate(engine.module, dataset, split, batch_size=batch_size, max_batches=cfg.eval_batches,
                          device=engine.device, autocast=engine.autocast)
            metrics = {f"{split}/loss": reduce(ev["loss"]), f"{split}/acc": reduce(ev["acc"])}
            if rank == 0:
                tracker.log_metrics(metrics, step=step)
            minima.update(step, {f"{split}/loss": metrics[f"{split}/loss"]}, write=rank == 0)

    return on_eval


def minima_records(out_dir: Path, dataset) -> list[MetricRecord]:
    """``loss_min_over_evals`` per split of ``train.eval_splits`` (its step = where it occurred)."""
    minima = EvalMinima(Path(out_dir) / MINIMA_FILE).minima
    return [MetricRecord(name="loss_min_over_evals", value=m["value"], unit="nats/token", step=int(m["step"]),
                         context_len=dataset.block_size, task=dataset.name, split=name.split("/")[0])
            for name, m in sorted(minima.items())]


def chain(*hooks: Callable[[int, Mapping[str, float]], None] | None):
    """One ``on_eval`` calling each given hook in order (None when none is given)."""
    live = [h for h in hooks if h is not None]
    if not live:
        return None

    def on_eval(step: int, metrics: Mapping[str, float]) -> None:
        for hook in live:
            hook(step, metrics)

    return on_eval


def best_folder(out_dir: Path) -> Path | None:
    """``out_dir/best`` when a training run kept best-validation weights there, else None."""
    path = Path(out_dir) / BEST
    return path if path.is_dir() and any(path.iterdir()) else None


def final_evaluation(module, dataset, cfg: TrainConfig, *, step: int, device, autocast
                     ) -> tuple[dict[str, float], list[MetricRecord]]:
    """Loss and accuracy on each final-eval split, as metrics and MetricRecord rows."""
    splits = cfg.final_eval_splits or tuple(s for s in dataset.splits if s != "train")
    metrics: dict[str, float] = {}
    records: list[MetricRecord] = []
    for split in splits:
        ev = evaluate(module, dataset, split, batch_size=cfg.eval_batch_size or cfg.batch_size,
                      max_batches=cfg.final_eval_batches, device=device, autocast=autocast)
        metrics |= {f"{split}/loss": ev["loss"], f"{split}/acc": ev["acc"]}
        common = {"step": step, "context_len": dataset.block_size, "task": dataset.name, "split": split,
                      "n": int(ev["tokens"])}
        records += [MetricRecord(name="loss", value=ev["loss"], unit="nats/token", **common),
                    MetricRecord(name="acc", value=ev["acc"], unit="fraction", **common)]
    return metrics, records


def with_eval_splits(resolved: dict[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved spec with ``train.eval_splits`` put back when the spec sets other splits."""
    if not periodic_splits(spec):
        return resolved
    return {**resolved, "train": {**resolved["train"], EVAL_SPLITS: list(spec["train"][EVAL_SPLITS])}}


def flat_params(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"lr": 1}} -> {"train.lr": 1} (MLflow params are flat, DESIGN §5.5)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out |= flat_params(value, name + ".")
        else:
            out[name] = value
    return out


def run_training(spec: Mapping[str, Any], *, out_dir: Path, tracker: Tracker,
                 init_from: Path | None = None, stop_after: int | None = None) -> TrainOutcome:
    """Train (or resume, or just re-evaluate a finished run) on one process.

    Args:
        spec: see the module docstring.
        out_dir: the stage's folder; checkpoints go to ``out_dir/checkpoints``.
        tracker: receives params, per-step metrics and the final MetricRecords.
        init_from: pretrained ``model.pt`` / checkpoint folder for CPT and fine-tunes.
        stop_after: debug/test only — stop after this many steps without a final checkpoint or
            evaluation (a simulated kill); the outcome's ``checkpoint`` is then the newest saved one.
    Raises:
        TrainingDiverged: NaN/Inf loss or gradient norm.
        TrainingPreempted: SIGTERM arrived; a checkpoint of the current step was saved first.
    """
    parsed = parse_spec(spec)
    cfg = parsed.train
    if cfg.zero_stage is not None:
        raise ValueError(f"train.zero_stage={cfg.zero_stage} runs through ray_entry.fit (DeepSpeed); "
                         "run_training is the single-process reference path")
    resolved = with_eval_splits(to_dict(parsed), spec)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)  # model init is part of the seeded run
    dataset = build_dataset(parsed.data)
    model = build_model(parsed, dataset, Path(init_from) if init_from is not None else None).to(device)
    optimizer = build_optimizer(model, cfg.optim())
    ckpts = CheckpointDir(out_dir / "checkpoints", keep=cfg.keep_checkpoints)
    latest = ckpts.latest()
    start, load_s = 0, None
    if latest is not None:
        t0 = time.perf_counter()
        start = _restore(latest, model=model, optimizer=optimizer)
        load_s = time.perf_counter() - t0
    tracker.log_params(flat_params(resolved) | {"init_from": str(init_from)})
    if load_s is not None:  # restore time, at the step the run resumes from
        tracker.log_metrics({"ckpt/load_s": load_s}, step=start)
    engine = engine_for(model, optimizer, cfg, device=device, block_size=dataset.block_size)

    def save(step: int, metrics: Mapping[str, float]) -> str:
        path = ckpts.save(step, lambda d: _write_checkpoint(
            d, model=model, optimizer=optimizer, step=step, data_index=step * cfg.grad_accum,
            metrics=metrics, spec=resolved))
        return str(path)

    with stop_on_sigterm() as flag:
        result = train(engine, dataset, cfg, tracker=tracker, start_step=start, save=save,
                       stop_after=stop_after, stop_flag=flag, on_eval=chain(
                           keep_best(out_dir, cfg, model),
                           track_splits(out_dir, cfg, periodic_splits(spec), engine=engine, dataset=dataset,
                                        tracker=tracker, batch_size=cfg.eval_batch_size or cfg.micro_batch(1))))
    final = ckpts.latest()
    if result.stopped == "stop_after":
        return TrainOutcome(metrics={"step": float(result.step), **result.metrics},
                            checkpoint=(final / MODEL_FILE) if final else out_dir, records=[])
    if final is None:
        raise RuntimeError(f"training finished but {ckpts.root} holds no checkpoint")
    final_metrics, records = final_evaluation(model, dataset, cfg, step=result.step, device=device,
                                              autocast=engine.autocast)
    records += minima_records(out_dir, dataset)
    tracker.log_metrics(final_metrics, step=result.step)
    metrics = {"step": float(result.step), **result.metrics, **final_metrics}
    tracker.log_records(records)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return TrainOutcome(metrics=metrics, checkpoint=final / MODEL_FILE, records=records,
                        best=best_folder(out_dir))
