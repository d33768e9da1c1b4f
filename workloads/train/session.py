"""One training run, owned by one object for every launcher: :class:`TrainSession`.

``api.run_training`` (one process) and ``ray_entry.train_loop_per_worker`` (every Ray Train rank)
are thin adapters around it. They differ only in what :class:`Ranks` says (rank, world, how to
average a float over ranks) and in how a written checkpoint folder is published
(``CheckpointDir.save``: an atomic rename; Ray: a report that merges the ranks' folders). Setup,
the engine, the checkpoint writer and restorer, best-validation weights, extra evaluation
splits, the final evaluation and the final-output files exist once, here.

    session = TrainSession(parsed, spec, out_dir=..., tracker=..., init_from=None, device=..., ranks=Ranks())
    session.resume(contextlib.nullcontext(folder))   # or Ray's checkpoint.as_directory()
    result = session.run(publish, stop_after=None)
    final = session.finish(result)                   # metrics.json and records.json on rank 0

A checkpoint folder holds ``model.pt`` (consolidated weights, what evals and fine-tunes load),
``spec.json``, one ``rng_rank{r}.pt`` per rank and either ``train_state.pt`` (plain torch: step,
``data_index``, optimiser state, metrics) or the DeepSpeed shards (``train.zero_stage`` set).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from phaselab.catalog.tracking import MetricRecord, Tracker, run_folder
from phaselab.catalog.tracking.run_folder import MINIMA_FILE, MODEL_FILE, SPEC_FILE, STATE_FILE, rng_file
from phaselab.workloads import provenance
from phaselab.workloads.config import ConfigError, to_dict
from phaselab.workloads.data import build_dataset
from phaselab.workloads.precision import resolved_precision
from phaselab.workloads.train.checkpoint import (
    BestKeeper,
    EvalMinima,
    load_train_state,
    rng_state,
    seed_everything,
    set_rng_state,
    step_name,
    write_json,
)
from phaselab.workloads.train.fast_step import engine_for
from phaselab.workloads.train.loop import LoopResult, data_position, evaluate, train
from phaselab.workloads.train.model_init import build_model
from phaselab.workloads.train.optim import build_optimizer
from phaselab.workloads.train.signals import stop_on_sigterm
from phaselab.workloads.train.spec import EVAL_SPLITS, TrainSpec, periodic_splits, with_eval_splits

OnEval = Callable[[int, Mapping[str, float]], None]
# publish(step, metrics, write) -> checkpoint name: ``write(folder)`` fills a fresh folder with
# this rank's part, which then becomes the run's newest checkpoint.
Publish = Callable[[int, Mapping[str, float], Callable[[Path], None]], str]


@dataclass(frozen=True)
class Ranks:
    """Where this process sits in its data-parallel group: ``reduce`` averages a float over the
    ranks (identity on one process)."""

    rank: int = 0
    world: int = 1
    reduce: Callable[[float], float] = float


class TrainSession:
    """Model, data, engine and hooks of one training run on this rank (module docstring).

    Args:
        parsed: the typed spec (``spec.TrainSpec``); ``spec`` the mapping it came from (its
            ``train.eval_splits`` is read here).
        out_dir: the stage's folder (best weights, eval minima, final files).
        tracker: per-step metrics (rank 0 logs).
        init_from: pretrained weights for CPT and fine-tunes.
        trace_batches: tests and debugging: a folder where every training batch this rank reads
            is recorded (:class:`BatchTrace`).
    """

    def __init__(self, parsed: TrainSpec, spec: Mapping[str, Any], *, out_dir: Path, tracker: Tracker,
                 init_from: Path | None, device: torch.device, ranks: Ranks,
                 trace_batches: Path | None = None) -> None:
        self.cfg, self.ranks, self.tracker, self.out_dir = parsed.train, ranks, tracker, Path(out_dir)
        self.resolved = with_eval_splits(to_dict(parsed), spec)
        self.splits = periodic_splits(spec)
        self.t0 = time.perf_counter()
        self.setup_s = 0.0
        provenance.reset()   # record the attention implementations of this run only
        seed_everything(self.cfg.seed)  # model init is part of the seeded run
        dataset = build_dataset(parsed.data)
        self.dataset = dataset if trace_batches is None else BatchTrace(dataset, trace_batches, ranks.rank)
        self.model = build_model(parsed, dataset, init_from)
        self.optimizer = None
        if self.cfg.zero_stage is not None:
            from phaselab.workloads.train.deepspeed_engine import DeepSpeedEngine
            self.engine = DeepSpeedEngine(self.model, self.cfg, world=ranks.world, device=device)
        else:
            self.model.to(device)
            self.optimizer = build_optimizer(self.model, self.cfg.optim)
            self.engine = engine_for(self.model, self.optimizer, self.cfg, device=device,
                                     block_size=dataset.block_size, world=ranks.world, ddp=ranks.world > 1,
                                     # a trace records batches in this process: no workers
                                     batch_workers=0 if trace_batches else parsed.data.num_workers)
        self.start = 0

    # -- checkpoints -----------------------------------------------------------------------------
    def write(self, folder: Path, step: int, metrics: Mapping[str, float]) -> None:
        """This rank's part of the checkpoint of ``step`` into ``folder`` (the one writer)."""
        from phaselab.workloads.models.checkpoint_io import save_model

        rank, cfg = self.ranks.rank, self.cfg
        if cfg.zero_stage is not None:
            self.engine.save(folder, tag=step_name(step), client_state={"step": step})
            with self.engine.full_weights() as module:   # collective under ZeRO-3
                if rank == 0:
                    save_model(module, folder / MODEL_FILE)
        elif rank == 0:
            save_model(self.model, folder / MODEL_FILE)
            torch.save({"step": step, "optimizer": self.optimizer.state_dict(), "metrics": dict(metrics),
                        "data_index": data_position(step, grad_accum=cfg.grad_accum, world=self.ranks.world)},
                       folder / STATE_FILE)
        if rank == 0:
            write_json(folder / SPEC_FILE, self.resolved)
        torch.save(rng_state(), folder / rng_file(rank))

    def restore(self, folder: Path) -> int:
        """Weights, optimiser and this rank's RNG state from ``folder``; returns its step (the
        one restorer). Every rank reads the consolidated model.pt and train_state.pt."""
        from phaselab.workloads.models.checkpoint_io import load_model

        folder = Path(folder)
        state: Mapping[str, Any] = {}
        if self.cfg.zero_stage is not None:
            step = int(self.engine.load(folder)["step"])
        else:
            self.model.load_state_dict(load_model(folder / MODEL_FILE).state_dict(), strict=True)
            state = load_train_state(folder / STATE_FILE)
            self.optimizer.load_state_dict(state["optimizer"])
            step = int(state["step"])
        rng = folder / rng_file(self.ranks.rank)
        # train_state.pt carried the RNG state of one-process checkpoints before per-rank files
        set_rng_state(torch.load(rng, weights_only=True) if rng.is_file() else state["rng"])
        return step

    def resume(self, opened: contextlib.AbstractContextManager) -> int:
        """Restore from the folder ``opened`` yields (entering it may download it: part of the
        restore) and log ``ckpt/load_s`` at the resumed step on rank 0."""
        t0 = time.perf_counter()
        with opened as folder:
            self.start = self.restore(Path(folder))
        if self.ranks.rank == 0:
            self.tracker.log_metrics({"ckpt/load_s": time.perf_counter() - t0}, step=self.start)
        return self.start

    # -- the loop ----------------------------------------------------------------------------------
    def run(self, publish: Publish, *, stop_after: int | None = None) -> LoopResult:
        """Steps ``start .. steps`` (or ``stop_after``); checkpoints go through ``publish``."""
        ranks = self.ranks

        def save(step: int, metrics: Mapping[str, float]) -> str:
            return publish(step, metrics, lambda folder: self.write(folder, step, metrics))

        self.setup_s = time.perf_counter() - self.t0   # data, model, engine and the restore
        with stop_on_sigterm() as flag:
            return train(self.engine, self.dataset, self.cfg, tracker=self.tracker, start_step=self.start,
                         save=save, rank=ranks.rank, world=ranks.world, stop_after=stop_after,
                         stop_flag=flag, reduce=ranks.reduce, on_eval=chain(self.keep_best(), self.track_splits()))

    def keep_best(self) -> OnEval | None:
        """The ``on_eval`` keeping the best-validation weights under ``out_dir/best``
        (``eval.select: best_valid``). Every rank decides on the rank-averaged metrics, so all
        agree on entering ``full_weights`` (a collective gather under ZeRO-3); rank 0 writes.
        None without periodic validation, where "best" would just be "last"."""
        if not self.cfg.eval_every:
            return None
        from phaselab.workloads.models.checkpoint_io import save_model

        keeper, engine, ranks = BestKeeper(self.out_dir / run_folder.BEST_DIR), self.engine, self.ranks

        def on_eval(step: int, metrics: Mapping[str, float]) -> None:
            better = keeper.update({k: ranks.reduce(float(v)) for k, v in metrics.items()})
            if not better:
                return
            full = engine.full_weights() if self.cfg.zero_stage is not None else contextlib.nullcontext(engine.module)
            with full as module:
                if ranks.rank == 0:
                    for metric in better:
                        keeper.save(step, metric, keeper.values[metric], lambda d: save_model(module, d / MODEL_FILE))

        return on_eval

    def track_splits(self) -> OnEval | None:
        """The ``on_eval`` that evaluates the other splits of ``train.eval_splits`` too (every
        rank: under ZeRO-3 the forward is collective), logs them on rank 0 and keeps each split's
        minimum loss in ``out_dir/eval_minima.json``."""
        if not self.splits:
            return None
        dataset, engine, cfg, ranks = self.dataset, self.engine, self.cfg, self.ranks
        for split in self.splits:
            if split not in dataset.splits:
                raise ConfigError(f"train.{EVAL_SPLITS}: dataset {dataset.name!r} has no split {split!r} "
                                  f"(splits: {', '.join(dataset.splits)})")
        minima = EvalMinima(self.out_dir / MINIMA_FILE)
        batch_size = cfg.eval_batch_size or cfg.micro_batch(ranks.world)

        def on_eval(step: int, _: Mapping[str, float]) -> None:
            for split in self.splits:
                ev = evaluate(engine.module, dataset, split, batch_size=batch_size, max_batches=cfg.eval_batches,
                              device=engine.device, autocast=engine.autocast)
                metrics = {f"{split}/loss": ranks.reduce(ev["loss"]), f"{split}/acc": ranks.reduce(ev["acc"])}
                if ranks.rank == 0:
                    self.tracker.log_metrics(metrics, step=step)
                minima.update(step, {f"{split}/loss": metrics[f"{split}/loss"]}, write=ranks.rank == 0)

        return on_eval

    # -- the end -----------------------------------------------------------------------------------
    def what_ran(self) -> dict[str, Any]:
        """This rank's provenance (``workloads.provenance``): attention backends and
        implementations, determinism, precision, graph mode, device."""
        model_cfg = getattr(self.model, "cfg", None)
        attention = getattr(model_cfg, "attention", None)
        return provenance.what_ran(device=self.engine.device,
                                   precision=resolved_precision(self.cfg.precision, self.engine.device),
                                   compile=self.cfg.compile, cuda_graphs=self.cfg.cuda_graphs,
                                   deterministic_requested=getattr(attention, "deterministic", None))

    def finish(self, result: LoopResult) -> Final:
        """Final evaluation of a finished run, written on rank 0 to ``out_dir/metrics.json`` and
        ``out_dir/records.json``. Every rank evaluates the same batches (under ZeRO-3 each
        forward gathers collectively)."""
        engine = self.engine
        t0 = time.perf_counter()
        evaluated, records = final_evaluation(engine.module, self.dataset, self.cfg, step=result.step,
                                              device=engine.device, autocast=engine.autocast)
        records += minima_records(self.out_dir, self.dataset)
        final = {"step": float(result.step), **result.metrics, **evaluated,
                 **time_breakdown(self.setup_s, result.times, time.perf_counter() - t0)}
        if self.ranks.rank == 0:
            (self.out_dir / run_folder.RECORDS_FILE).write_text(json.dumps([r.to_dict() for r in records], indent=1))
            (self.out_dir / run_folder.FINAL_METRICS_FILE).write_text(json.dumps(final, indent=2, sort_keys=True)
                                                                      + "\n")
            provenance.write(self.out_dir, self.what_ran())
        return Final(metrics=final, records=records, evaluated=evaluated)


def time_breakdown(setup_s: float, loop: Mapping[str, float], final_eval_s: float) -> dict[str, float]:
    """Where a run's time went, as ``time/*`` metrics in seconds: ``setup`` (data, model, engine,
    restore), ``train`` (timed optimiser steps), ``eval`` (periodic and final evaluation),
    ``ckpt`` (checkpoint saves) and ``other`` (untimed steps: compilation, graph capture and
    warm-up, plus host overhead). ``train`` over the stage's wall time is its GPU efficiency."""
    train_s, eval_s, ckpt_s = loop.get("train", 0.0), loop.get("eval", 0.0), loop.get("ckpt", 0.0)
    other = max(0.0, loop.get("loop", 0.0) - train_s - eval_s - ckpt_s)
    return {"time/setup_s": setup_s, "time/train_s": train_s, "time/eval_s": eval_s + final_eval_s,
            "time/ckpt_s": ckpt_s, "time/other_s": other}


@dataclass
class Final:
    """What :meth:`TrainSession.finish` returns: ``metrics`` = {"step", the last step's
    metrics, ``evaluated``}; ``evaluated`` = loss and acc per final-eval split; ``records`` their
    MetricRecords and the eval-splits minima."""

    metrics: dict[str, float]
    records: list[MetricRecord]
    evaluated: dict[str, float]


def final_evaluation(module, dataset, cfg, *, step: int, device, autocast
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


def minima_records(out_dir: Path, dataset) -> list[MetricRecord]:
    """``loss_min_over_evals`` per split of ``train.eval_splits`` (its step = where it occurred)."""
    minima = EvalMinima(Path(out_dir) / MINIMA_FILE).minima
    return [MetricRecord(name="loss_min_over_evals", value=m["value"], unit="nats/token", step=int(m["step"]),
                         context_len=dataset.block_size, task=dataset.name, split=name.split("/")[0])
            for name, m in sorted(minima.items())]


def chain(*hooks: OnEval | None) -> OnEval | None:
    """One ``on_eval`` calling each given hook in order (None when none is given)."""
    live = [h for h in hooks if h is not None]
    if not live:
        return None

    def on_eval(step: int, metrics: Mapping[str, float]) -> None:
        for hook in live:
            hook(step, metrics)

    return on_eval


class BatchTrace:
    """A dataset that records each training batch it hands out: one JSON line per
    ``get_batch("train", ...)`` call in ``folder/rank{r}.jsonl`` with the batch index, its size
    and a digest of every row (inputs, targets and mask), so two runs can be compared by the
    examples they read, whatever the split over ranks. Everything else is the wrapped dataset's."""

    def __init__(self, dataset: Any, folder: Path, rank: int) -> None:
        self.dataset = dataset
        self.path = Path(folder) / f"rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dataset, name)

    def get_batch(self, split: str, index: int, batch_size: int, *, seed: int) -> Any:
        batch = self.dataset.get_batch(split, index, batch_size, seed=seed)
        if split == "train":
            rows = [hashlib.sha256(b"".join(t[r].numpy().tobytes() for t in (batch.x_BT, batch.y_BT, batch.mask_BT))
                                   ).hexdigest()[:16] for r in range(batch.x_BT.shape[0])]
            with open(self.path, "a") as f:
                f.write(json.dumps({"index": index, "batch_size": batch_size, "rows": rows}) + "\n")
        return batch


def read_trace(folder: Path, rank: int) -> list[dict[str, Any]]:
    """The records :class:`BatchTrace` wrote for ``rank``, in call order."""
    path = Path(folder) / f"rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
