"""The fast step for small models (``train.cuda_graphs: true``): one CUDA graph per optimiser step.

A 25M-parameter model on 64 x 48 tokens needs about 1-2 ms of GPU work per step, but the eager
step launches several hundred kernels and copies the loss and the gradient norm to the host
before each update, so the GPU idles most of the time. Here the whole step — the forward and
backward of every micro-batch, the gradient clipping, the AdamW update (``capturable``, learning
rate read from a device tensor) and PoPE's δ projection — is captured once into a CUDA graph and
replayed; the host launches one graph per step and synchronises only at evaluations, checkpoints
and the end, reading the losses of earlier steps in batches a few steps late.

    window = steps from the current one to the next log / eval / checkpoint / end step
             (at most ``CHUNK_BYTES`` of batches)
    host:   batches of the next window are built ahead (worker processes, ``data.num_workers``,
            or a background thread) into pinned memory
    device: chunk <- pinned batches; cursor <- 0; replay the graph once per step, which reads
            x, y, mask = chunk[cursor] and lr = lr_table[cursor], writes loss[cursor] and
            grad_norm[cursor], then cursor += 1

Exactness: every batch is padded to the dataset's block size (x, y = 0, mask = 0), which leaves
the masked loss unchanged; batches are the same pure function of their index as in the eager
loop, so resume stays exact. The NaN/Inf check runs on the host a window late: a non-finite loss
or norm raises :class:`TrainingDiverged` naming the first bad step, before any later checkpoint
is written, so no checkpoint holds diverged weights.

On CPU there is nothing to capture: the same step function runs eagerly (same device-side
learning rate and deferred checks), which is how CI tests its arithmetic against the plain step.
Not supported (a clear ``ValueError``): several data-parallel ranks (DDP / ZeRO), since a
captured all-reduce would need NCCL's graph mode and per-rank capture.
"""

from __future__ import annotations

import itertools
import math
import mmap
import multiprocessing
import os
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
from torch import nn

from phaselab.workloads.train.config import TrainConfig
from phaselab.workloads.train.loop import StepEvents, TorchEngine, TrainingDiverged, autocast_for

CHUNK_BYTES = 32 * 2**20   # device memory for one window of batches (x, y int64 + mask fp32)
MAX_WINDOW = 256           # steps per window at most (losses are read back once per window)
WARMUP_STEPS = 3           # eager steps before the capture (autotuning, lazy allocations, state)
GIL_SWITCH_S = 1e-4        # sys.setswitchinterval while the graph loop runs (see run_windows)


def check_graphable(*, world: int) -> None:
    """Raise ValueError for a combination the graph step cannot run, naming it and why (with
    DeepSpeed, ``TrainConfig`` itself refuses ``cuda_graphs``)."""
    if world > 1:
        raise ValueError(f"train.cuda_graphs runs one process per stage, got world={world}: capturing "
                         "the gradient all-reduce of DDP/ZeRO is not supported; set cuda_graphs: false")


@dataclass
class _Window:
    start: int          # first step (0-based)
    end: int            # one past the last step
    buffer: int         # which pinned host buffer holds its batches


class GraphEngine:
    """Runs :func:`loop.train`'s steps as graph replays (``run_windows``); eval and checkpoints use
    ``module`` eagerly, like the other engines.

    Args:
        model: the Transformer on ``device``.
        optimizer: from ``optim.build_optimizer`` (fused AdamW on CUDA); its groups' ``lr``
            become device tensors and ``capturable`` is set on CUDA.
        device, precision, grad_clip, grad_accum: as for ``TorchEngine``.
        micro_batch, block_size: the static shape [micro_batch, block_size] of every batch.
        compile: run the model through ``torch.compile`` inside the captured step.
        batch_workers: processes building batches ahead (``data.num_workers``; -1 chooses,
            see :func:`choose_batch_workers`).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, device: torch.device,
                 precision: str, grad_clip: float, grad_accum: int, micro_batch: int, block_size: int,
                 compile: bool = False, batch_workers: int = -1) -> None:
        self.module, self.optimizer, self.device = model, optimizer, device
        self.grad_clip, self.grad_accum = grad_clip, grad_accum
        self.shape = (grad_accum, micro_batch, block_size)
        self.autocast = autocast_for(precision, device)
        # inside the captured step: no autocast weight cache (its copies would outlive the
        # capture's allocation pool); the casts are recomputed, the arithmetic is the same
        self._step_autocast = autocast_for(precision, device, cache=False)
        self.runner = torch.compile(model) if compile else model
        self.capture = device.type == "cuda"
        self.batch_workers = choose_batch_workers(batch_workers, cuda=self.capture)
        step_bytes = grad_accum * micro_batch * block_size * (8 + 8 + 4)
        self.window_cap = max(1, min(MAX_WINDOW, CHUNK_BYTES // step_bytes))
        self.graph: torch.cuda.CUDAGraph | None = None
        self._prepared = False
        self._warm = 0

    # -- device state --------------------------------------------------------------------------
    def _prepare(self) -> None:
        """Static buffers, device learning rates and capturable AdamW (after any restore)."""
        K, (A, B, T), dev = self.window_cap, self.shape, self.device
        self.x = torch.zeros((K, A, B, T), dtype=torch.int64, device=dev)
        self.y = torch.zeros((K, A, B, T), dtype=torch.int64, device=dev)
        self.m = torch.zeros((K, A, B, T), dtype=torch.float32, device=dev)
        self.lr_table = torch.zeros(K, dtype=torch.float32, device=dev)
        self.loss_out = torch.zeros(K, dtype=torch.float32, device=dev)
        self.norm_out = torch.zeros(K, dtype=torch.float32, device=dev)
        self.cursor = torch.zeros(1, dtype=torch.int64, device=dev)
        pin = self.capture
        self.host = [_HostChunk(K, self.shape, pin=pin) for _ in range(2)]
        self.out_host = torch.zeros((2, 2, K), dtype=torch.float32, pin_memory=pin)  # [buffer, loss|norm, step]
        self.group_lr: list[torch.Tensor] = []
        for group in self.optimizer.param_groups:
            group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=dev)
            if self.capture:
                group["capturable"] = True
            self.group_lr.append(group["lr"])
        self._prepared = True

    def _step(self) -> None:
        """One optimiser step on the device, reading everything at ``cursor`` (captured on CUDA)."""
        i = self.cursor
        x_ABT, y_ABT, m_ABT = (t.index_select(0, i)[0] for t in (self.x, self.y, self.m))
        self.optimizer.zero_grad(set_to_none=True)
        loss = torch.zeros((), dtype=torch.float32, device=self.device)
        for k in range(self.grad_accum):
            with self._step_autocast():
                _, micro_loss = self.runner(x_ABT[k], targets_BT=y_ABT[k], loss_mask_BT=m_ABT[k],
                                            logits=False)
            (micro_loss / self.grad_accum).backward()
            loss = loss + micro_loss.detach().float()
        max_norm = self.grad_clip if self.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm)
        lr = self.lr_table.index_select(0, i)[0]
        for group, group_lr in zip(self.optimizer.param_groups, self.group_lr):
            group_lr.copy_(lr * group.get("lr_mult", 1.0))
        self.optimizer.step()
        self.module.after_optimizer_step()  # PoPE δ projection to [-2π, 0] (MATH §3.2)
        self.loss_out.index_copy_(0, i, (loss / self.grad_accum).reshape(1))
        self.norm_out.index_copy_(0, i, norm.float().reshape(1))
        self.cursor.add_(1)

    def _advance(self) -> None:
        """Run the step at ``cursor``: eagerly on CPU; on CUDA the first ``WARMUP_STEPS`` eagerly on
        a side stream (autotuning, AdamW state, lazy allocations: real steps of the run), then
        the capture, then replays. The captured step does not execute, so it is replayed once."""
        if not self.capture:
            self._step()
            return
        if self.graph is not None:
            self.graph.replay()
            return
        current = torch.cuda.current_stream(self.device)
        if self._warm < WARMUP_STEPS:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                self._step()
            current.wait_stream(side)
            self._warm += 1
            return
        current.synchronize()
        graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)  # gradients are allocated inside the graph pool
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self._step()
        self.graph = graph
        graph.replay()

    # -- the loop ------------------------------------------------------------------------------
    def windows(self, cfg: TrainConfig, events: StepEvents, start: int, end: int) -> list[_Window]:
        """Consecutive windows covering [start, end), each ending at the latest at the next step
        after which the host must act (log, eval, checkpoint) or after ``window_cap`` steps."""
        out, s = [], start
        while s < end:
            e = s + 1
            while e < end and e - s < self.window_cap and not self._boundary(events, e):
                e += 1
            out.append(_Window(s, e, len(out) % 2))
            s = e
        return out

    @staticmethod
    def _boundary(events: StepEvents, done: int) -> bool:
        return events.is_log_step(done) or events.is_eval_step(done) or events.is_ckpt_step(done)

    def run_windows(self, dataset: Any, cfg: TrainConfig, events: StepEvents, *, start: int,
                    end: int) -> None:
        """Steps ``start .. end - 1`` as graph replays; ``events.done`` per step, in order.

        The losses of window w are checked and reported after window w+1 was launched (the
        host never waits for the device in between), except after windows that end at an
        evaluation, a checkpoint, a SIGTERM or the end: there the host waits and reports before
        launching more, so the weights that are evaluated or saved are those of that step.
        """
        if not self._prepared:
            self._prepare()
        schedule = cfg.schedule_obj()
        plan = self.windows(cfg, events, start, end)
        fill = _Filler(dataset, cfg, self.shape, workers=self.batch_workers)
        # The batch thread runs Python for milliseconds at a time; at the default 5 ms switch
        # interval the launching thread would wait that long for the GIL before every replay.
        switch = sys.getswitchinterval()
        sys.setswitchinterval(GIL_SWITCH_S)
        try:
            self._run_plan(plan, fill, events, schedule)
        finally:
            sys.setswitchinterval(switch)
            fill.close()

    def _run_plan(self, plan: list[_Window], fill: _Filler, events: StepEvents, schedule) -> None:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="phaselab-batches") as pool:
            pending: Future | None = pool.submit(fill, self.host[0], plan[0]) if plan else None
            late: tuple[_Window, _Mark] | None = None
            self._last_mark = None
            for n, window in enumerate(plan):
                pending.result()   # this window's batches are in its host buffer
                self._launch(window, schedule)
                if n + 1 < len(plan):
                    nxt = plan[n + 1]
                    self.host[nxt.buffer].ready()   # its previous copy to the device is done
                    pending = pool.submit(fill, self.host[nxt.buffer], nxt)
                outputs = self._read_back(window)
                if late is not None:
                    self._finish(*late, events, schedule, synced=False)
                late = (window, outputs)
                if self._must_sync(events, window.end) or n + 1 == len(plan):
                    self._finish(*late, events, schedule, synced=True)
                    late = None

    def _launch(self, window: _Window, schedule) -> None:
        """Copy the window's batches and learning rates to the device, then run its steps."""
        n, host = window.end - window.start, self.host[window.buffer]
        host.lr[:n] = torch.tensor([schedule.lookup(s) for s in range(window.start, window.end)])
        for dst, src in ((self.x, host.x), (self.y, host.y), (self.m, host.m), (self.lr_table, host.lr)):
            dst[:n].copy_(src[:n], non_blocking=True)
        host.copied()
        self.cursor.zero_()
        for _ in range(n):
            self._advance()

    def _read_back(self, window: _Window) -> _Mark:
        """Queue the copy of the window's losses and norms to the host; mark the window's end."""
        n, out = window.end - window.start, self.out_host[window.buffer]
        out[0, :n].copy_(self.loss_out[:n], non_blocking=True)
        out[1, :n].copy_(self.norm_out[:n], non_blocking=True)
        return _Mark.now(self.capture)

    @staticmethod
    def _must_sync(events: StepEvents, done: int) -> bool:
        return events.is_eval_step(done) or events.is_ckpt_step(done) or (
            events.stop_flag is not None and events.stop_flag.requested)

    def _finish(self, window: _Window, mark: _Mark, events: StepEvents, schedule,
                *, synced: bool) -> None:
        """Check and report the window's steps (waits for its device work). ``synced``: no later
        step was launched, so the module holds the weights after the window's last step. Each
        step is timed as its share of the device time between the ends of the previous window
        and this one (the first window of a call is not timed: capture, autotuning)."""
        mark.wait()
        n = window.end - window.start
        seconds = None if self._last_mark is None else mark.since(self._last_mark) / n
        self._last_mark = mark
        losses, norms = self.out_host[window.buffer][:, :n].tolist()
        tokens = self.shape[0] * self.shape[1] * self.shape[2]
        for j, (loss, norm) in enumerate(zip(losses, norms)):
            step = window.start + j
            for value, what in ((loss, "loss"), (norm, "grad_norm")):
                if not math.isfinite(value):
                    raise TrainingDiverged(step, f"{what} is {value}")
            events.done(step + 1, loss, schedule.lookup(step), norm, tokens,
                        can_save=synced and j == n - 1, seconds=seconds, untimed=seconds is None)
        if synced:   # an evaluation or a checkpoint ran on the device since the mark: not step time
            self._last_mark = _Mark.now(self.capture)


@dataclass
class _Mark:
    """The end of a window: a CUDA event recorded after its work, or the host time on CPU (where
    the work is done when the host gets here)."""

    event: torch.cuda.Event | None
    host_s: float

    @classmethod
    def now(cls, cuda: bool) -> _Mark:
        if not cuda:
            return cls(None, time.perf_counter())
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return cls(event, 0.0)

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()

    def since(self, earlier: _Mark) -> float:
        if self.event is None:
            return self.host_s - earlier.host_s
        return earlier.event.elapsed_time(self.event) / 1000


class _HostChunk:
    """One window of batches in (pinned) host memory, plus the event of its copy to the device."""

    def __init__(self, K: int, shape: tuple[int, int, int], *, pin: bool) -> None:
        self.x = torch.zeros((K, *shape), dtype=torch.int64, pin_memory=pin)
        self.y = torch.zeros((K, *shape), dtype=torch.int64, pin_memory=pin)
        self.m = torch.zeros((K, *shape), dtype=torch.float32, pin_memory=pin)
        self.lr = torch.zeros(K, dtype=torch.float32, pin_memory=pin)
        self.event: torch.cuda.Event | None = None
        self.pin = pin

    def copied(self) -> None:
        if self.pin:
            self.event = torch.cuda.Event()
            self.event.record()

    def ready(self) -> None:
        if self.event is not None:
            self.event.synchronize()


def choose_batch_workers(requested: int, *, cuda: bool) -> int:
    """Worker processes for the batch pipeline: ``requested`` when >= 0; for -1, up to 4 on CUDA
    and none on CPU, where the step itself is slower than building its batch. A 64-example
    Indirect Indexing batch is ~2 ms of Python; on the H200 4 workers and the trainer's thread
    gave equal step rates (benchmarks/results/small-models-h200.md), so the workers keep that
    Python off the trainer's GIL for datasets slower to build, at no cost to the fast ones."""
    if requested >= 0:
        return requested
    if not cuda:
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(4, cpus - 1))


class _Filler:
    """Builds a window's batches into a host chunk (called from the background thread).

    With ``workers`` > 0 the window's steps are split into contiguous ranges built by that many
    spawned processes (each holds a copy of the dataset), so the Python of batch building neither
    limits the step rate nor holds the launching thread's GIL; with 0 the thread builds them."""

    def __init__(self, dataset: Any, cfg: TrainConfig, shape: tuple[int, int, int], *, workers: int) -> None:
        self.dataset, self.seed, self.shape, self.workers = dataset, cfg.seed, shape, workers
        self.pool: ProcessPoolExecutor | None = None
        if workers > 0:
            self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_worker_init, initargs=(dataset, cfg.seed, shape))

    def __call__(self, chunk: _HostChunk, window: _Window) -> None:
        if self.pool is None:
            _build(self.dataset, self.seed, self.shape, range(window.start, window.end),
                   chunk.x, chunk.y, chunk.m)
            return
        n = window.end - window.start
        bounds = [window.start + n * w // self.workers for w in range(self.workers + 1)]
        parts = [(lo - window.start, self.pool.submit(_worker_build, lo, hi))
                 for lo, hi in itertools.pairwise(bounds) if hi > lo]
        for offset, future in parts:
            for dst, src in zip((chunk.x, chunk.y, chunk.m), future.result()):
                dst[offset: offset + len(src)].copy_(torch.from_numpy(src))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _build(dataset: Any, seed: int, shape: tuple[int, int, int], steps: range, x: torch.Tensor,
           y: torch.Tensor, m: torch.Tensor) -> None:
    """The batches of ``steps`` into x, y, m [len(steps), A, B, T], padded to T (x, y = 0 and
    mask = 0 leave the masked loss unchanged)."""
    A, B, T = shape
    for j, step in enumerate(steps):
        for k in range(A):
            batch = dataset.get_batch("train", step * A + k, B, seed=seed)
            bx, by, bm = batch.x_BT, batch.y_BT, batch.mask_BT
            if bx.shape[0] != B or bx.shape[1] > T:
                raise ValueError(f"train batch {step * A + k} has shape {tuple(bx.shape)}; the graph "
                                 f"step needs [{B}, <= {T}] (data.block_size)")
            t = bx.shape[1]
            x[j, k, :, :t], y[j, k, :, :t], m[j, k, :, :t] = bx, by, bm
            if t < T:
                x[j, k, :, t:], y[j, k, :, t:], m[j, k, :, t:] = 0, 0, 0


_WORKER: dict[str, Any] = {}   # a batch worker's dataset, training seed and batch shape


def _reduce_memmap(arr: np.memmap) -> tuple[Any, ...]:
    """A read-only file-backed array travels to a batch worker as its file name and is mapped
    again there; numpy's own pickling would copy the whole corpus (GBs for OpenWebText shards)
    into every worker. Views and writable maps are pickled as numpy does."""
    if arr.filename is not None and arr.mode == "r" and isinstance(arr.base, mmap.mmap):
        return np.memmap, (arr.filename, arr.dtype, "r", arr.offset, arr.shape)
    return np.ndarray.__reduce__(arr)


ForkingPickler.register(np.memmap, _reduce_memmap)   # the pickler of the workers' start arguments


def _worker_init(dataset: Any, seed: int, shape: tuple[int, int, int]) -> None:
    torch.set_num_threads(1)   # several workers share the stage's CPUs
    _WORKER.update(dataset=dataset, seed=seed, shape=shape)


def _worker_build(start: int, end: int) -> tuple[Any, Any, Any]:
    """Steps [start, end) in a worker process, as numpy arrays (pickled back to the trainer)."""
    shape = (end - start, *_WORKER["shape"])
    x, y = torch.zeros(shape, dtype=torch.int64), torch.zeros(shape, dtype=torch.int64)
    m = torch.zeros(shape, dtype=torch.float32)
    _build(_WORKER["dataset"], _WORKER["seed"], _WORKER["shape"], range(start, end), x, y, m)
    return x.numpy(), y.numpy(), m.numpy()


def build_graph_engine(model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainConfig, *,
                       device: torch.device, block_size: int, world: int = 1,
                       batch_workers: int = -1) -> GraphEngine:
    """The engine of ``train.cuda_graphs: true`` (raises ValueError where it cannot run)."""
    check_graphable(world=world)
    return GraphEngine(model, optimizer, device=device, precision=cfg.precision,
                       grad_clip=cfg.grad_clip, grad_accum=cfg.grad_accum,
                       micro_batch=cfg.micro_batch(world), block_size=block_size, compile=cfg.compile,
                       batch_workers=batch_workers)


def engine_for(model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainConfig, *,
               device: torch.device, block_size: int, world: int = 1, ddp: bool = False,
               batch_workers: int = -1) -> Any:
    """The engine of a plain-torch training run: the graph step when ``cfg.cuda_graphs`` (with
    ``batch_workers`` batch-building processes), else ``TorchEngine`` (DDP-wrapped when ``ddp``)."""
    if cfg.cuda_graphs:
        return build_graph_engine(model, optimizer, cfg, device=device, block_size=block_size, world=world,
                                  batch_workers=batch_workers)
    return TorchEngine(model, optimizer, device=device, precision=cfg.precision, grad_clip=cfg.grad_clip,
                       grad_accum=cfg.grad_accum, compile=cfg.compile, ddp=ddp)

