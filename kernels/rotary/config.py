"""`RopeConfig`: RoPE and its context-extension rule, the one config of the rotary component.

Torch-free, so configs that hold it (the model's `pe.rope`) are parsed and hashed without
loading torch. The model supplies head_dim (`rotary_dim(head_dim)`); the frequency rules that
read the config live in `scaling.py` (torchtitan models/common/rope.py: one config per component).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

SCALINGS = ("none", "pi", "ntk", "dynamic_ntk", "yarn")
RAMPS = ("index", "rotations")
Scaling = Literal["none", "pi", "ntk", "dynamic_ntk", "yarn"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RopeConfig:
    """RoPE and its context-extension rule; validated once here and never recomputed (MATH §7.10).

    pairing: MATH §1.3, EXPERIMENTS §6 #15. rotary_fraction 0.5 is the "RoPE half-channels"
    baseline (MATH §1.4). factor is s >= 1; original_max_seq_len is the *pretraining* length L,
    required whenever scaling != "none" (MATH §2.4). attention_factor (YaRN only) overrides
    mscale = 0.1 ln s + 1 and is never replaced by the default.
    """

    base: float = 10_000.0
    pairing: Literal["interleaved", "half"] = "interleaved"
    rotary_fraction: float = 1.0
    scaling: Scaling = "none"
    factor: float = 1.0
    original_max_seq_len: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    ramp: Literal["index", "rotations"] = "index"
    truncate: bool = True
    attention_factor: float | None = None

    def __post_init__(self) -> None:
        check_base(self.base)
        if self.pairing not in ("interleaved", "half"):
            raise ValueError(f"pairing={self.pairing!r}: expected 'interleaved' or 'half'")
        if not 0.0 < self.rotary_fraction <= 1.0:
            raise ValueError(f"rotary_fraction={self.rotary_fraction} must be in (0, 1]")
        if self.scaling not in SCALINGS:
            raise ValueError(f"scaling={self.scaling!r}: expected one of {SCALINGS}")
        if self.ramp not in RAMPS:
            raise ValueError(f"ramp={self.ramp!r}: expected one of {RAMPS}")
        if not isinstance(self.truncate, bool):
            raise TypeError(f"truncate={self.truncate!r} must be a bool")
        check_factor(self.factor)
        if self.scaling == "none":
            if self.factor != 1.0:
                raise ValueError(f"factor={self.factor} has no effect with scaling='none'; set a "
                                 f"scaling rule or factor=1")
        elif self.original_max_seq_len is None:
            raise ValueError(f"scaling={self.scaling!r} needs original_max_seq_len (the pretraining "
                             f"context L, MATH §2.4)")
        if self.original_max_seq_len is not None:
            check_length("original_max_seq_len", self.original_max_seq_len)
        if not 0.0 < self.beta_slow < self.beta_fast:
            raise ValueError(f"beta_slow={self.beta_slow} and beta_fast={self.beta_fast} must satisfy "
                             f"0 < beta_slow < beta_fast")
        if self.attention_factor is not None:
            if self.scaling != "yarn":
                raise ValueError(f"attention_factor={self.attention_factor} is only defined for "
                                 f"scaling='yarn', got scaling={self.scaling!r}")
            if not (math.isfinite(self.attention_factor) and self.attention_factor > 0):
                raise ValueError(f"attention_factor={self.attention_factor} must be finite and > 0")

    def rotary_dim(self, head_dim: int) -> int:
        """R = rotary_fraction * head_dim, the number of rotated features (an even int >= 2)."""
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
            raise ValueError(f"head_dim={head_dim!r} must be a positive int")
        rotary_dim = self.rotary_fraction * head_dim
        if rotary_dim != int(rotary_dim) or int(rotary_dim) % 2 or int(rotary_dim) < 2:
            raise ValueError(f"rotary_fraction={self.rotary_fraction} * head_dim={head_dim} = "
                             f"{rotary_dim} must be an even integer >= 2 (MATH §1.4)")
        return int(rotary_dim)


def check_base(base: float) -> None:
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not (math.isfinite(base) and base > 1):
        raise ValueError(f"base={base!r} must be a finite number > 1")


def check_factor(factor: float) -> None:
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor):
        raise ValueError(f"factor={factor!r} must be a finite number")
    if factor < 1.0:
        raise ValueError(f"factor={factor} must be >= 1 (MATH §2)")


def check_length(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive int")
