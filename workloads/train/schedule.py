"""Learning-rate schedules as data: a frozen dataclass with ``lookup(step) -> lr``.

DESIGN §7 example 10 (anchor: KellerJordan/modded-nanogpt ``TrainingSchedule.lookup``): a schedule
is a value, not a stateful scheduler object, so resuming needs only the step number and a checkpoint
never has to carry a scheduler state dict.

Two shapes (EXPERIMENTS §1, §2.4, §3.1-3.2):

- ``"cosine"``: linear warm-up to ``lr`` over ``warmup`` steps, cosine decay to ``min_lr`` at
  ``decay_steps``, then ``min_lr`` (nanoGPT's ``get_lr``; the PoPE and TAPA pretraining recipes).
- ``"constant"``: the same warm-up, then ``lr`` for ever (the YaRN / PoPE+ft fine-tune recipe:
  "constant after warm-up (no decay)").

Worked example (lr 1e-3, min_lr 1e-4, warmup 10, decay_steps 110)::

    step 0 -> 1e-4 (1/10 of peak), step 9 -> 1e-3, step 10 -> 1e-3,
    step 60 -> 5.5e-4 (half-way down the cosine), step 110 -> 1e-4, step 500 -> 1e-4
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """Warm-up + cosine (or constant) learning-rate schedule.

    Args:
        lr: peak learning rate (> 0).
        min_lr: floor reached at ``decay_steps`` (0 <= min_lr <= lr). Ignored by ``"constant"``.
        warmup: warm-up steps (>= 0). Step ``s < warmup`` gets ``lr * (s + 1) / warmup``, so the
            first step never uses lr 0 and step ``warmup - 1`` reaches the peak.
        decay_steps: step at which the cosine reaches ``min_lr`` (>= warmup).
        kind: ``"cosine"`` or ``"constant"``.
    """

    lr: float
    min_lr: float = 0.0
    warmup: int = 0
    decay_steps: int = 0
    kind: Literal["cosine", "constant"] = "cosine"

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"schedule lr must be > 0, got {self.lr!r}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"schedule min_lr must be in [0, lr={self.lr}], got {self.min_lr!r}")
        if self.warmup < 0:
            raise ValueError(f"schedule warmup must be >= 0, got {self.warmup!r}")
        if self.kind not in ("cosine", "constant"):
            raise ValueError(f"schedule kind must be 'cosine' or 'constant', got {self.kind!r}")
        if self.kind == "cosine" and self.decay_steps < self.warmup:
            raise ValueError(
                f"schedule decay_steps={self.decay_steps!r} must be >= warmup={self.warmup!r}")

    def lookup(self, step: int) -> float:
        """Learning rate for optimiser step ``step`` (0-based)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step!r}")
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        if self.kind == "constant":
            return self.lr
        if step >= self.decay_steps:
            return self.min_lr
        ratio = (step - self.warmup) / (self.decay_steps - self.warmup)
        coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))  # 1 -> 0
        return self.min_lr + coeff * (self.lr - self.min_lr)
