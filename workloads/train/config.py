"""The training settings a stage's ``train`` section converts to: :class:`TrainConfig` (CONTRACTS
§3.4), the optimiser's :class:`OptimConfig` it inherits, and the validation metrics a run keeps
best weights for (:data:`BEST_CRITERIA`). Without torch, so that planning a grid
(``orchestrator/stages/base.normalize_train``, ``evals.api.SelectConfig``) validates its sections
without importing it; ``loop.py``, ``optim.py`` and ``checkpoint.py`` run them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from phaselab.workloads.train.schedule import Schedule

# What the loop's periodic validation reports (loop.evaluate), each in its natural direction: the
# criteria a run keeps best weights for (checkpoint.BestKeeper) and an evaluation may select by
# (evals.api.SelectConfig)
BEST_CRITERIA: Mapping[str, str] = {"valid/loss": "min", "valid/acc": "max"}


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimConfig:
    """AdamW settings. ``TrainConfig`` inherits these fields (a train section stays flat:
    ``train.lr``, ``train.beta2``) and returns them as this config from ``TrainConfig.optim``."""

    lr: float = 6e-4
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.01
    delta_lr_mult: float = 1.0
    delta_weight_decay: bool = False
    decay_embeddings: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.beta1 < 1.0 or not 0.0 <= self.beta2 < 1.0:
            raise ValueError(f"betas must be in [0, 1), got ({self.beta1!r}, {self.beta2!r})")
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0, got {self.eps!r}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if not self.delta_lr_mult > 0:
            raise ValueError(f"delta_lr_mult must be > 0, got {self.delta_lr_mult!r}")


@dataclass(frozen=True, kw_only=True)
class TrainConfig(OptimConfig):
    """Training settings (CONTRACTS §3.4; defaults: EXPERIMENTS §1).

    The optimiser's settings (``lr``, ``beta1``, ``beta2``, ``eps``, ``weight_decay``,
    ``delta_lr_mult``, ``delta_weight_decay``, ``decay_embeddings``) are declared once, in
    :class:`OptimConfig`, and inherited here, so a train section
    stays flat (``train.lr``, ``train.beta2``) as users write it and as every cache key hashes it;
    :attr:`optim` is the nested OptimConfig the optimiser is built from.

    ``batch_size`` is the global number of sequences per optimiser step; each of ``world`` ranks
    runs ``grad_accum`` micro-batches of ``batch_size // (grad_accum * world)`` sequences.
    ``decay_steps`` None means ``steps``. ``eval_every``/``ckpt_every`` 0 disable the periodic
    event (the last step always evaluates and checkpoints). ``eval_batches`` 0 means the whole
    split; ``final_eval_batches`` is the same for the end-of-run evaluation on
    ``final_eval_splits`` (empty = every split of the dataset but "train"). ``precision`` "auto"
    is bf16 autocast on CUDA, fp32 on CPU. ``cuda_graphs`` runs each optimiser step as one
    replayed CUDA graph (``fast_step.py``: small models at GPU speed; one process per stage).
    """

    steps: int = 1000
    batch_size: int = 64
    grad_accum: int = 1
    min_lr: float = 6e-5
    warmup: int = 100
    decay_steps: int | None = None
    schedule: Literal["cosine", "constant"] = "cosine"
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 20
    eval_batch_size: int | None = None
    final_eval_batches: int = 0
    final_eval_splits: tuple[str, ...] = ()
    ckpt_every: int = 500
    keep_checkpoints: int = 2
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    compile: bool = False
    cuda_graphs: bool = False
    seed: int = 0
    log_every: int = 10
    device: str = "auto"
    zero_stage: int | None = None

    def __post_init__(self) -> None:
        OptimConfig.__post_init__(self)
        for name in ("steps", "batch_size", "grad_accum", "log_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("eval_every", "eval_batches", "final_eval_batches", "ckpt_every", "warmup"):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.grad_clip < 0:
            raise ValueError(f"train.grad_clip must be >= 0 (0 = no clipping), got {self.grad_clip!r}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"train.precision must be auto|fp32|bf16, got {self.precision!r}")
        if self.zero_stage is not None and self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"train.zero_stage must be None or 0-3, got {self.zero_stage!r}")
        if self.cuda_graphs and self.zero_stage is not None:
            raise ValueError(f"train.cuda_graphs does not run under DeepSpeed (train.zero_stage="
                             f"{self.zero_stage}): set one of them")
        self.schedule_obj()  # validates lr/min_lr/warmup/decay_steps

    def schedule_obj(self) -> Schedule:
        decay = self.steps if self.decay_steps is None else self.decay_steps
        return Schedule(lr=self.lr, min_lr=self.min_lr, warmup=self.warmup,
                        decay_steps=max(decay, self.warmup), kind=self.schedule)

    @property
    def optim(self) -> OptimConfig:
        """The optimiser's settings as their own config (``optim.build_optimizer`` takes it)."""
        return OptimConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(OptimConfig)})

    def micro_batch(self, world: int) -> int:
        per = self.grad_accum * world
        if self.batch_size % per:
            raise ValueError(f"train.batch_size={self.batch_size} is not divisible by "
                             f"grad_accum * world = {self.grad_accum} * {world}")
        return self.batch_size // per
