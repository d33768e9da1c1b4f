"""The single training loop used by every stage that changes weights (pretrain, CPT, fine-tunes).

One function, :func:`train`, drives an *engine* — :class:`TorchEngine` (one process, or DDP) or
``deepspeed_engine.DeepSpeedEngine`` (ZeRO 0-3) — through the same steps:

    for step in [start, steps):
        lr = schedule.lookup(step)
        for micro in range(grad_accum):             # gradient accumulation
            batch = dataset.get_batch("train", index(step, micro, rank), micro_batch, seed=seed)
            losses.append(engine.micro_step(batch))  # forward (+autocast), backward
        losses, grad_norm = engine.optimizer_step(lr, losses)  # clip, NaN/Inf check, AdamW, δ projection
        log / eval / checkpoint / SIGTERM check

Besides losses, every log step reports ``train/peak_mem_gib`` on CUDA (the allocator's peak since
the previous log step, this rank; absent on CPU, where torch keeps no such counter) and every
checkpoint ``ckpt/save_s`` (wall seconds of the blocking ``save`` call).

The NaN/Inf check of the losses and the grad norm happens in ``optimizer_step``, before the
update, with one device-to-host copy per step (TorchEngine): a check right after each forward
would stall the host there until the forward finished, and the backward's launch with it
(benchmarks/results/train-h200.md).

Batches are a pure function of their global index (CONTRACTS §3.3), so the data position is just
the step number and resume is exact: on CPU, a run killed at any step and resumed reproduces the
uninterrupted run's losses bit for bit (tests/workloads/test_resume.py).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from phaselab.catalog.tracking import Tracker
from phaselab.workloads.precision import resolved_precision
from phaselab.workloads.train.config import TrainConfig
from phaselab.workloads.train.optim import set_lr
from phaselab.workloads.train.signals import StopFlag, TrainingPreempted


def batch_index(step: int, micro: int, *, grad_accum: int, rank: int = 0, world: int = 1) -> int:
    """Global index of the micro-batch ``micro`` of optimiser ``step`` on ``rank``.

    Step s reads indices ``[s * grad_accum * world, (s + 1) * grad_accum * world)`` of
    ``micro_batch(world)`` sequences each; the datasets read batch i of size b as examples
    ``[i * b, (i + 1) * b)`` of their order, so every world size reads the same global batch.
    """
    return (step * grad_accum + micro) * world + rank


def data_position(step: int, *, grad_accum: int, world: int) -> int:
    """Micro-batch indices consumed by ``step`` optimiser steps (a checkpoint's ``data_index``)."""
    return batch_index(step, 0, grad_accum=grad_accum, world=world)


class TrainingDiverged(RuntimeError):
    """NaN/Inf in the loss or the gradient norm; ``step`` is the 0-based optimiser step."""

    def __init__(self, step: int, reason: str) -> None:
        super().__init__(f"training diverged at step {step}: {reason}")
        self.step = step
        self.reason = reason


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast_for(precision: str, device: torch.device, *, cache: bool = True
                 ) -> Callable[[], contextlib.AbstractContextManager]:
    """bf16 autocast on CUDA for "auto"; fp32 (no autocast) on CPU. Master weights stay fp32.
    ``cache`` False turns off autocast's cache of cast weights (CUDA graph capture)."""
    if resolved_precision(precision, device) != "bf16":
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=cache)


def check_finite(value: torch.Tensor | float, *, step: int, what: str) -> float:
    v = float(value)
    if not math.isfinite(v):
        raise TrainingDiverged(step, f"{what} is {v}")
    return v


class Engine(Protocol):
    """What :func:`train` needs from an execution backend."""

    module: nn.Module        # the unwrapped model (for eval and after_optimizer_step)
    device: torch.device
    autocast: Callable[[], contextlib.AbstractContextManager]

    # the micro-batch's loss: a float, or a 0-dim tensor whose host copy waits for optimizer_step
    def micro_step(self, batch: Any, *, step: int, last: bool) -> float | torch.Tensor: ...
    # checks the step's losses and grad norm (TrainingDiverged) before updating; returns them as floats
    def optimizer_step(self, lr: float, losses: list[float | torch.Tensor], *, step: int
                       ) -> tuple[list[float], float]: ...


class TorchEngine:
    """Plain PyTorch (optionally DDP-wrapped) engine: autocast, clip, AdamW, PoPE projection.

    Args:
        model: the Transformer (already on ``device``); wrapped in DDP when ``ddp``.
        optimizer: from ``optim.build_optimizer``.
        grad_clip: max global grad norm (0 = measure only).
        grad_accum: micro-batches per step (the loss is divided by it before backward).
        fused_loss: True (default) asks the model for the loss only (``logits=False``), which on
            CUDA is the fused linear + cross-entropy kernel; False keeps the logits path
            (the benchmark's A/B, ``--loss torch``). Not a TrainConfig field: the math is the same,
            so stage hashes do not change.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, device: torch.device,
                 precision: str, grad_clip: float, grad_accum: int, compile: bool = False,
                 ddp: bool = False, fused_loss: bool = True) -> None:
        self.module = model
        self.fused_loss = fused_loss
        self.optimizer = optimizer
        self.device = device
        self.grad_clip = grad_clip
        self.grad_accum = grad_accum
        self.autocast = autocast_for(precision, device)
        runner: nn.Module = model
        if ddp:
            from torch.nn.parallel import DistributedDataParallel
            runner = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        self.runner = torch.compile(runner) if compile else runner
        self._ddp = ddp

    def micro_step(self, batch: Any, *, step: int, last: bool) -> torch.Tensor:
        x, y, m = (t.to(self.device, non_blocking=True) for t in (batch.x_BT, batch.y_BT, batch.mask_BT))
        sync = contextlib.nullcontext() if (last or not self._ddp) else self.runner.no_sync()
        with sync:
            with self.autocast():
                _, loss = self.runner(x, targets_BT=y, loss_mask_BT=m, logits=not self.fused_loss)
            (loss / self.grad_accum).backward()
        return loss.detach().float()  # no host copy here (module docstring)

    def optimizer_step(self, lr: float, losses: list[float | torch.Tensor], *, step: int
                       ) -> tuple[list[float], float]:
        max_norm = self.grad_clip if self.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm)
        # one device-to-host copy for every loss of the step and the norm, before the update
        parts = [torch.as_tensor(v, dtype=torch.float32, device=norm.device).reshape(()) for v in (*losses, norm)]
        *values, grad_norm = torch.stack(parts).tolist()
        for value in values:
            check_finite(value, step=step, what="loss")
        check_finite(grad_norm, step=step, what="grad_norm")
        set_lr(self.optimizer, lr)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.module.after_optimizer_step()  # PoPE δ projection to [-2π, 0] (MATH §3.2)
        return values, grad_norm


@torch.no_grad()
def evaluate(module: nn.Module, dataset: Any, split: str, *, batch_size: int, max_batches: int,
             device: torch.device, autocast: Callable[[], contextlib.AbstractContextManager]
             ) -> dict[str, float]:
    """Token-weighted loss and argmax accuracy over the loss-masked tokens of ``split``.

    For Indirect Indexing the mask covers only the target token, so ``acc`` is the task's
    exact-match target accuracy (EXPERIMENTS §2.1); for LM data it is next-token accuracy.
    ``max_batches`` 0 evaluates the whole split. Returns {"loss", "acc", "tokens"}.
    """
    was_training = module.training
    module.eval()
    # Per-batch sums in fp32, accumulated in fp64 on the device: the same arithmetic as adding
    # them up as Python floats, without a host sync per batch (one at the end).
    sums_3 = torch.zeros(3, dtype=torch.float64, device=device)   # nll, correct, count
    batches = dataset.eval_batches(split, batch_size)
    for batch in (islice(batches, max_batches) if max_batches else batches):
        x, y, m = (t.to(device) for t in (batch.x_BT, batch.y_BT, batch.mask_BT))
        with autocast():
            logits_BTV, _ = module(x)
        logits_BTV = logits_BTV.float()
        nll_BT = F.cross_entropy(logits_BTV.transpose(1, 2), y, reduction="none")
        m = m.float()
        sums_3 += torch.stack([(nll_BT * m).sum(), ((logits_BTV.argmax(-1) == y).float() * m).sum(),
                               m.sum()]).double()
    module.train(was_training)
    nll_sum, correct, count = sums_3.tolist()
    if count == 0:
        raise ValueError(f"evaluation split {split!r} of {getattr(dataset, 'name', dataset)} has no "
                         "loss-masked tokens")
    return {"loss": nll_sum / count, "acc": correct / count, "tokens": count}


def peak_memory_gib(device: torch.device) -> float | None:
    """Peak bytes torch allocated on ``device`` since the last reset, in GiB; None off CUDA.

    ``max_memory_allocated`` counts tensors only (no CUDA context, no allocator cache), so it is
    lower than nvidia-smi's "memory.used" for the same process.
    """
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory window (the peak restarts at the memory allocated now)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


@dataclass
class LoopResult:
    """What :func:`train` returns: losses by 0-based step (this call only), last metrics."""

    step: int
    losses: dict[int, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    stopped: Literal["done", "stop_after"] = "done"
    # where the call's wall time went, in seconds: "loop" (all of it), "train" (timed steps),
    # "eval" (periodic validation and its on_eval hook), "ckpt" (checkpoint saves); the rest of
    # "loop" is untimed steps (compilation, graph capture, warm-up) and host overhead
    times: dict[str, float] = field(default_factory=dict)


SaveFn = Callable[[int, Mapping[str, float]], str | None]


class StepEvents:
    """What happens after each optimiser step, shared by the eager loop and the graph loop
    (``fast_step.GraphEngine.run_windows``): the loss record, throughput, logging, periodic
    validation (and ``on_eval``), checkpoints and the SIGTERM check.

    ``done(step, loss, lr, grad_norm, tokens)`` is called once per finished step, in order, with
    the 1-based count of steps done; the graph loop calls it a few steps late, in batches, with
    ``can_save`` true only where the module holds that step's weights (every evaluation and
    checkpoint step is one; a SIGTERM is acted on at the next such step).
    """

    def __init__(self, engine: Engine, dataset: Any, cfg: TrainConfig, *, tracker: Tracker,
                 save: SaveFn, rank: int, world: int, stop_flag: StopFlag | None,
                 on_eval: Callable[[int, Mapping[str, float]], None] | None, result: LoopResult) -> None:
        self.engine, self.dataset, self.cfg, self.tracker = engine, dataset, cfg, tracker
        self.save, self.rank, self.stop_flag, self.on_eval = save, rank, stop_flag, on_eval
        self.result = result
        self.eval_bs = cfg.eval_batch_size or cfg.micro_batch(world)
        self._last: float | None = None   # host time of the previous step's end (eager loop)
        self.window_steps, self.window_tokens, self.window_s = 0, 0, 0.0
        self.times = result.times
        self.times.update(train=0.0, eval=0.0, ckpt=0.0)

    def is_eval_step(self, step: int) -> bool:
        return bool(self.cfg.eval_every and step % self.cfg.eval_every == 0) or step == self.cfg.steps

    def is_ckpt_step(self, step: int) -> bool:
        return bool(self.cfg.ckpt_every and step % self.cfg.ckpt_every == 0) or step == self.cfg.steps

    def is_log_step(self, step: int) -> bool:
        return step % self.cfg.log_every == 0 or step == self.cfg.steps

    def done(self, step: int, loss: float, lr: float, grad_norm: float, tokens: int, *,
             can_save: bool = True, seconds: float | None = None, untimed: bool = False) -> None:
        """``seconds``: the step's device time when the caller measured it (graph loop); None
        takes the host time since the previous step (the first step of a call is not timed:
        compilation, autotuning, allocator warm-up). ``untimed``: the caller knows the step's
        time is not measurable (the graph loop's first window, reported after the fact, where
        host time between reports says nothing), so it enters no throughput."""
        result = self.result
        result.losses[step - 1] = loss
        result.step = step
        if untimed:
            seconds = None
        elif seconds is None:
            now = time.perf_counter()
            seconds, self._last = (None if self._last is None else now - self._last), now
        if seconds is not None:
            self.window_steps, self.window_tokens = self.window_steps + 1, self.window_tokens + tokens
            self.window_s += seconds
            self.times["train"] += seconds
        metrics = {"train/loss": loss, "train/lr": lr, "train/grad_norm": grad_norm}
        if self.is_log_step(step):
            self._log(step, metrics)
        if (self.is_eval_step(step) or self.is_ckpt_step(step)) and not can_save:
            raise RuntimeError(f"step {step} evaluates or checkpoints, but the weights are ahead of it")
        if self.is_eval_step(step):
            t0 = time.perf_counter()
            metrics |= self._validate(step)
            self.times["eval"] += time.perf_counter() - t0
            self._last = None if self._last is None else time.perf_counter()   # not the next step's time
        result.metrics = metrics
        preempted = can_save and self.stop_flag is not None and self.stop_flag.requested
        if self.is_ckpt_step(step) or preempted:
            t0 = time.perf_counter()
            path = self.save(step, metrics)
            saved_s = time.perf_counter() - t0
            self.times["ckpt"] += saved_s
            self._last = None if self._last is None else time.perf_counter()
            if self.rank == 0:  # every rank saved; rank 0's wall time includes the callee's barrier
                self.tracker.log_metrics({"ckpt/save_s": saved_s}, step=step)
            if preempted:
                raise TrainingPreempted(step, path)

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        device = self.engine.device
        if self.window_steps and self.window_s > 0:
            metrics |= {"train/steps_per_s": self.window_steps / self.window_s,
                        "train/tokens_per_s": self.window_tokens / self.window_s}
        peak = peak_memory_gib(device)
        if peak is not None:
            metrics["train/peak_mem_gib"] = peak
            reset_peak_memory(device)
        self.window_steps, self.window_tokens, self.window_s = 0, 0, 0.0
        if self.rank == 0:
            self.tracker.log_metrics(metrics, step=step)

    def _validate(self, step: int) -> dict[str, float]:
        engine = self.engine
        ev = evaluate(engine.module, self.dataset, "valid", batch_size=self.eval_bs,
                      max_batches=self.cfg.eval_batches, device=engine.device, autocast=engine.autocast)
        out = {"valid/loss": ev["loss"], "valid/acc": ev["acc"]}
        if self.rank == 0:
            self.tracker.log_metrics(out, step=step)
        if self.on_eval is not None:
            self.on_eval(step, out)
        return out


def train(engine: Engine, dataset: Any, cfg: TrainConfig, *, tracker: Tracker, start_step: int,
          save: SaveFn, rank: int = 0, world: int = 1, stop_after: int | None = None,
          stop_flag: StopFlag | None = None, reduce: Callable[[float], float] = float,
          on_eval: Callable[[int, Mapping[str, float]], None] | None = None) -> LoopResult:
    """Run optimiser steps ``start_step .. cfg.steps - 1``.

    Args:
        engine: TorchEngine, DeepSpeedEngine, or ``fast_step.GraphEngine`` (which runs the steps
            itself, in windows of graph replays: ``engine.run_windows``).
        dataset: CONTRACTS §3.3 Dataset (``get_batch``, ``eval_batches``).
        save: ``save(step, metrics) -> checkpoint path`` called every ``ckpt_every`` steps, at the
            end, and on SIGTERM (every rank calls it; the callee decides who writes).
        rank, world: data-parallel coordinates (micro-batch index = (step*accum+micro)*world+rank).
        stop_after: stop once ``stop_after`` steps are done, without a final checkpoint — a
            simulated kill for tests and ``debug_steps``.
        stop_flag: set by the SIGTERM handler (signals.py); checkpoint, then TrainingPreempted.
        reduce: averages a float over ranks for logging (identity on one process).
        on_eval: called on every rank after each periodic validation with ``(step, metrics)``
            (``valid/loss``, ``valid/acc``), before that step's checkpoint; keeps the
            best-validation weights for ``eval.select: best_valid``.
    Logged on rank 0 (the other ranks' numbers are not gathered): per log step the train metrics,
    ``train/peak_mem_gib`` on CUDA (peak of the window since the previous log step, so the run's
    peak is the max over the lines); per checkpoint ``ckpt/save_s`` at the checkpoint's step.
    Raises:
        TrainingDiverged: NaN/Inf loss or grad norm, with the step.
    """
    result = LoopResult(step=start_step)
    events = StepEvents(engine, dataset, cfg, tracker=tracker, save=save, rank=rank, world=world,
                        stop_flag=stop_flag, on_eval=on_eval, result=result)
    end = cfg.steps if stop_after is None else max(start_step, min(cfg.steps, stop_after))
    reset_peak_memory(engine.device)  # a restore or an earlier call must not count in the first window
    run_windows = getattr(engine, "run_windows", None)
    t0 = time.perf_counter()
    if run_windows is not None:
        run_windows(dataset, cfg, events, start=start_step, end=end)
    else:
        _eager_steps(engine, dataset, cfg, events, start=start_step, end=end, rank=rank, world=world,
                     reduce=reduce)
    result.times["loop"] = time.perf_counter() - t0
    if result.step < cfg.steps:
        result.stopped = "stop_after"
    return result


def _eager_steps(engine: Engine, dataset: Any, cfg: TrainConfig, events: StepEvents, *, start: int,
                 end: int, rank: int, world: int, reduce: Callable[[float], float]) -> None:
    """One host-driven optimiser step after the other (TorchEngine, DeepSpeedEngine)."""
    schedule = cfg.schedule_obj()
    micro = cfg.micro_batch(world)
    for step in range(start, end):
        lr = schedule.lookup(step)
        micro_losses, tokens = [], 0
        for k in range(cfg.grad_accum):
            index = batch_index(step, k, grad_accum=cfg.grad_accum, rank=rank, world=world)
            batch = dataset.get_batch("train", index, micro, seed=cfg.seed)
            micro_losses.append(engine.micro_step(batch, step=step, last=k == cfg.grad_accum - 1))
            tokens += batch.x_BT.numel() * world
        values, grad_norm = engine.optimizer_step(lr, micro_losses, step=step)
        events.done(step + 1, reduce(sum(values) / cfg.grad_accum), lr, grad_norm, tokens)
