"""How the fused attention kernels run: `AttentionOptions`, passed explicitly from the model's
config (`model.attention`) through the backend to each launch, and what each call ran with.

Torch-free (the model config imports the literal types; the orchestrator hashes configs without
torch). Every field changes what runs, so a stage records it in its config, its cache key and its
provenance (`options_used`):

- pope_impl: which PoPE implementation (kernels/pope/function.py): "fused" (pope/triton_pope.py),
  "expand" (triton_expand.py + the flash core), "cudnn" (cudnn.py: not deterministic), or "auto"
  ("cudnn" where it runs, else "expand"; kernels/attention/README.md has the measurements).
- tapa_series: TAPA's forward uses the binomial series for |m - n|^alpha on tiles away from the
  diagonal (kernels/tapa/phase.py: 3-8 % faster forward on the H200); False takes lg2/ex2 everywhere.
- exp2: how the PoPE and TAPA score tiles' softmax exponentials run (triton_common._exp2_tile):
  "mufu" (the special-function unit), "poly" (a polynomial on the FMA pipe), "split" (half each).
- autotune: time every Triton config at each new shape (seconds per kernel and shape, results
  kept in Triton's cache) instead of the measured tile (triton_common.TUNE_DEFAULTS).
- flash_impl: the attention core the plain flash and the TAPA kernels run on: "tl" (Triton's
  portable language: flash/triton_flash.py, tapa/triton_tapa.py), "gluon" (the Hopper kernels:
  flash/gluon_hopper.py, tapa/gluon_tapa.py and gluon_tapa_bwd.py; sm_90, bf16/fp16, D 64/128, index
  positions: an error elsewhere), or "auto" ("gluon" where it runs, else "tl"). After the Gluon
  forward the plain core's backward is the one `flash.gluon_hopper_bwd.BACKWARD_BY_D` names for the
  head dim (kernels/flash/function.py); TAPA's is Gluon (kernels/tapa/function.py).

Example:
    >>> opts = AttentionOptions(pope_impl="expand", autotune=True)
    >>> opts.exp2_code
    0
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Literal

PopeImpl = Literal["auto", "fused", "expand", "cudnn"]
Exp2Mode = Literal["mufu", "poly", "split"]
FlashImpl = Literal["auto", "tl", "gluon"]
POPE_IMPL_CHOICES: tuple[str, ...] = typing.get_args(PopeImpl)
EXP2_CHOICES: tuple[str, ...] = typing.get_args(Exp2Mode)
FLASH_IMPL_CHOICES: tuple[str, ...] = typing.get_args(FlashImpl)


@dataclass(frozen=True, kw_only=True, slots=True)
class AttentionOptions:
    """The kernel-side choices of one attention layer (module docstring); hashable, so a layer's
    `AttnCall` checks stay cheap."""

    pope_impl: PopeImpl = "auto"
    tapa_series: bool = True
    exp2: Exp2Mode = "mufu"
    autotune: bool = False
    flash_impl: FlashImpl = "auto"

    def __post_init__(self) -> None:
        if self.pope_impl not in POPE_IMPL_CHOICES:
            raise ValueError(f"pope_impl={self.pope_impl!r}: expected one of {list(POPE_IMPL_CHOICES)}")
        if self.flash_impl not in FLASH_IMPL_CHOICES:
            raise ValueError(f"flash_impl={self.flash_impl!r}: expected one of {list(FLASH_IMPL_CHOICES)}")
        if self.exp2 not in EXP2_CHOICES:
            raise ValueError(f"exp2={self.exp2!r}: expected one of {list(EXP2_CHOICES)}")
        for name in ("tapa_series", "autotune"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}={getattr(self, name)!r} must be a bool")

    @property
    def exp2_code(self) -> int:
        """The kernels' EXP2 constexpr (triton_common._exp2_tile's MODE)."""
        return EXP2_CHOICES.index(self.exp2)


DEFAULT_OPTIONS = AttentionOptions()

# op -> the options each call of it ran with, as recorded by each op's function.py (provenance of a run)
_USED: dict[str, dict[str, Any]] = {}


def record_options(op: str, **values: Any) -> None:
    """Record the option values a call of ``op`` ("pope", "tapa", "flash") ran with: only those
    that apply to the implementation it took (cuDNN's core is not autotuned, say)."""
    _USED.setdefault(op, {}).update(values)


def options_used() -> dict[str, dict[str, Any]]:
    """A copy of op -> {option: value} recorded since `reset_options`."""
    return {op: dict(v) for op, v in sorted(_USED.items())}


def reset_options() -> None:
    _USED.clear()
